#!/usr/bin/env bash
# The main job: set up, build, and run the project's own model (models/longctx-2l.gguf, compiled
# into the binary as its default; docs/model.md). Trained on windows of at most 1,024 tokens,
# it finds needles in essay haystacks of 16K and 32K tokens it never saw (evaluation seeds are
# disjoint from training's), with its default long-context method: every key more than 64
# positions back attended at the trained distance of 64 (attention `fixed`), logits scaled by
# log n (`logn`). Each line gives the expected number and the model's greedy answer; the first
# run also prints its speed, memory and method. Then a story from stories260K.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_TESTS=OFF -DLONGCTX_BENCH=OFF >/dev/null
cmake --build build --target longctx -j"$(nproc)"
first=1
for len in 16K 32K; do
  for seed in 1 2 3; do
    prompt=$(./build/longctx bench tasks --task niah_single_2 -L "$len" --seed "$seed" --show)
    printf '%s' "$(tail -n +2 <<< "$prompt")" > build/needle.txt
    expected=$(sed -n '1s/.*answers: \[\(.*\)\]/\1/p' <<< "$prompt")
    if [ "$first" = 1 ]; then
      echo "${prompt%%$'\n'*}"
      ./build/longctx run -f build/needle.txt -c 33000 -n 9 --temp 0 "$@"
      first=0
      echo
    else
      answer=$(./build/longctx run -f build/needle.txt -c 33000 -n 9 --temp 0 "$@" 2>/dev/null | head -n 1)
      echo "needle in $len tokens (seed $seed): expected $expected, the model says:$answer"
    fi
  done
done
echo
./build/longctx run -m models/stories260K.gguf -p "Once upon a time" -n 128 --temp 0
