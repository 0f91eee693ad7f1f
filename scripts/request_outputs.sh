#!/usr/bin/env bash
# Writes the greedy output of `run` for every model shipped with the project or its tests,
# with dense attention and with every attention backend and KV press at its defaults, with
# query-agnostic compression and with qTTT, one file per (model, method) under OUT. Run it with
# two binaries and compare the folders (`diff -r`): a refactoring of the request flow must leave
# every output byte-identical.
#   scripts/request_outputs.sh BIN OUT
set -uo pipefail
bin=${1:?binary}; out=${2:?output folder}
cd "$(dirname "$0")/.."
mkdir -p "$out"
prompt=$(mktemp); head -c 5000 data/haystack/opticks.txt > "$prompt"
methods=(
  "dense|"
  "streaming|--attn streaming"  "quest|--attn quest"  "infllm|--attn infllm"  "dssa|--attn dssa"
  "lychee|--attn lychee:retrieval=1"  "fixed|--attn fixed:distance=64"
  "streaming_llm|--kv-press streaming_llm"  "snapkv|--kv-press snapkv"  "h2o|--kv-press h2o"
  "tova|--kv-press tova"  "knorm|--kv-press knorm"  "pyramidkv|--kv-press pyramidkv"
  "adakv|--kv-press adakv"  "expected_attention|--kv-press expected_attention"  "random|--kv-press random"
  "snapkv-agnostic|--kv-press snapkv:query=agnostic --question ' What is light?'"
  "qttt|--qttt steps=2,span=32"
  "speckv|--kv-press speckv --draft MODEL"  "specpc|--kv-press specpc --draft MODEL"
)
for m in models/*.gguf tests/data/golden/models/*.gguf; do
  name=$(basename "$m" .gguf)
  for spec in "${methods[@]}"; do
    label=${spec%%|*}; flags=${spec#*|}; flags=${flags//MODEL/$m}
    eval "\"$bin\" run -m \"$m\" -f \"$prompt\" -c 4096 -n 24 --temp 0 --seed 1 -t 2 $flags" \
      > "$out/$name.$label.txt" 2> "$out/$name.$label.err"
    echo "exit $?" >> "$out/$name.$label.txt"
  done
done
rm -f "$prompt"
