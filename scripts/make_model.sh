#!/usr/bin/env bash
# Trains the project's own long-context model from scratch on this machine (docs/model.md):
#   vocab    a 2,048-piece byte-level BPE trained on the curriculum's text (make-vocab,
#            deterministic), so that needle keys are three tokens, not seven to eleven letters;
#   stage 1  induction warm-up: windows of random pieces written three times, every token
#            scored, until the copying circuit (induction heads) forms. The random pieces come
#            from the 512 lowest-id pieces (--cur-alphabet 512); the other rows of the tied
#            embedding stay frozen meanwhile, since with all 2,048 the warm-up stalls;
#   stage 2  the retrieval curriculum (RULER needles, passkey, variable tracking, associative
#            recall, repeats, some text) at windows up to 1,024 tokens, from stage 1's weights;
#   stage 3  the same tasks weighted towards multi-key needles and variable tracking, trained
#            with a distance ceiling (--fixed-distance 64: keys more than 64 positions back are
#            attended as if 64 back, as LM-Infinite and InfLLM do at inference). The exported
#            model keeps it as its default attention (`fixed`), so it reads inputs far longer
#            than 1K at trained distances; --logn 1024 (the identity inside the 1K window)
#            makes `logn` logit scaling its default beyond it.
# Then copies the result to models/longctx-2l.gguf and scores it at its training length.
#   scripts/make_model.sh                 # THREADS=2 OUT=out/make-model-$VARIANT BUILD=build-rel
#
# VARIANT=rope trains the plain-RoPE evaluation model (models/longctx-2l-rope.gguf): the same
# vocabulary, stages and curriculum, but stage 3 without the distance ceiling and without the
# logn default, so the model depends on real RoPE distances like models trained elsewhere. It
# is the model on which RoPE scalings, sparse attention and presses are compared (docs/model.md).
# Each stage resumes from its checkpoint if the script is interrupted and run again.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-rel}
THREADS=${THREADS:-2}
VARIANT=${VARIANT:-ceiling}
case "$VARIANT" in
  ceiling) NAME=longctx-2l; STAGE3=(--fixed-distance 64 --logn 1024) ;;
  rope) NAME=longctx-2l-rope; STAGE3=() ;;
  *) echo "make_model: VARIANT must be ceiling or rope, not '$VARIANT'" >&2; exit 2 ;;
esac
OUT=${OUT:-out/make-model-$VARIANT}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target longctx -j"$(nproc)" >&2
mkdir -p "$OUT"
# The run uses its own copy of the binary, so that rebuilding meanwhile cannot change it.
cp "./$BUILD/longctx" "$OUT/longctx"
LC="./$OUT/longctx"
t0=$(date +%s)

if [ ! -f "$OUT/vocab.gguf" ]; then
  "$LC" make-vocab --curriculum default --from-vocab models/stories260K.gguf --samples 2000 \
    --seq-len 1024 --size 2048 -o "$OUT/vocab.gguf"
fi
SHAPE=(--vocab "$OUT/vocab.gguf" --n-layer 2 --n-embd 128 --n-head 4 -t "$THREADS")

resume() { [ -f "$1/checkpoint.bin" ] && echo --resume || true; }

if [ ! -f "$OUT/stage1.done" ]; then
  # shellcheck disable=SC2046
  "$LC" train "${SHAPE[@]}" --curriculum induction=1 --cur-alphabet 512 --cur-min-len 64 \
    --seq-len 64 --batch 32 --steps 5000 --lr 3e-3 --min-lr-ratio 1 --warmup 100 \
    --weight-decay 0 --init-std 0.088 \
    --checkpoint-dir "$OUT/ck1" --checkpoint-every 1000 $(resume "$OUT/ck1") -o "$OUT/stage1.gguf"
  touch "$OUT/stage1.done"
fi
if [ ! -f "$OUT/stage2.done" ]; then
  init=(--init-from "$OUT/stage1.gguf")
  [ -f "$OUT/ck2/checkpoint.bin" ] && init=(--resume)
  "$LC" train "${SHAPE[@]}" "${init[@]}" --seq-len 1024 --batch 8 --steps 5000 --lr 2e-3 --warmup 50 \
    --weight-decay 0 --cur-min-len 128 --cur-ramp 0.3 --cur-lm 0.5 \
    --curriculum niah_single_1=1,niah_single_2=1,niah_single_3=1,niah_multikey_1=2,niah_multikey_2=2,niah_multikey_3=1,passkey=0.5,vt=3,recall=1,repeat=0.5,text=0.25 \
    --checkpoint-dir "$OUT/ck2" --checkpoint-every 500 -o "$OUT/stage2.gguf"
  touch "$OUT/stage2.done"
fi
if [ ! -f "$OUT/stage3.done" ]; then
  init=(--init-from "$OUT/stage2.gguf")
  [ -f "$OUT/ck3/checkpoint.bin" ] && init=(--resume)
  "$LC" train "${SHAPE[@]}" "${init[@]}" "${STAGE3[@]}" --seq-len 1024 --batch 8 \
    --steps 5000 --lr 1e-3 --warmup 50 --weight-decay 0 --cur-min-len 256 --cur-ramp 0 --cur-lm 0.25 \
    --curriculum niah_single_1=0.5,niah_single_2=0.5,niah_multikey_1=4,niah_multikey_2=1,passkey=0.25,vt=3,recall=1,repeat=0.25,text=0.25 \
    --checkpoint-dir "$OUT/ck3" --checkpoint-every 1000 -o "$OUT/$NAME.gguf"
  touch "$OUT/stage3.done"
fi
echo "make_model: trained in $(( ($(date +%s) - t0) / 60 )) min (this invocation)" >&2
cp "$OUT/$NAME.gguf" "models/$NAME.gguf"
# Held-out accuracy at the training length (evaluation seeds never meet training's, docs/training.md).
"$LC" bench run -m "models/$NAME.gguf" --task ruler --task passkey -L 1K --samples 20 -t "$THREADS" \
  -o "$OUT/eval-1k" --no-plots
