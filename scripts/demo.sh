#!/usr/bin/env bash
# The main job: set up, build, and generate with the model shipped in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_TESTS=OFF -DLONGCTX_BENCH=OFF >/dev/null
cmake --build build --target longctx -j"$(nproc)"
./build/longctx run -p "Once upon a time" -n 128 --temp 0 "$@"
# The project's own model (docs/model.md) finds a needle in a 1K-token haystack it never saw
# (evaluation seeds are disjoint from training's); the expected answer is printed first.
prompt=$(./build/longctx bench tasks -m models/longctx-2l.gguf --task niah_single_2 -L 1K --seed 7 --show)
echo; echo "${prompt%%$'\n'*}"
printf '%s' "$(tail -n +2 <<< "$prompt")" > build/needle.txt
./build/longctx run -m models/longctx-2l.gguf -f build/needle.txt -n 9 --temp 0
