#!/usr/bin/env bash
# Scores the project's model (models/longctx-2l.gguf, scripts/make_model.sh) the way
# docs/model.md reports it. Parts, each its own bench run folder under $OUT:
#   lengths  accuracy by task, length and long-context method (RoPE scaling x backend)
#   variants the other RoPE scalings and sparse backends, on three tasks
#   press    accuracy against KV-press ratio (RATIOS) at PRESS_LENGTHS, query-aware and -agnostic
#   qttt     query-only test-time training on and off, at and beyond the training length
#   backends on the plain-RoPE model: every sparse backend at equal read budgets (BUDGETS), at
#            BACKEND_LENGTHS, with the best RoPE scaling of the `rope` part
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
  backends)
    # Every sparse backend at equal read budgets (`--budget N`: each reads N key positions per
    # query), with dense attention as the reference, on the plain-RoPE model
    # (MODEL=models/longctx-2l-rope.gguf) at 1x/4x/16x/64x its 1K window. Each length uses the
    # best scaling of the `rope` part (MrRoPE-Pro with logn at factor L/1K; plain RoPE at 1K).
    # lychee reads the model's retrieval heads (models/README.md: longctx-2l-rope.heads.txt).
    heads=${HEADS:-models/longctx-2l-rope.heads.txt}
    for L in ${BACKEND_LENGTHS:-1K 4K 16K}; do
      f=$(( ${L%K} ))
      rope="none"
      [ "$f" -gt 1 ] && rope="mrrope-pro:factor=$f,orig=1024+logn:orig=1024"
      n_s=${BACKEND_SAMPLES:-$SAMPLES}
      run=(-m "$M" "${TASKS[@]}" --samples "$n_s" --max-new-tokens 48 -t "$THREADS" --no-plots -L "$L")
      "$LC" bench run "${run[@]}" -o "$OUT/backends-$L-dense" --method "rope=$rope;attn=dense;name=dense"
      for N in ${BUDGETS:-512 1024 2048}; do
        m=()
        for a in ${BACKENDS:-quest infllm dssa lychee streaming}; do
          spec=$a
          [ "$a" = lychee ] && spec="lychee:heads=$heads"
          m+=(--method "rope=$rope;attn=$spec;name=$a")
        done
        "$LC" bench run "${run[@]}" --budget "$N" -o "$OUT/backends-$L-b$N" "${m[@]}"
      done
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
    # Every press at each ratio, query-aware and -agnostic, with dense attention (the presses
    # that observe attention need it). PRESS_LENGTHS other than 1K use the best RoPE scaling of
    # the `rope` part (MrRoPE-Pro with logn at factor L/1K); the default is the shipped model at
    # 1K. Presses without ratio= take the nearest knob: duo_attention head_ratio=r (the fraction
    # of streaming heads, as kvpress's evaluation sets it), decoding target=(1-r)L tokens every
    # 16 generated tokens, think channel_ratio=r (the fraction of key channels pruned; it keeps
    # every token); simlayerkv runs once at its defaults (its threshold decides); kvzip is
    # query-agnostic by construction (no query= key).
    for L in ${PRESS_LENGTHS:-1K}; do
      f=$(( ${L%K} ))
      rope="gguf"
      [ "$f" -gt 1 ] && rope="mrrope-pro:factor=$f,orig=1024+logn:orig=1024"
      args=(--method "rope=$rope;attn=dense;press=none;name=full")
      for p in ${PRESSES:-snapkv h2o tova knorm keydiff expected_attention streaming_llm pyramidkv adakv speckv specpc random lagkv chunkkv block criticalkv critical_adakv duo_attention decoding kvzip simlayerkv think}; do
        for q in aware agnostic; do
          if [ "$p" = simlayerkv ]; then
            args+=(--method "rope=$rope;attn=dense;press=$p:query=$q;name=$p-default-$q"); continue
          fi
          [ "$p" = kvzip ] && [ "$q" = aware ] && continue
          for r in ${RATIOS:-0.5 0.75 0.9}; do
            case $p in
            duo_attention) spec="$p:head_ratio=$r,query=$q" ;;
            think) spec="$p:channel_ratio=$r,query=$q" ;;
            decoding) spec="$p:interval=16,target=$(python3 -c "print(int((1-$r)*$f*1024))")" ;;
            kvzip) spec="$p:ratio=$r" ;;
            *) spec="$p:ratio=$r,query=$q" ;;
            esac
            n="$p-$r-$q"
            if [ "$p" = decoding ]; then  # compresses while generating only
              [ "$q" = agnostic ] && continue
              n="$p-$r"
            fi
            args+=(--method "rope=$rope;attn=dense;press=$spec;name=$n")
          done
        done
      done
      # speckv / specpc draft with a model of the same vocabulary: by default stage 2 of
      # scripts/make_model.sh (the shipped model before its last stage).
      o="$OUT/press"; [ "$L" != 1K ] && o="$OUT/press-$L"
      # With plots: accuracy_vs_ratio-aware/-agnostic (.svg, .png).
      pc=(); for a in "${common[@]}"; do [ "$a" = --no-plots ] || pc+=("$a"); done
      "$LC" bench run "${pc[@]}" -L "$L" -c 0 --draft "${DRAFT:-out/make-model/stage2.gguf}" -o "$o" "${args[@]}"
    done
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
