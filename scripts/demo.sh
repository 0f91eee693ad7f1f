#!/usr/bin/env bash
# The main job: set up, build, and run the project's own model (models/longctx-2l.gguf, compiled
# into the binary as its default; docs/model.md). Trained on windows of at most 1,024 tokens,
# it finds needles in essay haystacks of 16K and 32K tokens it never saw (evaluation seeds are
# disjoint from training's), with its default long-context method: every key more than 64
# positions back attended at the trained distance of 64 (attention `fixed`), logits scaled by
# log n (`logn`). Each line gives the expected number and the model's greedy answer; the first
# run also prints its speed, memory and method. Then its reader version (models/longctx-2l-
# reader.gguf, the default of `read`) finds a needle in a 1M-token essay through sculptor and
# memagent (docs/readers.md), and stories260K tells a story.
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
# Reading agents (docs/readers.md): the same model trained on the readers' protocols (compiled
# in as the default of `read`) finds a needle in a 1M-token essay, by searching it (sculptor,
# under a second) and by reading all of it through a bounded memory (memagent, about 40 s).
echo
: > build/book.txt
while [ "$(stat -c %s build/book.txt)" -lt 3600000 ]; do cat data/haystack/opticks.txt >> build/book.txt; done
{ head -c 1800000 build/book.txt; printf ' One of the special magic numbers for quiet-harbor is: 6150472. ';
  head -c 3600000 build/book.txt | tail -c +1800001; } > build/book1m.txt
q="What is the special magic number for quiet-harbor mentioned in the provided text?"
for reader in sculptor memagent; do
  echo "longctx read -f build/book1m.txt -q \"$q\" --reader $reader (expected 6150472)"
  ./build/longctx read -f build/book1m.txt -q "$q" --reader "$reader"
  echo
done
./build/longctx run -m models/stories260K.gguf -p "Once upon a time" -n 128 --temp 0
