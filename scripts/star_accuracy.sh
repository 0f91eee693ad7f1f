#!/usr/bin/env bash
# Star Attention's error against exact attention (docs/scale-out.md): RULER niah_single_1 on the
# project's model at several lengths, SAMPLES samples each (depths drawn from RULER's 40), read
# by one process (exact), and by `--cp` runs: RUNS, a list of NP:MODE (default "2:star 4:star
# 2:star:blocks=4", the last the paper's configuration of blocks of a quarter of the context on 2
# ranks); ONE=0 leaves out the one process. Prints the fraction of samples whose answer contains
# the needle's value, per length and run. LENGTHS (default "4K 8K 16K 32K"), SAMPLES (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longctx}
if [ "$BIN" = ./build/longctx ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target longctx -j"$(nproc)" >&2
fi
SAMPLES=${SAMPLES:-10}
out=out/star-accuracy
mkdir -p "$out"
RUNS=${RUNS:-2:star 4:star 2:star:blocks=4}
ONE=${ONE:-1}
hdr="| length | samples |" sep="|---:|---:|"
[ "$ONE" = 1 ] && hdr+=" one process (exact) |" && sep+="---:|"
for r in $RUNS; do hdr+=" ${r#*:}, ${r%%:*} ranks |"; sep+="---:|"; done
echo "$hdr"
echo "$sep"
for L in ${LENGTHS:-4K 8K 16K 32K}; do
  "$BIN" bench tasks --task niah_single_1 -L "$L" --samples "$SAMPLES" --show > "$out/show-$L.txt"
  # One prompt file and one answer file per sample (the prompt ends without a newline).
  awk -v dir="$out" -v L="$L" '
    /^=== / { if (f) close(f); n++; f = sprintf("%s/%s-%d.txt", dir, L, n);
              a = $0; sub(/.*answers: \[/, "", a); sub(/\].*/, "", a);
              print a > sprintf("%s/%s-%d.ans", dir, L, n); first = 1; next }
    { if (!first) printf "\n" > f; printf "%s", $0 > f; first = 0 }' "$out/show-$L.txt"
  one=0 n=0
  declare -A hit=()
  for r in $RUNS; do hit[$r]=0; done
  for p in "$out/$L"-*.txt; do
    a=$(cat "${p%.txt}.ans")
    printf '%s' "$(cat "$p")" > "$p.tmp" && mv "$p.tmp" "$p"  # no newline after the prompt
    n=$((n + 1))
    if [ "$ONE" = 1 ]; then
      "$BIN" run -f "$p" -n 12 -t 2 2>/dev/null | grep -q "$a" && one=$((one + 1)) || true
    fi
    for r in $RUNS; do
      mpirun --oversubscribe --allow-run-as-root -np "${r%%:*}" "$BIN" run -f "$p" -n 12 -t 1 --cp "${r#*:}" \
        2>/dev/null | grep -q "$a" && hit[$r]=$((hit[$r] + 1)) || true
    done
  done
  row="| $L | $n |"
  [ "$ONE" = 1 ] && row+=" $one/$n |"
  for r in $RUNS; do row+=" ${hit[$r]}/$n |"; done
  echo "$row"
done
