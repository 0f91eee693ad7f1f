#!/usr/bin/env bash
# Trains the project's reader model, models/longctx-2l-reader.gguf (docs/model.md, "The reader
# model"): models/longctx-2l.gguf trained further on the readers' protocols (docs/readers.md),
# with the same distance ceiling and logit scaling, on windows of at most 1,024 tokens:
#   R1  2,500 steps at lr 1e-3: the protocol tasks (memory update and answer, a chunk's answer
#       or "none", Sculptor's search call and the answer from its result) beside the retrieval
#       tasks the model was trained on;
#   R2  5,000 steps at lr 1e-3 from R1, the protocol tasks weighted up;
#   R3  5,000 steps at lr 7e-4 from R2, weighted towards the memory update and the chunk answer;
#   R4  7,000 steps at lr 7e-4 from R3: the memory carried through a chunk without the needle
#       (mem_carry, where long reads decayed), memagent on variable tracking (vt_update,
#       vt_answer) and Smooth Reading's notes and answer (smooth_note, smooth_answer), beside
#       the R3 mix;
#   R5  3,000 steps at lr 5e-4 from R4, the R4 mix with half of the protocol tasks' number
#       values drawn from 2 to 4 distinct digits (--cur-hard-values 0.5): values such as 5055554,
#       which R4 copied with a digit changed.
# Then copies the result to models/longctx-2l-reader.gguf and scores it with every reader.
#   scripts/make_reader_model.sh          # THREADS=2 OUT=out/make-reader BUILD=build-rel
# Each stage resumes from its checkpoint if the script is interrupted and run again.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-rel}
THREADS=${THREADS:-2}
OUT=${OUT:-out/make-reader}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target longctx -j"$(nproc)" >&2
mkdir -p "$OUT"
# The run uses its own copy of the binary, so that rebuilding meanwhile cannot change it.
cp "./$BUILD/longctx" "$OUT/longctx"
LC="./$OUT/longctx"
t0=$(date +%s)
COMMON=(--vocab models/longctx-2l.gguf --n-layer 2 --n-embd 128 --n-head 4 -t "$THREADS"
        --fixed-distance 64 --logn 1024 --seq-len 1024 --batch 8 --warmup 50 --weight-decay 0
        --cur-min-len 256 --cur-ramp 0)
stage() {  # name init steps lr lm curriculum [more train flags]
  local name=$1 init=$2 steps=$3 lr=$4 lm=$5 mix=$6
  shift 6
  [ -f "$OUT/$name.done" ] && return 0
  local from=(--init-from "$init")
  [ -f "$OUT/ck-$name/checkpoint.bin" ] && from=(--resume)
  "$LC" train "${COMMON[@]}" "${from[@]}" --steps "$steps" --lr "$lr" --cur-lm "$lm" --curriculum "$mix" "$@" \
    --checkpoint-dir "$OUT/ck-$name" --checkpoint-every 500 -o "$OUT/$name.gguf"
  touch "$OUT/$name.done"
}
stage r1 models/longctx-2l.gguf 2500 1e-3 0.1 \
  mem_update=4,mem_answer=1.5,map_answer=2,sculptor_search=1,sculptor_answer=1.5,niah_single_1=0.5,niah_single_2=0.5,niah_multikey_1=2,niah_multikey_2=0.5,passkey=0.25,vt=1.5,recall=0.5,repeat=0.25,text=0.25
stage r2 "$OUT/r1.gguf" 5000 1e-3 0.05 \
  mem_update=4,mem_answer=1,map_answer=2.5,sculptor_search=1.5,sculptor_answer=1.5,niah_single_1=0.3,niah_single_2=0.3,niah_multikey_1=1,passkey=0.2,vt=0.5,recall=0.3,text=0.2
