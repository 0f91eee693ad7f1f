#!/usr/bin/env bash
# `longctx serve` through curl: /health, /tokenize + /detokenize, a streamed completion ending in
# `data: [DONE]`, malformed JSON (400 with an OpenAI error body), /metrics (Prometheus text).
#
#   bash curl.test.sh LONGCTX_BINARY [MODEL.gguf]
# JSON is checked with node (the other server tests need it too).
set -euo pipefail

bin=${1:?usage: curl.test.sh LONGCTX_BINARY [MODEL.gguf]}
model=${2:-}
[ -x "$bin" ] || { echo "no such binary: $bin" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/longctx-curl.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

args=(serve --host 127.0.0.1 --port 0 -np 4)
[ -n "$model" ] && args+=(-m "$model")
echo "# server: $bin ${args[*]}"
"$bin" "${args[@]}" >"$work/stdout" 2>"$work/stderr" &
pid=$!

url=""
for _ in $(seq 600); do
  url=$(grep -o -m1 'listening on http://127\.0\.0\.1:[0-9]*' "$work/stdout" 2>/dev/null | sed 's/^listening on //' || true)
  [ -n "$url" ] && break
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "FAIL: server exited before listening" >&2
    cat "$work/stdout" "$work/stderr" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "FAIL: no 'listening on http://127.0.0.1:PORT' line on stdout within 60 s" >&2
  cat "$work/stdout" "$work/stderr" >&2
  exit 1
fi
echo "# listening on $url"

failures=0
ok()   { echo "ok - $1"; }
fail() { echo "not ok - $1" >&2; failures=$((failures + 1)); }

# js FILE EXPR: evaluates EXPR with `j` bound to FILE's JSON; exits 1 when it is falsy or throws.
js() {
  node -e '
    const fs = require("fs");
    let j;
    try { j = JSON.parse(fs.readFileSync(process.argv[1], "utf8")); }
    catch (e) { console.error("not JSON: " + fs.readFileSync(process.argv[1], "utf8").slice(0, 300)); process.exit(1); }
    const v = eval(process.argv[2]);
    if (typeof v === "boolean") process.exit(v ? 0 : 1);
    process.stdout.write(typeof v === "string" ? v : JSON.stringify(v));
  ' "$1" "$2"
}

# request METHOD PATH [BODY]: writes the body to $work/body and prints the status code (000: no answer).
request() {
  local method=$1 path=$2 body=${3-}
  rm -f "$work/body"
  if [ -n "$body" ]; then
    curl -sS -o "$work/body" -w '%{http_code}' --max-time 120 -X "$method" \
      -H 'Content-Type: application/json' --data-binary "$body" "$url$path" || true
  else
    curl -sS -o "$work/body" -w '%{http_code}' --max-time 120 -X "$method" "$url$path" || true
  fi
}

# GET /health
code=$(request GET /health)
if [ "$code" = 200 ] && js "$work/body" 'j.status === "ok"'; then ok "GET /health"
else fail "GET /health: status $code, body $(head -c 300 "$work/body")"; fi

# POST /tokenize, then /detokenize the tokens back
code=$(request POST /tokenize '{"content":"hello world"}')
if [ "$code" = 200 ] && js "$work/body" 'Array.isArray(j.tokens) && j.tokens.length > 0 && j.tokens.every(Number.isInteger)'; then
  tokens=$(js "$work/body" 'j.tokens')
  ok "POST /tokenize -> $tokens"
  code=$(request POST /detokenize "{\"tokens\":$tokens}")
  if [ "$code" = 200 ] && js "$work/body" 'j.content === "hello world"'; then ok "POST /detokenize round trip"
  else fail "POST /detokenize {\"tokens\":$tokens}: status $code, body $(head -c 300 "$work/body") (expected content \"hello world\")"; fi
else
  fail "POST /tokenize: status $code, body $(head -c 300 "$work/body")"
fi

# a streamed completion: data lines of JSON, the last one `data: [DONE]`
curl -sS -N --max-time 120 -o "$work/stream" -w '%{http_code}' -H 'Content-Type: application/json' \
  --data-binary '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"stream":true}' \
  "$url/v1/completions" >"$work/code" || true
code=$(cat "$work/code")
last=$(grep '^data:' "$work/stream" | tail -n 1 | tr -d '\r' || true)
ndata=$(grep -c '^data: *{' "$work/stream" || true)
if [ "$code" = 200 ] && [ "$last" = "data: [DONE]" ] && [ "$ndata" -gt 0 ]; then
  bad=$(grep '^data: *{' "$work/stream" | sed 's/^data: *//' | node -e '
    const lines = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean);
    let bad = 0;
    for (const l of lines) { try { const j = JSON.parse(l); if (!j.choices) bad++; } catch { bad++; } }
    console.log(bad);')
  if [ "$bad" = 0 ]; then ok "streamed completion: $ndata chunks, ends with data: [DONE]"
  else fail "streamed completion: $bad data lines are not JSON chunks with choices"; fi
else
  fail "streamed completion: status $code, $ndata JSON data lines, last data line '$last'; body: $(head -c 400 "$work/stream")"
fi

# malformed JSON: 400 with an OpenAI error object
code=$(request POST /v1/completions '{"prompt": "x", "max_tokens": ')
if [ "$code" = 400 ] && js "$work/body" 'typeof j.error === "object" && typeof j.error.message === "string" && j.error.message.length > 0'; then
  ok "malformed JSON -> 400 {\"error\":{...}}"
else
  fail "malformed JSON: status $code (want 400), body $(head -c 300 "$work/body")"
fi

# GET /metrics: Prometheus text with longctx_ series
code=$(request GET /metrics)
if [ "$code" = 200 ] && grep -q '^longctx_' "$work/body"; then ok "GET /metrics ($(grep -c '^longctx_' "$work/body") longctx_ lines)"
else fail "GET /metrics: status $code, no line starting with longctx_; body $(head -c 300 "$work/body")"; fi

if ! kill -0 "$pid" 2>/dev/null; then
  fail "the server is no longer running"
  cat "$work/stderr" >&2
fi

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed; server stderr (tail):" >&2
  tail -n 40 "$work/stderr" >&2
  exit 1
fi
echo "all curl checks passed"
