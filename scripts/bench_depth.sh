#!/usr/bin/env bash
# The long-context speed study (docs/performance.md, "Speed at depth"): prefill and decode
# tokens/s of dense attention and of each sparse backend at depths 4K, 16K, 64K and 256K on the
# random Q8_0 model of SmolLM2-135M's shape, 2 threads, f16 K/V (as llama.cpp caches them).
# The cache is filled to each depth once, untimed, by a local-window backend
# (infllm with no retrieval: O(n)), and every backend is then timed over the same cache.
# Takes about an hour on 2 cores (most of it dense prefill at 256K); DEPTHS narrows it.
# Extra arguments go to `bench speed`, e.g. --interleave to alternate the backends turn by turn
# (fairer on a machine whose speed drifts; streaming then refills the cache every turn).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target longctx -j"$(nproc)" >&2
mkdir -p out/bench
m=out/bench/smollm2-135m-random-q8_0.gguf
[ -f "$m" ] || ./build/longctx make-model --type q8_0 --vocab tests/data/vocab/ggml-vocab-starcoder.gguf -o "$m"
# Ascending depths in one process: each fill extends the previous one.
./build/longctx bench speed -m "$m" -p 512 -n "${NGEN:-64}" -d "${DEPTHS:-4096,16384,65536,262144}" \
  -r "${REPS:-2}" -t "${THREADS:-2}" --kv-type-k f16 --kv-type-v f16 -c 263168 \
  --fill-attn infllm:sinks=4,local=64,topk=0 \
  -a dense -a quest -a infllm -a dssa -a lychee:retrieval=1 -a streaming "$@"
