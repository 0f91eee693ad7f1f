// Attention backends over the paged cache against the contiguous kernel (kernels/attention.h)
// at several context lengths: decode (1 query) and prefill chunks (64 queries).
// Shape: 32 query heads, 8 KV heads, head_dim 128 (Llama-3-8B-like), f32 K/V.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/backend.h"
#include "kernels/attention.h"
#include "kv/kv_cache.h"

namespace lc {
namespace {

constexpr int64_t kH = 32, kHkv = 8, kD = 128;

ThreadPool& pool() {
  static ThreadPool p(default_thread_count());
  return p;
}

RopeTable table() {
  LlamaCppRopeParams p;
  p.n_rot = kD;
  p.neox = true;
  p.base = 500000.0f;
  return make_llama_cpp_rope(p);
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// args: context length, queries per call.
void BM_Contiguous(benchmark::State& st) {
  const int64_t L = st.range(0), n = st.range(1);
  const auto k = randn(static_cast<size_t>(kHkv * L * kD), 1), v = randn(k.size(), 2);
  const auto q = randn(static_cast<size_t>(n * kH * kD), 3);
  std::vector<float> out(static_cast<size_t>(n * kH * kD));
  kernels::AttnShape s;
  s.n_tokens = n;
  s.n_head = kH;
  s.n_head_kv = kHkv;
  s.head_dim = kD;
  s.head_dim_v = kD;
  s.kv_stride = L;
  s.n_past = L - n;
  s.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  for (auto _ : st) kernels::attention_causal(s, q.data(), k.data(), v.data(), out.data(), pool());
  st.SetItemsProcessed(st.iterations() * n);
}

void run_backend(benchmark::State& st, const std::string& spec, int64_t block) {
  const int64_t L = st.range(0), n = st.range(1);
  KvCacheConfig c;
  c.n_layer = 1;
  c.n_head_kv = kHkv;
  c.head_dim = kD;
  c.head_dim_v = kD;
  c.block_tokens = block;
  c.rope = table();
  auto kv = std::move(KvCache::create(c).value());
  const auto k = randn(static_cast<size_t>(L * kHkv * kD), 1), v = randn(k.size(), 2);
  std::vector<int32_t> pos(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  if (!kv->append(0, L, k.data(), v.data(), pos.data()).is_ok()) st.SkipWithError("append");
  AttnShape sh{1, kH, kHkv, kD, kD, 0.0f};
  auto be = std::move(make_attention_backend(spec, sh).value());
  if (!be->attach(*kv).is_ok()) st.SkipWithError("attach");
  const auto q = randn(static_cast<size_t>(n * kH * kD), 3);
  std::vector<float> out(static_cast<size_t>(n * kH * kD));
  // The chunk's queries are the last n tokens of the cache.
  for (auto _ : st)
    if (!be->forward(0, n, q.data(), pos.data() + (L - n), *kv, out.data(), pool()).is_ok()) st.SkipWithError("forward");
  st.SetItemsProcessed(st.iterations() * n);
}

void BM_Dense(benchmark::State& st) { run_backend(st, "dense", 256); }
void BM_Quest(benchmark::State& st) { run_backend(st, "quest:budget=2048,page=16,dense_layers=0", 256); }
void BM_InfLlm(benchmark::State& st) { run_backend(st, "infllm", 256); }
void BM_Dssa(benchmark::State& st) { run_backend(st, "dssa:switch=4096", 256); }
void BM_Lychee(benchmark::State& st) { run_backend(st, "lychee:budget=2048", 256); }

void lengths(benchmark::internal::Benchmark* b) {
  for (int64_t L : {4096, 16384, 65536}) {
    b->Args({L, 1});
    b->Args({L, 64});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Contiguous)->Apply(lengths);
BENCHMARK(BM_Dense)->Apply(lengths);
BENCHMARK(BM_Quest)->Apply(lengths);
BENCHMARK(BM_InfLlm)->Apply(lengths);
BENCHMARK(BM_Dssa)->Apply(lengths);
BENCHMARK(BM_Lychee)->Apply(lengths);

}  // namespace
}  // namespace lc

BENCHMARK_MAIN();
