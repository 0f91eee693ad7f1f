// Attention backends over the paged cache against the contiguous kernel (kernels/attention.h)
// at several context lengths: decode (1 query) and prefill chunks (64 queries).
// Shape: 32 query heads, 8 KV heads, head_dim 128 (Llama-3-8B-like), f32 K/V; and dense on
// SmolLM2-135M's shape with and without split-K.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/backend.h"
#include "attention/exec.h"
#include "kernels/attention.h"
#include "kv/kv_cache.h"

namespace lc {
namespace {

constexpr int64_t kH = 32, kHkv = 8, kD = 128;

ThreadPool& pool() {
  static ThreadPool p(default_thread_count());
  return p;
}

RopeTable table(int64_t d) {
  LlamaCppRopeParams p;
  p.n_rot = d;
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

void run_backend(benchmark::State& st, const std::string& spec, int64_t block, int64_t H = kH,
                 int64_t Hkv = kHkv, int64_t D = kD, DType type = DType::F32) {
  const int64_t L = st.range(0), n = st.range(1);
  KvCacheConfig c;
  c.n_layer = 1;
  c.n_head_kv = Hkv;
  c.head_dim = D;
  c.head_dim_v = D;
  c.block_tokens = block;
  c.type_k = c.type_v = type;
  c.rope = table(D);
  auto kv = std::move(KvCache::create(c).value());
  const auto k = randn(static_cast<size_t>(L * Hkv * D), 1), v = randn(k.size(), 2);
  std::vector<int32_t> pos(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  if (!kv->append(0, L, k.data(), v.data(), pos.data()).is_ok()) st.SkipWithError("append");
  AttnShape sh{1, H, Hkv, D, D, 0.0f};
  auto be = std::move(make_attention_backend(spec, sh).value());
  if (!be->attach(*kv).is_ok()) st.SkipWithError("attach");
  const auto q = randn(static_cast<size_t>(n * H * D), 3);
  std::vector<float> out(static_cast<size_t>(n * H * D));
  // The chunk's queries are the last n tokens of the cache.
  for (auto _ : st)
    if (!be->forward(0, n, q.data(), pos.data() + (L - n), *kv, out.data(), pool()).is_ok()) st.SkipWithError("forward");
  st.SetItemsProcessed(st.iterations() * n);
}

void BM_Dense(benchmark::State& st) { run_backend(st, "dense", 256); }
// SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head_dim 64): one decoded token
// is 3 tiles, fewer than the threads can share, so dense runs split-K; split=1<<30 turns it off.
void BM_DenseSmol(benchmark::State& st) { run_backend(st, "dense", 64, 9, 3, 64); }
void BM_DenseSmolNoSplit(benchmark::State& st) { run_backend(st, "dense:split=1073741824", 64, 9, 3, 64); }
// The same with f16 K/V (as llama.cpp caches them): half the bytes, a conversion per element.
void BM_DenseSmolF16(benchmark::State& st) { run_backend(st, "dense", 64, 9, 3, 64, DType::F16); }
void BM_DenseSmolF16NoSplit(benchmark::State& st) {
  run_backend(st, "dense:split=1073741824", 64, 9, 3, 64, DType::F16);
}
void BM_Quest(benchmark::State& st) { run_backend(st, "quest:budget=2048,page=16,dense_layers=0", 256); }
void BM_InfLlm(benchmark::State& st) { run_backend(st, "infllm", 256); }
void BM_Dssa(benchmark::State& st) { run_backend(st, "dssa:switch=4096", 256); }
void BM_Lychee(benchmark::State& st) { run_backend(st, "lychee:budget=2048", 256); }
// The distance ceiling: every key beyond 64 rotated back to 0 as it is read; and read sparsely.
void BM_Fixed(benchmark::State& st) { run_backend(st, "fixed:distance=64", 256); }
void BM_FixedBudget(benchmark::State& st) { run_backend(st, "fixed:distance=64,budget=2048,page=16", 256); }

// One decoded token through all 30 layers of SmolLM2-135M's shape with f16 K/V (as llama.cpp
// caches them): 30 layers of cache do not fit in any cache level, so this shows what one layer
// alone hides (bounds and K/V streamed from memory). Time per iteration = attention time per
// decoded token of the whole model. Each layer holds the same keys.
void run_stack(benchmark::State& st, const std::string& spec) {
  constexpr int64_t H = 9, Hkv = 3, D = 64, layers = 30;
  const int64_t L = st.range(0);
  KvCacheConfig c;
  c.n_layer = layers;
  c.n_head_kv = Hkv;
  c.head_dim = D;
  c.head_dim_v = D;
  c.block_tokens = 64;
  c.type_k = c.type_v = DType::F16;
  c.rope = table(D);
  auto kv = std::move(KvCache::create(c).value());
  const auto k = randn(static_cast<size_t>(L * Hkv * D), 1), v = randn(k.size(), 2);
  std::vector<int32_t> pos(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  // Appended as a model's prefill appends: chunks of 512 tokens, every layer in turn, so a
  // layer's blocks are interleaved with the other layers' in the pool as they are in a run.
  for (int64_t t0 = 0; t0 < L; t0 += 512)
    for (int64_t il = 0; il < layers; ++il) {
      const int64_t n = std::min<int64_t>(512, L - t0);
      if (!kv->append(il, n, k.data() + t0 * Hkv * D, v.data() + t0 * Hkv * D, pos.data() + t0).is_ok())
        st.SkipWithError("append");
    }
  AttnShape sh{layers, H, Hkv, D, D, 0.0f};
  auto be = std::move(make_attention_backend(spec, sh).value());
  if (!be->attach(*kv).is_ok()) st.SkipWithError("attach");
  const auto q = randn(static_cast<size_t>(H * D), 3);
  std::vector<float> out(static_cast<size_t>(H * D));
  // Warm-up: backends build their summaries (page bounds, representatives) on first sight.
  for (int64_t il = 0; il < layers; ++il)
    if (!be->forward(il, 1, q.data(), pos.data() + (L - 1), *kv, out.data(), pool()).is_ok())
      st.SkipWithError("forward");
  for (auto _ : st)
    for (int64_t il = 0; il < layers; ++il)
      if (!be->forward(il, 1, q.data(), pos.data() + (L - 1), *kv, out.data(), pool()).is_ok())
        st.SkipWithError("forward");
  st.SetItemsProcessed(st.iterations());
}
void BM_StackDense(benchmark::State& st) { run_stack(st, "dense"); }
void BM_StackQuest(benchmark::State& st) { run_stack(st, "quest"); }
void BM_StackLychee(benchmark::State& st) { run_stack(st, "lychee"); }
void BM_StackInfLlm(benchmark::State& st) { run_stack(st, "infllm"); }
// Quest without its two dense first layers: what the sparse layers cost on their own.
void BM_StackQuestSparseOnly(benchmark::State& st) { run_stack(st, "quest:dense_layers=0"); }

// InfLLM's memory blocks are attended "at a fixed distance": each retrieved block's stored
// keys (128 rows of head_dim 64, consecutive positions near 64K) are rotated back to
// position 0 before scoring (attn::unrotate_rows). arg: 1 neox pairs, 0 interleaved pairs.
void BM_UnrotateRows(benchmark::State& st) {
  constexpr int64_t rows = 128, d = 64;
  LlamaCppRopeParams p;
  p.n_rot = d;
  p.neox = st.range(0) != 0;
  p.base = 10000.0f;
  const RopeTable rt = make_llama_cpp_rope(p);
  const auto src = randn(static_cast<size_t>(rows * d), 4);
  std::vector<float> x(src.size());
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  for (int64_t j = 0; j < rows; ++j) pos[static_cast<size_t>(j)] = static_cast<int32_t>(60000 + j);
  for (auto _ : st) {
    std::copy(src.begin(), src.end(), x.begin());
    attn::unrotate_rows(x.data(), rows, d, pos.data(), rt);
    benchmark::DoNotOptimize(x.data());
  }
  st.SetItemsProcessed(st.iterations() * rows);
}
BENCHMARK(BM_UnrotateRows)->Arg(0)->Arg(1);

void stack_lengths(benchmark::internal::Benchmark* b) {
  for (int64_t L : {16384, 65536}) b->Args({L});
  b->Unit(benchmark::kMillisecond);
}

void lengths(benchmark::internal::Benchmark* b) {
  for (int64_t L : {4096, 16384, 65536}) {
    b->Args({L, 1});
    b->Args({L, 64});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Contiguous)->Apply(lengths);
BENCHMARK(BM_Dense)->Apply(lengths);
BENCHMARK(BM_DenseSmol)->Apply(lengths);
BENCHMARK(BM_DenseSmolNoSplit)->Apply(lengths);
BENCHMARK(BM_DenseSmolF16)->Apply(lengths);
BENCHMARK(BM_DenseSmolF16NoSplit)->Apply(lengths);
BENCHMARK(BM_Quest)->Apply(lengths);
BENCHMARK(BM_InfLlm)->Apply(lengths);
BENCHMARK(BM_Dssa)->Apply(lengths);
BENCHMARK(BM_Lychee)->Apply(lengths);
BENCHMARK(BM_Fixed)->Apply(lengths);
BENCHMARK(BM_FixedBudget)->Apply(lengths);
BENCHMARK(BM_StackDense)->Apply(stack_lengths);
BENCHMARK(BM_StackQuest)->Apply(stack_lengths);
BENCHMARK(BM_StackLychee)->Apply(stack_lengths);
BENCHMARK(BM_StackInfLlm)->Apply(stack_lengths);
BENCHMARK(BM_StackQuestSparseOnly)->Apply(stack_lengths);

}  // namespace
}  // namespace lc

BENCHMARK_MAIN();
