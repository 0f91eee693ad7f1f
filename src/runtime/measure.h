// Measurements over a context: perplexity the way llama.cpp's perplexity tool computes it, and
// llama-bench style speed measurements. (A request's prefill and generation live in
// runtime/session.h.)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "kernels/machine.h"
#include "model/context.h"

namespace lc {

struct PerplexityResult {
  double ppl = 0, ppl_err = 0;
  double nll_sum = 0;
  int64_t n_scored = 0;
  int64_t n_chunks = 0;
  std::vector<double> nll;        // every scored token, chunk order
  std::vector<double> chunk_ppl;  // running estimate after each chunk
};

// llama.cpp's method: the text's tokens (with BOS if the model adds it) are cut into chunks of
// n_ctx; each chunk starts with BOS in place of its first token and is evaluated from an empty
// cache; the second half of each chunk (positions n_ctx/2 .. n_ctx-2) scores the next token.
// on_chunk(i, running ppl) reports progress.
Expected<PerplexityResult> perplexity(Context& ctx, const std::vector<int32_t>& tokens, int64_t n_ctx,
                                      const std::function<void(int64_t, double)>& on_chunk = {});

struct SpeedTest {
  std::string name;   // "pp512" / "tg64"
  int64_t n_prompt = 0, n_gen = 0, depth = 0;
  std::vector<double> tps;  // tokens/s per repetition
  // The thread pool over the timed repetitions (ThreadPool::Stats; zero on one thread):
  // parallel regions, their wall time, the caller's wait for the other threads, the latest
  // worker's start; seconds timed.
  ThreadPool::Stats pool;
  double timed_s = 0;
  double mean() const;
  double stddev() const;
};

// Fills the context to `depth` random tokens (not timed); a context already filled to a smaller
// depth, with every token still cached, is extended. With fill_attn not empty the
// fill runs with that attention backend and the context's own is put back afterwards: a
// 256K-token cache is filled in minutes by a local-window backend, then timed with dense.
Status bench_fill(Context& ctx, int64_t depth, const std::string& fill_attn, uint64_t seed);

// Times, at the context's current depth, a prompt of n_prompt tokens (pp) or n_gen
// single-token decodes (tg), on random tokens, `reps` times after an untimed warm-up run
// (unless warmup is false). Each run starts from the depth (the cache is truncated back).
Expected<SpeedTest> bench_speed(Context& ctx, int64_t n_prompt, int64_t n_gen, int reps, bool warmup,
                                uint64_t seed);

// Roofline bounds of a model on this machine, for `bench speed`'s "of bound" column.
struct TokenCost {
  double layer_bytes = 0;   // bytes of every layer's matrices (one decoded token reads each once)
  double output_bytes = 0;  // the output matrix's bytes (read once per token that gets logits)
  // 2 x the multiply-adds of a token through the layers' matrices, split by the arithmetic
  // their kernels use: f32 FMA for float weights, int8 dot products for quantised ones, bf16
  // dot products for BF16 weights where the build has them (kernels::bf16_dot_products()).
  double layer_flops_f32 = 0, layer_flops_int8 = 0, layer_flops_bf16 = 0;
  double output_flops = 0;
  bool output_int8 = false, output_bf16 = false;
  // Attention's multiply-adds per (token, context position), times 2: QK and PV over every
  // layer and query head.
  double attn_flops_per_pos = 0;
};
TokenCost token_cost(const Model& model);

// The fastest decode the memory allows, tokens/s: each token reads every matrix once and the
// K/V of its context (kv_bytes_per_token x the context, as dense attention reads it).
double decode_bound_tps(const TokenCost& c, double kv_bytes_per_token, double mean_context, double read_gbps);
// The fastest prefill of n_prompt tokens after `depth` cached ones the arithmetic allows,
// tokens/s: the layers' matrices at the peak of their kernels' arithmetic, causal attention
// (a token at position i attends i + 1 keys) at the f32 peak, and logits for the last token.
double prefill_bound_tps(const TokenCost& c, int64_t n_prompt, int64_t depth, const kernels::PeakOps& peak);

}  // namespace lc
