#!/usr/bin/env bash
# Installs the Debian 12 packages longctx builds and tests with. Safe to run again.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      libcpp-httplib-dev libfmt-dev libopenblas-dev libopenmpi-dev openmpi-bin libicu-dev libcairo2-dev fonts-dejavu-core
      chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# The server tests' npm packages (the openai client, playwright-core), from the lock file.
if ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
js="$(dirname "$0")/../tests/server/js"
if [ ! -d "$js/node_modules" ] || [ "$js/package-lock.json" -nt "$js/node_modules" ]; then
  echo "setup: npm ci in tests/server/js"
  (cd "$js" && npm ci --no-audit --no-fund)
  touch "$js/node_modules"
fi
