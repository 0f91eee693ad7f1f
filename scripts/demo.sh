#!/usr/bin/env bash
# The main job: set up, build, and generate with the model shipped in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_TESTS=OFF -DLONGCTX_BENCH=OFF >/dev/null
cmake --build build --target longctx -j"$(nproc)"
./build/longctx run -p "Once upon a time" -n 128 --temp 0 "$@"
