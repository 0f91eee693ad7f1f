#!/usr/bin/env bash
# The router under a bounded mixed workload on loopback (docs/scale-out.md): two `longctx serve`
# backends of unequal speed on long prompts (A: streaming attention, B: the model's own, which
# reads every key), fresh for each policy, and `longctx route` with each policy in turn. The same N requests (short
# chats or long documents, each with probability 1/2 in an order drawn once from SEED, default 7)
# arrive every GAP seconds; prints each policy's
# mean latency, its mean by kind, and the queue length sampled over time (queue_<policy>.csv).
# N (default 24), GAP (seconds, default 0.3), LONG (sentences of a long prompt, default 300), EPS0
# (CQB-eps exploration, default 1), POLICIES (default "rr least cqb"), INFLIGHT (requests a
# backend takes at once, default 2; fewer makes a queue), BUCKET (seconds per row of the
# queue-over-time table, default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/longctx}
if [ "$BIN" = ./build/longctx ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target longctx -j"$(nproc)" >&2
fi
N=${N:-24}
GAP=${GAP:-0.3}
out=out/route
mkdir -p "$out"
long=$(for i in $(seq 1 ${LONG:-300}); do printf 'The river ran past the old mill number %d. ' "$i"; done)
start() {  # name, args...
  local name=$1; shift
  "$BIN" "$@" > "$out/$name.out" 2> "$out/$name.err" &
  echo $! > "$out/$name.pid"
  for _ in $(seq 1 100); do grep -q 'http://' "$out/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -oP 'http://127.0.0.1:\K[0-9]+' "$out/$name.out"
}
cleanup() { for f in "$out"/*.pid; do [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null; done; true; }
trap cleanup EXIT
echo "| policy | mean latency s | short | long | requests on A (streaming) / B | long ones on A / B |"
echo "|---|---:|---:|---:|---|---|"
for policy in ${POLICIES:-rr least cqb}; do
  # Fresh backends for each policy: no prompt cached from the run before.
  pa=$(start "a_$policy" serve --port 0 -np 2 -t 1 --attn streaming:sinks=4,window=256)
  pb=$(start "b_$policy" serve --port 0 -np 2 -t 1)
  pr=$(start "r_$policy" route --port 0 --policy "$policy" --max-inflight "${INFLIGHT:-2}" --slot 0.1 --eps0 "${EPS0:-1}" \
       --backend "http://127.0.0.1:$pa" --backend "http://127.0.0.1:$pb")
  : > "$out/lat_$policy.txt"
  rpid=$(cat "$out/r_$policy.pid")
  ( while kill -0 "$rpid" 2>/dev/null; do
      printf '%s %s\n' "$(date +%s.%N)" "$(curl -s "localhost:$pr/router/stats" | grep -oP '"queue":\K[0-9]+')"
      sleep 0.2; done > "$out/queue_$policy.csv" ) &
  sampler=$!
  RANDOM=${SEED:-7}  # the same order of kinds for every policy
  for i in $(seq 1 "$N"); do
    if [ $((RANDOM % 2)) -eq 1 ]; then kind=long; prompt="Mill question $i. $long Where is the mill number $i?"; else kind=short; prompt="Tell me about the river number $i."; fi
    body=$(printf '{"prompt": "%s", "max_tokens": 16, "temperature": 0}' "$prompt")
    ( t=$(curl -s -o /dev/null -w '%{time_total} %header{x-longctx-backend}' -H 'Content-Type: application/json' \
            "localhost:$pr/v1/completions" -d "$body"); echo "$kind $t" >> "$out/lat_$policy.txt" ) &
    sleep "$GAP"
  done
  while [ "$(wc -l < "$out/lat_$policy.txt")" -lt "$N" ]; do sleep 0.2; done
  curl -s "localhost:$pr/router/stats" > "$out/stats_$policy.json"
  split=$(grep -oP '"routed":\K[0-9]+' "$out/stats_$policy.json" | paste -sd/)
  for x in r a b; do kill "$(cat "$out/${x}_$policy.pid")"; rm -f "$out/${x}_$policy.pid"; done
  wait "$sampler" 2>/dev/null || true
  awk -v p="$policy" -v s="$split" -v a="http://127.0.0.1:$pa" '{ t += $2; n++; k[$1] += $2; c[$1]++;
      if ($1 == "long") { if ($3 == a) la++; else lb++ } }
    END { printf "| %s | %.2f | %.2f | %.2f | %s | %d/%d |\n", p, t / n, k["short"] / c["short"], k["long"] / c["long"],
                 s, la, lb }' "$out/lat_$policy.txt"
done
# The queue over time: mean queue length per BUCKET seconds from each policy's first request.
echo
printf '| seconds |'; for policy in ${POLICIES:-rr least cqb}; do printf ' %s queue |' "$policy"; done; echo
printf '|---:|'; for policy in ${POLICIES:-rr least cqb}; do printf -- '---:|'; done; echo
for policy in ${POLICIES:-rr least cqb}; do
  awk -v b="${BUCKET:-10}" 'NF == 2 { if (!t0) t0 = $1; k = int(($1 - t0) / b); s[k] += $2; c[k]++; if (k > m) m = k }
    END { for (i = 0; i <= m; i++) printf "%d %.2f\n", i * b, c[i] ? s[i] / c[i] : 0 }' "$out/queue_$policy.csv" \
    > "$out/queue_buckets_$policy.txt"
done
rows=$(cat "$out"/queue_buckets_*.txt | awk '{print $1}' | sort -n | uniq)
for t in $rows; do
  printf '| %s |' "$t"
  for policy in ${POLICIES:-rr least cqb}; do
    printf ' %s |' "$(awk -v t="$t" '$1 == t { print $2 }' "$out/queue_buckets_$policy.txt")"
  done
  echo
done
for policy in ${POLICIES:-rr least cqb}; do
  awk -v p="$policy" 'NF == 2 { s += $2; n++; if ($2 > m) m = $2 } END { printf "%s: mean queue %.2f, max %d\n", p, s / n, m }' \
    "$out/queue_$policy.csv"
done
