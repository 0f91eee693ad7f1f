#!/usr/bin/env bash
# Scores the project's model (models/longctx-2l.gguf, scripts/make_model.sh) the way
# docs/model.md reports it. Parts, each its own bench run folder under $OUT:
#   lengths  accuracy by task, length and long-context method (RoPE scaling x backend)
#   variants the other RoPE scalings and sparse backends, on three tasks
#   press    accuracy against KV-press ratio at the training length, query-aware and -agnostic
#   qttt     query-only test-time training on and off, at and beyond the training length
#   rope     on the plain-RoPE model (MODEL=models/longctx-2l-rope.gguf): every RoPE scaling,
#            with and without logn, at factor = L / 1K for each length in ROPE_LENGTHS
#   PARTS="lengths variants press qttt" SAMPLES=8 THREADS=2 scripts/eval_model.sh
#   PARTS=rope MODEL=models/longctx-2l-rope.gguf ROPE_LENGTHS="2K 4K 8K 16K" scripts/eval_model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-rel}
THREADS=${THREADS:-2}
SAMPLES=${SAMPLES:-8}
OUT=${OUT:-out/eval-model}
PARTS=${PARTS:-"lengths variants press qttt"}
M=${MODEL:-models/longctx-2l.gguf}
LC="./$BUILD/longctx"
TASKS=(--task niah_single_1 --task niah_single_2 --task niah_multikey_1 --task niah_multikey_2 --task passkey --task vt)
common=(-m "$M" "${TASKS[@]}" --samples "$SAMPLES" --max-new-tokens 48 -t "$THREADS" --no-plots)
mkdir -p "$OUT"

for part in $PARTS; do
  case $part in
  lengths)
    # The model's default (`fixed:distance=64` with `logn:orig=1024`, from its GGUF) against
    # plain RoPE with dense attention (what llama.cpp runs), each part alone, YaRN, and the
    # sparse backends. `rope=none` is the plain rope without the model's logn.
    m=(--method "name=default"
       --method "rope=none;attn=fixed;name=fixed"
       --method "rope=none;attn=dense;name=dense"
       --method "rope=logn;attn=dense;name=dense+logn"
       --method "rope=yarn:factor=4;attn=dense;name=yarn4"
       --method "rope=logn;attn=infllm:sinks=0,local=64,block=32,reps=32,topk=16,chunk=32;name=infllm"
       --method "rope=logn;attn=quest:budget=512,page=16,dense_layers=0;name=quest"
       --method "rope=none;attn=streaming:sinks=4,window=512;name=streaming")
    "$LC" bench run "${common[@]}" -L "${SHORT:-1K,4K,16K}" -o "$OUT/lengths" "${m[@]}"
    # Beyond 16K: the default (quadratic prefill) to 64K, InfLLM (retrieval at the trained
    # fixed distance) to 1M, on the single needle and the pass key.
    long=(-m "$M" --task niah_single_2 --task passkey --samples "${LONG_SAMPLES:-2}" --max-new-tokens 48 -t "$THREADS" --no-plots)
    "$LC" bench run "${long[@]}" -L 64K -o "$OUT/long64k" --method "name=default" \
      --method "rope=logn;attn=infllm:sinks=0,local=64,block=32,reps=32,topk=16,chunk=32;name=infllm"
    "$LC" bench run "${long[@]}" -L "${LONGEST:-256K,1M}" -o "$OUT/longest" \
      --method "rope=logn;attn=infllm:sinks=0,local=64,block=32,reps=32,topk=16,chunk=32;name=infllm"
    ;;
  rope)
    # The RoPE scalings at the factor that maps each length onto the 1K window, with dense
    # attention, each with and without logn (logn:orig=1024), plus plain RoPE.
    for L in ${ROPE_LENGTHS:-2K 4K}; do
      f=$(( ${L%K} ))  # K tokens / 1K
      m=(--method "rope=none;attn=dense;name=plain" --method "rope=logn:orig=1024;attn=dense;name=plain+logn")
      for r in linear ntk dynamic-ntk yarn llama3 mrrope-uni mrrope-pro; do
        spec="$r:factor=$f"
        case $r in linear|ntk) ;; *) spec="$spec,orig=1024" ;; esac
        m+=(--method "rope=$spec;attn=dense;name=$r" --method "rope=$spec+logn:orig=1024;attn=dense;name=$r+logn")
      done
      "$LC" bench run -m "$M" --task niah_single_2 --task niah_multikey_1 --task passkey --task vt --samples "$SAMPLES" \
        --max-new-tokens 48 -t "$THREADS" --no-plots -L "$L" -o "$OUT/rope-$L" "${m[@]}"
    done
    ;;
  variants)
    # The other RoPE scalings, with dense attention (a reader without the model's ceiling
    # choosing a scaling instead), and the two sparse backends not in `lengths`, on three tasks.
    v=(--method "rope=linear:factor=4;attn=dense;name=linear4"
       --method "rope=ntk:factor=4;attn=dense;name=ntk4"
       --method "rope=dynamic-ntk:factor=4;attn=dense;name=dynamic-ntk4"
       --method "rope=llama3:factor=4;attn=dense;name=llama3-4"
       --method "rope=yarn:factor=16;attn=dense;name=yarn16"
       --method "rope=mrrope-uni:factor=4;attn=dense;name=mrrope-uni4"
       --method "rope=mrrope-pro:factor=4;attn=dense;name=mrrope-pro4"
       --method "rope=logn;attn=dssa:switch=1024,block=32,kernel=16,stride=8,topk=16,sinks=4,local=64;name=dssa"
       --method "rope=logn;attn=lychee:budget=512,block=32,sinks=4,local=64,retrieval=1;name=lychee")
    "$LC" bench run -m "$M" --task niah_single_2 --task niah_multikey_1 --task passkey --samples "$SAMPLES" \
      --max-new-tokens 48 -t "$THREADS" --no-plots -L "${SHORT:-1K,4K,16K}" -o "$OUT/variants" "${v[@]}"
    ;;
  press)
    # Dense attention: the presses that observe attention need it (the model's default `fixed`
    # is not that).
    args=(--method "attn=dense;press=none;name=full")
    for p in ${PRESSES:-snapkv h2o tova knorm expected_attention streaming_llm pyramidkv adakv speckv specpc random}; do
      for r in ${RATIOS:-0.5 0.75 0.9}; do
        for q in aware agnostic; do args+=(--method "attn=dense;press=$p:ratio=$r,query=$q;name=$p-$r-$q"); done
      done
    done
    # speckv / specpc draft with a model of the same vocabulary: by default stage 2 of
    # scripts/make_model.sh (the shipped model before its last stage).
    "$LC" bench run "${common[@]}" -L 1K --draft "${DRAFT:-out/make-model/stage2.gguf}" -o "$OUT/press" "${args[@]}"
    ;;
  qttt)
    # With the model's default attention (the distance ceiling, whose gradient qTTT follows)
    # at and beyond the training length.
    "$LC" bench run "${common[@]}" -L "${QTTT_LENGTHS:-1K,4K,16K}" -o "$OUT/qttt" --qttt none \
      --qttt steps=8,lr=1e-3,span=128
    ;;
  *) echo "eval_model: unknown part '$part'" >&2; exit 1 ;;
  esac
done
