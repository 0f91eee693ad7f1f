#!/usr/bin/env bash
# Scores the project's model (models/longctx-2l.gguf, scripts/make_model.sh) the way
# docs/model.md reports it. Parts, each its own bench run folder under $OUT:
#   lengths  accuracy by task, length and long-context method (RoPE scaling x backend)
#   press    accuracy against KV-press ratio at the training length, query-aware and -agnostic
#   qttt     query-only test-time training on and off, beyond the training length
#   PARTS="lengths press qttt" SAMPLES=8 THREADS=2 scripts/eval_model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-rel}
THREADS=${THREADS:-2}
SAMPLES=${SAMPLES:-8}
OUT=${OUT:-out/eval-model}
PARTS=${PARTS:-"lengths press qttt"}
M=${MODEL:-models/longctx-2l.gguf}
LC="./$BUILD/longctx"
TASKS=(--task niah_single_1 --task niah_single_2 --task niah_multikey_1 --task niah_multikey_2 --task passkey --task vt)
common=(-m "$M" "${TASKS[@]}" --samples "$SAMPLES" --max-new-tokens 48 -t "$THREADS" --no-plots)
mkdir -p "$OUT"

for part in $PARTS; do
  case $part in
  lengths)
    # Dense attention is quadratic: it runs up to 16K. The sparse backends and the RoPE
    # scalings run at every length given in LONG (default up to 64K).
    m=(--method "rope=gguf;attn=dense;name=dense"
       --method "rope=yarn:factor=4;attn=dense;name=yarn4"
       --method "rope=yarn:factor=16;attn=dense;name=yarn16"
       --method "rope=gguf;attn=infllm:sinks=4,local=512,topk=8,block=32;name=infllm"
       --method "rope=yarn:factor=4;attn=infllm:sinks=4,local=512,topk=8,block=32;name=yarn4+infllm"
       --method "rope=gguf;attn=quest:budget=512,page=16,dense_layers=0;name=quest"
       --method "rope=yarn:factor=4;attn=quest:budget=512,page=16,dense_layers=0;name=yarn4+quest"
       --method "rope=gguf;attn=streaming:sinks=4,window=512;name=streaming")
    "$LC" bench run "${common[@]}" -L "${SHORT:-1K,4K,16K}" -o "$OUT/lengths" "${m[@]}"
    ;;
  press)
    args=(--method "press=none;name=full")
    for p in ${PRESSES:-snapkv h2o tova knorm expected_attention streaming_llm pyramidkv adakv speckv specpc random}; do
      for r in ${RATIOS:-0.5 0.75 0.9}; do
        for q in aware agnostic; do args+=(--method "press=$p:ratio=$r,query=$q;name=$p-$r-$q"); done
      done
    done
    # speckv / specpc draft with stories260K: same 512-piece vocabulary, a different model.
    "$LC" bench run "${common[@]}" -L 1K --draft models/stories260K.gguf -o "$OUT/press" "${args[@]}"
    ;;
  qttt)
    "$LC" bench run "${common[@]}" -L 1K,2K -o "$OUT/qttt" --qttt none --qttt steps=8,lr=1e-3,span=128
    ;;
  *) echo "eval_model: unknown part '$part'" >&2; exit 1 ;;
  esac
done