stage r3 "$OUT/r2.gguf" 5000 7e-4 0.05 \
  mem_update=5,mem_answer=1,map_answer=4,sculptor_search=0.5,sculptor_answer=0.5,niah_single_1=0.2,niah_multikey_1=0.5,passkey=0.1,vt=0.3,text=0.1
stage r4 "$OUT/r3.gguf" 7000 7e-4 0.05 \
  mem_update=4,mem_carry=3,mem_answer=1,vt_update=4,vt_answer=1.5,map_answer=2,smooth_note=3,smooth_answer=1,sculptor_search=0.5,sculptor_answer=0.5,niah_single_1=0.2,niah_multikey_1=0.5,passkey=0.1,vt=0.3,text=0.1
R5MIX=mem_update=4,mem_carry=3,mem_answer=1,vt_update=4,vt_answer=1.5,map_answer=2,smooth_note=3,smooth_answer=1,sculptor_search=0.5,sculptor_answer=0.5,niah_single_1=0.2,niah_multikey_1=0.5,passkey=0.1,vt=0.3,text=0.1
stage r5 "$OUT/r4.gguf" 3000 5e-4 0.05 "$R5MIX" --cur-hard-values 0.5
# CANDIDATE=1: the variable-tracking candidates after R5 (docs/model.md, "Variable tracking: the
# decision to go on"), trained and scored but not shipped: R6b (vt_decide, vt_open), R6c
# (vt_first), R6d (vt_first weighted up: the first that goes on after the chain's first
# statement), R6e (vt_decide weighted up again: fewer invented lines), R6f (the needle memory
# tasks weighted up: some of the needle reads at 128K back).
if [ "${CANDIDATE:-0}" = 1 ]; then
  # (The mixes list the tasks in the order the runs of 2026-12-08 used: the order sets the draws.
  # Those runs used 1 thread for R6b, R6c and R6f, 2 for R6d and R6e.)
  v() { echo "mem_update=4,mem_carry=3,mem_answer=1,vt_update=4,$1,vt_answer=1.5,map_answer=2,smooth_note=3,smooth_answer=1,sculptor_search=0.5,sculptor_answer=0.5,niah_single_1=0.2,niah_multikey_1=0.5,passkey=0.1,vt=0.3,text=0.1"; }
  stage r6b "$OUT/r5.gguf" 3000 5e-4 0.05 "$(v vt_decide=4,vt_open=2)" --cur-hard-values 0.5
  stage r6c "$OUT/r6b.gguf" 2000 3e-4 0.05 "$(v vt_decide=4,vt_first=4,vt_open=2)" --cur-hard-values 0.5
  stage r6d "$OUT/r6c.gguf" 2500 5e-4 0.05 "$(v vt_decide=4,vt_first=8,vt_open=2)" --cur-hard-values 0.5
  stage r6e "$OUT/r6d.gguf" 2000 3e-4 0.05 "$(v vt_decide=8,vt_first=4,vt_open=2)" --cur-hard-values 0.5
  stage r6f "$OUT/r6e.gguf" 2000 3e-4 0.05 "$(v vt_decide=8,vt_first=4,vt_open=2 | sed 's/mem_update=4,mem_carry=3/mem_update=6,mem_carry=6/')" \
    --cur-hard-values 0.5
  "$LC" bench run -m "$OUT/r6f.gguf" --task vt -L 4K 16K 128K --samples 10 --reader memagent:window=4096 \
    -t "$THREADS" --out-dir "$OUT/eval-r6f" --no-plots
  exit 0
fi
echo "make_reader_model: trained in $(( ($(date +%s) - t0) / 60 )) min (this invocation)" >&2
cp "$OUT/r5.gguf" models/longctx-2l-reader.gguf
"$LC" bench run -m models/longctx-2l-reader.gguf --task niah_single_1 niah_single_2 niah_multikey_1 passkey \
  -L 4K --samples 20 --reader memagent --reader mapreduce --reader smooth --reader sculptor -t "$THREADS" \
  --out-dir "$OUT/eval-4k" --no-plots
