#include <cmath>
// Kernel throughput on the SmolLM2-135M shapes (n_embd 576, n_ff 1536, kv 192, vocab 49152):
// matmul for each weight type at n_tokens = 1 (decode gemv), 4 (a batch of four decoding
// sequences) and 512 (prefill GEMM) with 1 and
// 2 threads, plus the row kernels. Counters: GFLOP/s (2 * n_in * n_out * n_tokens per call)
// and weight bytes streamed per second (bytes/s = weight bytes * calls / s).
//
//   bench_kernels --benchmark_filter=Matmul            # all matmul shapes
//   bench_kernels --benchmark_filter='Matmul/q4_0/576x1536/t1'
//
// MatmulStream: the decode product (one token) over copies of one 896x4864 matrix (Qwen2.5-0.5B's
// ffn_gate/ffn_up; ffn_down, 4864x896, for the k-quants) that together fill 256 MiB, taken in turn, so every call reads its weights
// from memory as decoding a model larger than the last-level cache does; /pfN is the weight
// stream prefetch distance (set_stream_prefetch). Compare variants in one process:
//   bench_kernels --benchmark_filter=MatmulStream --benchmark_repetitions=8
//     --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/matmul_config.h"

namespace lc::kernels {
namespace {

struct Shape {
  const char* name;
  int64_t n_in, n_out;
};
// n_in x n_out as the model multiplies: W is [n_out rows of n_in].
constexpr Shape kShapes[] = {
    {"576x576", 576, 576},     // attn_q, attn_output
    {"576x192", 576, 192},     // attn_k, attn_v
    {"576x1536", 576, 1536},   // ffn_gate, ffn_up
    {"1536x576", 1536, 576},   // ffn_down
    {"576x49152", 576, 49152}, // output head
};

ThreadPool& pool_of(int n) {
  static std::unique_ptr<ThreadPool> pools[3];
  if (!pools[n]) pools[n] = std::make_unique<ThreadPool>(n);
  return *pools[n];
}

std::vector<uint8_t> make_weights(DType t, int64_t n_in, int64_t n_out) {
  std::mt19937 rng(42);
  std::normal_distribution<float> g(0.f, 0.05f);
  std::vector<float> row(static_cast<size_t>(n_in));
  std::vector<uint8_t> w(row_bytes(t, n_in) * static_cast<size_t>(n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    for (auto& v : row) v = g(rng);
    quantize_row(t, row.data(), w.data() + static_cast<size_t>(o) * row_bytes(t, n_in), n_in);
  }
  return w;
}

// packed: the row-interleaved copy a loaded model multiplies (Q8_0, Q4_x, Q5_x, Q4_K, Q5_K,
// Q6_K), else the blocks as stored in the file.
void bm_matmul(benchmark::State& st, DType t, Shape s, int64_t n_tokens, int threads, FloatGemm fg, bool packed) {
  set_float_gemm(fg);
  const auto w = make_weights(t, s.n_in, s.n_out);
  TensorView v;
  v.data = w.data();
  v.type = t;
  v.ne[0] = s.n_in;
  v.ne[1] = s.n_out;
  Buffer<uint8_t> pk;
  if (packed) {
    pk.resize(packed_bytes(v));
    pack_matrix(v, pk.data());
    v.packed = pk.data();
  }
  std::vector<float> x(static_cast<size_t>(s.n_in * n_tokens)), y(static_cast<size_t>(s.n_out * n_tokens));
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.f, 1.f);
  for (auto& e : x) e = g(rng);
  ThreadPool& pool = pool_of(threads);
  for (auto _ : st) {
    matmul(v, x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * static_cast<double>(s.n_in * s.n_out * n_tokens);
  st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["tok/s"] = benchmark::Counter(static_cast<double>(n_tokens), benchmark::Counter::kIsIterationInvariantRate);
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(w.size()));
  set_float_gemm(FloatGemm::kAuto);
}

void bm_matmul_stream(benchmark::State& st, DType t, Shape s, int threads, int prefetch) {
  const auto w = make_weights(t, s.n_in, s.n_out);
  TensorView v;
  v.type = t;
  v.ne[0] = s.n_in;
  v.ne[1] = s.n_out;
  const bool packed = can_pack(t);
  const size_t bytes = packed ? packed_bytes(v) : w.size();
  const size_t copies = std::max<size_t>(2, (size_t{256} << 20) / bytes);
  Buffer<uint8_t> all(bytes * copies);
  if (packed) {
    v.data = w.data();
    pack_matrix(v, all.data());
  } else {
    std::memcpy(all.data(), w.data(), bytes);
  }
  for (size_t i = 1; i < copies; ++i) std::memcpy(all.data() + i * bytes, all.data(), bytes);
  std::vector<float> x(static_cast<size_t>(s.n_in)), y(static_cast<size_t>(s.n_out));
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.f, 1.f);
  for (auto& e : x) e = g(rng);
  ThreadPool& pool = pool_of(threads);
  set_stream_prefetch(prefetch);
  size_t i = 0;
  for (auto _ : st) {
    // A packed matrix keeps its file blocks only for rows past the last whole group: the
    // shapes here have none, so data is never read.
    if (packed) v.packed = all.data() + i * bytes, v.data = w.data();
    else v.data = all.data() + i * bytes;
    matmul(v, x.data(), 1, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    i = (i + 1) % copies;
  }
  set_stream_prefetch(kDefaultStreamPrefetch);
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(bytes));
}

void bm_row(benchmark::State& st, int which) {
  const int64_t n = 1536;
  std::vector<float> a(n, 0.5f), b(n, 0.25f), c(n);
  for (auto _ : st) {
    switch (which) {
      case 0: rmsnorm(a.data(), b.data(), c.data(), 576, 1e-5f); break;
      case 1: swiglu(a.data(), b.data(), c.data(), n); break;
      case 2: c = a; softmax_inplace(c.data(), 512); break;
      default: benchmark::DoNotOptimize(dot_f32(a.data(), b.data(), 64)); break;
    }
    benchmark::ClobberMemory();
  }
}

// Rotary embedding of one token's queries (SmolLM2: 9 heads of 64).
void bm_rope(benchmark::State& st) {
  std::vector<float> x(9 * 64, 0.5f), inv(32);
  for (int i = 0; i < 32; ++i) inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * i / 64.0f);
  const int32_t pos = 1234;
  for (auto _ : st) {
    rope_apply(x.data(), 1, 9, 64, 64, &pos, inv.data(), 1.0f, false);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * 9 * 64);
}

// Dequantising (embedding lookups, KV reads) and quantising (activations, KV writes) a row.
void bm_convert(benchmark::State& st, DType t, bool quantize) {
  const int64_t n = 4096;
  std::vector<float> f(n), back(n);
  std::mt19937 rng(2);
  std::normal_distribution<float> g(0.f, 1.f);
  for (auto& e : f) e = g(rng);
  std::vector<uint8_t> q(row_bytes(t, n));
  quantize_row(t, f.data(), q.data(), n);
  for (auto _ : st) {
    if (quantize) quantize_row(t, f.data(), q.data(), n);
    else dequantize_row(t, q.data(), back.data(), n);
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * n);
}

// One parallel region of the pool with nothing to do: what each of decode's regions costs in
// synchronisation alone (the caller publishes the job, the worker sees it, runs, reports back).
void bm_pool_region(benchmark::State& st, int threads) {
  ThreadPool& pool = pool_of(threads);
  std::atomic<int64_t> sink{0};
  for (auto _ : st) pool.run([&](int t) { sink.fetch_add(t, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(sink.load());
}

const char* float_gemm_name(FloatGemm g) {
  return g == FloatGemm::kOwn ? "/own" : g == FloatGemm::kBlas ? "/blas" : "";
}

int register_all() {
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType t : types)
    for (const Shape& s : kShapes) {
      // k-quants need rows of whole 256-blocks: the 576-wide matrices cannot be k-quants
      // (llama.cpp falls back to legacy types for them), so only 1536x576 runs for those.
      if (s.n_in % traits(t).block_size != 0) continue;
      for (int64_t nt : {1, 4, 512})  // 4: a decode batch of four sequences (a server)
        for (int th : {1, 2}) {
          const bool flt = !traits(t).quantized;
          for (FloatGemm fg : {FloatGemm::kOwn, FloatGemm::kBlas}) {
            if ((!flt || nt == 1) && fg == FloatGemm::kBlas) continue;  // one variant suffices
            std::string name = std::string("Matmul/") + dtype_name(t) + "/" + s.name + "/n" + std::to_string(nt) +
                               "/t" + std::to_string(th) + ((flt && nt > 1) ? float_gemm_name(fg) : "");
            for (bool packed : {false, true}) {
              if (packed && !can_pack(t)) continue;
              auto* b = benchmark::RegisterBenchmark((name + (packed ? "/packed" : "")).c_str(), bm_matmul, t, s, nt,
                                                     th, fg, packed);
              b->Unit(benchmark::kMicrosecond)->UseRealTime();
              if (nt > 1 && s.n_out == 49152) b->Iterations(2);
              else if (nt > 1) b->MinTime(0.2);
            }
          }
        }
    }
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K})
    for (int th : {1, 2})
      for (int pf : {0, 1024, 2048, 4096}) {
        // k-quants need rows of whole 256-blocks: Qwen2.5-0.5B's ffn_down (4864 wide) for them.
        const Shape kStream = traits(t).block_size == 256 ? Shape{"4864x896", 4864, 896} : Shape{"896x4864", 896, 4864};
        const bool nib = t == DType::Q4_0 || t == DType::Q4_K || t == DType::Q6_K;  // types stream_prefetch applies to
        if (!nib && pf != kDefaultStreamPrefetch) continue;
        const std::string name = std::string("MatmulStream/") + dtype_name(t) + "/" + kStream.name + "/t" +
                                 std::to_string(th) + (nib ? "/pf" + std::to_string(pf) : "");
        benchmark::RegisterBenchmark(name.c_str(), bm_matmul_stream, t, kStream, th, pf)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            ->MinTime(0.5);
      }
  for (int th : {1, 2})
    benchmark::RegisterBenchmark(("Pool/region/t" + std::to_string(th)).c_str(), bm_pool_region, th)->UseRealTime();
  benchmark::RegisterBenchmark("Row/rmsnorm576", bm_row, 0);
  benchmark::RegisterBenchmark("Row/swiglu1536", bm_row, 1);
  benchmark::RegisterBenchmark("Row/softmax512", bm_row, 2);
  benchmark::RegisterBenchmark("Row/dot64", bm_row, 3);
  benchmark::RegisterBenchmark("Row/rope9x64", bm_rope);
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::Q8_K}) {
    benchmark::RegisterBenchmark((std::string("Dequantize/") + dtype_name(t)).c_str(), bm_convert, t, false);
    benchmark::RegisterBenchmark((std::string("Quantize/") + dtype_name(t)).c_str(), bm_convert, t, true);
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace lc::kernels

BENCHMARK_MAIN();
