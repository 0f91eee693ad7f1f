#!/usr/bin/env bash
# Builds and runs every test: the full suite under AddressSanitizer + UBSan (host-CPU kernels),
# the kernel tests again on the plain AVX2 build, and a bounded libFuzzer run of the GGUF reader.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)

echo "== ASan + UBSan build, all tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLONGCTX_SANITIZE=ON \
  -DLONGCTX_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== plain AVX2 build (LONGCTX_NATIVE=OFF), kernel and model tests"
cmake -S . -B build-avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGCTX_NATIVE=OFF \
  -DLONGCTX_BENCH=OFF >/dev/null
cmake --build build-avx2 --target test_kernels test_model -j"$jobs"
./build-avx2/tests/test_kernels --gtest_brief=1
./build-avx2/tests/test_model --gtest_brief=1

echo "== fuzz the GGUF reader (bounded)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLONGCTX_FUZZ=ON -DLONGCTX_TESTS=OFF -DLONGCTX_BENCH=OFF >/dev/null
cmake --build build-fuzz --target fuzz_gguf_fuzz -j"$jobs"
mkdir -p build-fuzz/corpus && cp -n fuzz/corpus/gguf/* build-fuzz/corpus/ 2>/dev/null || true
./build-fuzz/fuzz/fuzz_gguf_fuzz -max_total_time="${LONGCTX_FUZZ_SECONDS:-60}" -timeout=10 -malloc_limit_mb=512 -rss_limit_mb=2048 \
  -max_len=8192 build-fuzz/corpus
echo "all tests passed"
