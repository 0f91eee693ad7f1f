#!/usr/bin/env bash
# The main job: set up, build, and run the project's own model (models/longctx-2l.gguf, compiled
# into the binary as its default; docs/model.md). Trained on windows of at most 1,024 tokens,
# it finds a needle in a 32K-token haystack it never saw (evaluation seeds are disjoint from
# training's) with its default long-context method: every key more than 64 positions back is
# attended at the trained distance of 64 (attention `fixed`) and logits are scaled by log n
# (`logn`). The expected answer is printed first. Then a story from stories260K.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_TESTS=OFF -DLONGCTX_BENCH=OFF >/dev/null
cmake --build build --target longctx -j"$(nproc)"
prompt=$(./build/longctx bench tasks --task niah_single_2 -L 32K --seed 7 --show)
echo "${prompt%%$'\n'*}"
printf '%s' "$(tail -n +2 <<< "$prompt")" > build/needle.txt
./build/longctx run -f build/needle.txt -c 33000 -n 9 --temp 0 "$@"
echo
./build/longctx run -m models/stories260K.gguf -p "Once upon a time" -n 128 --temp 0
