#!/usr/bin/env bash
# The readers' table of docs/readers.md: every reader on the reader model, beside the base model's
# attention methods, by task and length, with the accuracy plot.
#   - READERS (memagent mapreduce smooth sculptor) on models/longctx-2l-reader.gguf and InfLLM in
#     the base model's regime on models/longctx-2l.gguf, at LENGTHS (default 4K,16K,64K,128K);
#   - the base model's own attention (fixed distance 64, a quadratic prefill) at SHORT (default
#     4K,16K; 64K costs about two minutes a sample);
#   - TASKS (default niah_single_1 niah_single_2 niah_multikey_1 passkey vt), SAMPLES per cell
#     (default 3), THREADS (default 1), OUT (default out/readers-grid); a re-run resumes.
# Then prints the tables (scripts/readers_table.py) and writes $OUT/accuracy_vs_length.svg.
# EXTRA: more `bench run` folders to put in the tables (e.g. the 1M runs).
#   scripts/readers_grid.sh            # BUILD=build
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target longctx -j"$(nproc)" >&2
LC="./$BUILD/longctx"
OUT=${OUT:-out/readers-grid}
READER=models/longctx-2l-reader.gguf BASE=models/longctx-2l.gguf
TASKS=${TASKS:-niah_single_1 niah_single_2 niah_multikey_1 passkey vt}
SAMPLES=${SAMPLES:-3}
THREADS=${THREADS:-1}
methods=()
for r in ${READERS:-memagent mapreduce smooth sculptor}; do
  methods+=(--method "reader=$r;model=$READER;name=$r")
done
methods+=(--method "rope=logn;attn=infllm:sinks=0,local=64,block=32,reps=32,topk=16,chunk=32;model=$BASE;name=infllm")
# shellcheck disable=SC2086
"$LC" bench run --task $TASKS -L "${LENGTHS:-4K,16K,64K,128K}" --samples "$SAMPLES" -t "$THREADS" \
  "${methods[@]}" --out-dir "$OUT/grid" --no-plots
# shellcheck disable=SC2086
"$LC" bench run --task $TASKS -L "${SHORT:-4K,16K}" --samples "$SAMPLES" -t "$THREADS" \
  --method "model=$BASE;name=default attention" --out-dir "$OUT/default" --no-plots
# shellcheck disable=SC2086
scripts/readers_table.py --svg "$OUT/accuracy_vs_length.svg" "$OUT/grid" "$OUT/default" ${EXTRA:-}
