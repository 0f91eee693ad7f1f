#include "runtime/measure.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/progress.h"
#include "core/sys.h"
#include "kernels/matmul_config.h"

namespace lc {

Expected<PerplexityResult> perplexity(Context& ctx, const std::vector<int32_t>& tokens, int64_t n_ctx,
                                      const std::function<void(int64_t, double)>& on_chunk) {
  const Tokenizer& tok = ctx.model().tokenizer();
  if (n_ctx < 4) return make_error("perplexity: context must be at least 4 tokens");
  if (n_ctx > ctx.n_ctx()) {
    return make_error(fmt::format("perplexity: chunk size {} exceeds the context size {}",
                                  n_ctx, ctx.n_ctx()));
  }
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  if (n_tok < 2 * n_ctx) {
    return make_error(fmt::format("perplexity: the text has {} tokens, need at least 2 * {} = {} "
                                  "(use a longer text or a smaller -c)",
                                  n_tok, n_ctx, 2 * n_ctx));
  }
  PerplexityResult r;
  r.n_chunks = n_tok / n_ctx;
  const int64_t first = n_ctx / 2;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  double nll = 0, nll2 = 0;
  for (int64_t c = 0; c < r.n_chunks; ++c) {
    std::copy(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx, chunk.begin());
    if (tok.add_bos() && tok.bos() >= 0) chunk[0] = tok.bos();
    ctx.clear();
    LC_TRY(ctx.decode(chunk, Logits::kAll));
    const int32_t n_vocab = tok.n_vocab();
    for (int64_t i = first; i < n_ctx - 1; ++i) {
      const float* lg = ctx.logits(i);
      double mx = lg[0];
      for (int32_t j = 1; j < n_vocab; ++j) mx = std::max<double>(mx, lg[j]);
      double sum = 0;
      for (int32_t j = 0; j < n_vocab; ++j) sum += std::exp(static_cast<double>(lg[j]) - mx);
      const double v = -(static_cast<double>(lg[chunk[static_cast<size_t>(i + 1)]]) - mx - std::log(sum));
      r.nll.push_back(v);
      nll += v;
      nll2 += v * v;
    }
    r.n_scored = static_cast<int64_t>(r.nll.size());
    r.chunk_ppl.push_back(std::exp(nll / static_cast<double>(r.n_scored)));
    if (on_chunk) on_chunk(c, r.chunk_ppl.back());
  }
  ctx.clear();
  const double n = static_cast<double>(r.n_scored);
  r.nll_sum = nll;
  const double mean = nll / n;
  r.ppl = std::exp(mean);
  const double var = nll2 / n - mean * mean;
  r.ppl_err = n > 1 && var > 0 ? std::sqrt(var / (n - 1)) * r.ppl : 0.0;
  return r;
}

double SpeedTest::mean() const {
  if (tps.empty()) return 0;
  double s = 0;
  for (double x : tps) s += x;
  return s / static_cast<double>(tps.size());
}

double SpeedTest::stddev() const {
  if (tps.size() < 2) return 0;
  const double m = mean();
  double s = 0;
  for (double x : tps) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(tps.size() - 1));
}

Status bench_fill(Context& ctx, int64_t depth, const std::string& fill_attn, uint64_t seed) {
  // Deeper than before and every token still cached (no backend or press evicted any): only
  // the difference is appended. Otherwise the fill starts over.
  const KvCache& kv = ctx.kv();
  bool intact = ctx.n_past() <= depth;
  for (int64_t il = 0; intact && il < kv.config().n_layer; ++il)
    for (int64_t h = 0; intact && h < kv.config().n_head_kv; ++h) intact = kv.n_tokens(il, h) == ctx.n_past();
  if (!intact) ctx.clear();
  if (depth <= 0) return ok_status();
  if (depth > ctx.n_ctx())
    return make_error(fmt::format("bench: depth {} exceeds the context size {} (raise --ctx-size)",
                                  depth, ctx.n_ctx()));
  const uint64_t n_vocab = static_cast<uint64_t>(ctx.model().tokenizer().n_vocab());
  // Token i depends on (seed, i) only, so extending a fill gives the tokens a fill to the
  // full depth would have had.
  auto token_at = [&](uint64_t i) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<int32_t>((z ^ (z >> 31)) % n_vocab);
  };
  std::vector<int32_t> toks(static_cast<size_t>(std::min(depth, ctx.n_batch())));
  const std::string own = ctx.attention().spec();
  if (!fill_attn.empty()) LC_TRY(ctx.set_attention(fill_attn));
  Progress prog("bench: filling the cache", depth);
  Status st = ok_status();
  for (int64_t done = ctx.n_past(); done < depth && st.is_ok();) {
    const int64_t n = std::min<int64_t>(depth - done, static_cast<int64_t>(toks.size()));
    for (int64_t i = 0; i < n; ++i) toks[static_cast<size_t>(i)] = token_at(static_cast<uint64_t>(done + i));
    prog.update(done);
    st = ctx.decode(std::span<const int32_t>(toks.data(), static_cast<size_t>(n)), Logits::kNone);
    done += n;
  }
  prog.finish();
  if (!fill_attn.empty()) LC_TRY(ctx.set_attention(own));  // also after an error
  return st;
}

Expected<SpeedTest> bench_speed(Context& ctx, int64_t n_prompt, int64_t n_gen, int reps, bool warmup,
                                uint64_t seed) {
  SpeedTest st;
  const int64_t depth = ctx.n_past();
  st.n_prompt = n_prompt;
  st.n_gen = n_gen;
  st.depth = depth;
  st.name = n_prompt > 0 ? fmt::format("pp{}", n_prompt) : fmt::format("tg{}", n_gen);
  if (depth > 0) st.name += fmt::format(" @ d{}", depth);
  if (depth + n_prompt + n_gen > ctx.n_ctx()) {
    return make_error(fmt::format("bench: depth {} + {} tokens exceed the context size {} (raise --ctx-size)",
                                  depth, n_prompt + n_gen, ctx.n_ctx()));
  }
  const int32_t n_vocab = ctx.model().tokenizer().n_vocab();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  std::vector<int32_t> toks(static_cast<size_t>(std::max<int64_t>(n_prompt, 1)));
  ThreadPool& pool = ctx.pool();
  struct TimingOff {  // also on an error return
    ThreadPool& p;
    ~TimingOff() { p.set_timing(false); }
  } timing_off{pool};
  for (int r = warmup ? -1 : 0; r < reps; ++r) {
    ctx.truncate(depth);
    pool.reset_stats();
    pool.set_timing(r >= 0);
    double t0 = now_seconds();
    if (n_prompt > 0) {
      for (auto& t : toks) t = pick(rng);
      LC_TRY(ctx.decode(std::span<const int32_t>(toks.data(), static_cast<size_t>(n_prompt)), Logits::kLast));
    } else {
      for (int64_t i = 0; i < n_gen; ++i) {
        const int32_t id = pick(rng);
        LC_TRY(ctx.decode(std::span<const int32_t>(&id, 1), Logits::kLast));
      }
    }
    const double dt = now_seconds() - t0;
    pool.set_timing(false);
    if (r >= 0) {
      st.tps.push_back(static_cast<double>(n_prompt > 0 ? n_prompt : n_gen) / dt);
      st.pool += pool.stats();
      st.timed_s += dt;
    }
  }
  ctx.truncate(depth);
  return st;
}

namespace {
bool int8_kernel(DType t) { return t != DType::F32 && t != DType::F16 && t != DType::BF16; }
bool bf16_kernel(DType t) { return t == DType::BF16 && kernels::bf16_dot_products(); }
}  // namespace

TokenCost token_cost(const Model& model) {
  TokenCost c;
  auto add = [&](const TensorView& w) {
    const double flops = 2.0 * static_cast<double>(w.ne[0]) * static_cast<double>(w.n_rows());
    c.layer_bytes += static_cast<double>(w.row_size()) * static_cast<double>(w.n_rows());
    (int8_kernel(w.type) ? c.layer_flops_int8 : bf16_kernel(w.type) ? c.layer_flops_bf16 : c.layer_flops_f32) += flops;
  };
  for (const LayerWeights& L : model.layers())
    for (const TensorView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) add(*w);
  const TensorView& o = model.output();
  c.output_bytes = static_cast<double>(o.row_size()) * static_cast<double>(o.n_rows());
  c.output_flops = 2.0 * static_cast<double>(o.ne[0]) * static_cast<double>(o.n_rows());
  c.output_int8 = int8_kernel(o.type);
  c.output_bf16 = bf16_kernel(o.type);
  const HParams& hp = model.hparams();
  c.attn_flops_per_pos = 2.0 * static_cast<double>(hp.n_layer * hp.n_head * (hp.head_dim + hp.head_dim_v));
  return c;
}

double decode_bound_tps(const TokenCost& c, double kv_bytes_per_token, double mean_context, double read_gbps) {
  const double bytes = c.layer_bytes + c.output_bytes + kv_bytes_per_token * mean_context;
  return bytes > 0 ? read_gbps * 1e9 / bytes : 0;
}

double prefill_bound_tps(const TokenCost& c, int64_t n_prompt, int64_t depth, const kernels::PeakOps& peak) {
  if (n_prompt <= 0 || peak.f32_gflops <= 0 || peak.int8_gops <= 0) return 0;
  if ((c.layer_flops_bf16 > 0 || c.output_bf16) && peak.bf16_gflops <= 0) return 0;
  const double f32 = peak.f32_gflops * 1e9, i8 = peak.int8_gops * 1e9, bf = peak.bf16_gflops * 1e9;
  const double n = static_cast<double>(n_prompt);
  // Keys attended by the prompt: sum over i < n of depth + i + 1.
  const double keys = n * static_cast<double>(depth) + n * (n + 1) / 2;
  const double seconds = n * (c.layer_flops_f32 / f32 + c.layer_flops_int8 / i8 + (bf > 0 ? c.layer_flops_bf16 / bf : 0)) +
                         keys * c.attn_flops_per_pos / f32 +
                         c.output_flops / (c.output_int8 ? i8 : c.output_bf16 ? bf : f32);
  return n / seconds;
}

}  // namespace lc
