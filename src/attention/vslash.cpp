// Vertical-slash sparse prefill: MInference's pattern (Jiang et al. 2024, "MInference 1.0:
// Accelerating Pre-filling for Long-Context LLMs via Dynamic Sparse Attention", NeurIPS 2024)
// configured as SpecKV's code runs it for its prefill (Galim et al., "Draft-based Approximate
// Inference for LLMs", arXiv 2506.08373; furiosa-ai/draft-based-approx-llm, speckv/util.py
// compress_kv and llama_util.py):
//   * it applies to a call that holds the whole sequence (a prompt evaluated in one chunk, no
//     past tokens) of more than vertical + slash tokens; every other call is dense (decoding,
//     later turns, shorter prompts), as in the authors' code;
//   * vertical tokens, per KV head: the `vertical` tokens before the scoring window (the call's
//     last `obs` queries) with the highest score, where the score is the window queries' softmax
//     over every key (causal inside the window), kept for the tokens before the window, reduced
//     over the group's query heads and the window's queries together (max, or mean), then pooled
//     along the sequence (max, or avg with zeros counted; `kernel`, padding kernel / 2); ties go
//     to the lower token;
//   * slash diagonals at offsets slash, slash - 64, ..., 0 from the main diagonal, which
//     MInference's index conversion (convert_vertical_slash_indexes, 64 x 64 blocks) merges into
//     one band: the queries of the 64-token block ending at e attend keys
//     [max(0, e - 64 - slash), e) (causal), and the vertical tokens before that band.
// SpecKV runs it with the draft's answer after the prompt (the window is the last 33 prompt
// tokens and the answer); on its own the window is the call's last `obs` queries.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "attention/methods.h"
#include "kernels/kernels.h"

namespace lc {
namespace {

constexpr int64_t kBlockM = 64;  // MInference's block of queries (and keys)

class VslashBackend final : public ExecBackend {
 public:
  VslashBackend(const AttnShape& s, int64_t vertical, int64_t slash, int64_t obs, int64_t kernel, bool max_pool,
                bool max_reduce, int64_t split)
      : ExecBackend(s), vertical_(vertical), slash_(slash), obs_(obs), kernel_(kernel), max_pool_(max_pool),
        max_reduce_(max_reduce) {
    split_ = split;
  }

  std::string spec() const override {
    std::string s = fmt::format("vslash:vertical={},slash={},obs={},kernel={},pool={},reduce={}", vertical_, slash_,
                                obs_, kernel_, max_pool_ ? "max" : "avg", max_reduce_ ? "max" : "mean");
    if (split_ != kDefaultSplit) s += fmt::format(",split={}", split_);
    return s;
  }

  AttentionCaps caps() const override { return AttentionCaps{spec()}; }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    const int64_t Hkv = shape_.n_head_kv, N = kv.n_tokens(il, 0);
    for (int64_t h = 1; h < Hkv; ++h)
      if (kv.n_tokens(il, h) != N)
        return make_error("vslash: the KV heads of a layer must hold the same tokens");
    if (n != N || N <= vertical_ + slash_) {
      run_dense(ctx, pool);
      return ok_status();
    }
    const int64_t W = std::min(obs_, n);
    verticals_.assign(static_cast<size_t>(Hkv), {});
    pool.parallel_for(Hkv, [&](int64_t b, int64_t e, int) {
      for (int64_t hk = b; hk < e; ++hk) choose_verticals(ctx, kv, il, hk, W, verticals_[static_cast<size_t>(hk)]);
    });
    // Items never cross a 64-token block, so all rows of one share the band's start.
    const std::vector<attn::Item> items = attn::make_items(ctx, kBlockM);
    const int64_t B = kv.block_tokens();
    spans_.resize(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const attn::Item& it = items[i];
      const int64_t e = (it.t0 / kBlockM + 1) * kBlockM, band = std::max<int64_t>(0, e - kBlockM - slash_);
      auto& sp = spans_[i];
      sp.clear();
      const std::vector<int32_t>& v = verticals_[static_cast<size_t>(it.hk)];
      for (size_t a = 0; a < v.size() && v[a] < band;) {  // runs of consecutive vertical tokens
        size_t z = a + 1;
        while (z < v.size() && v[z] < band && v[z] == v[z - 1] + 1) ++z;
        attn::add_spans(sp, v[a], static_cast<int64_t>(z - a), B);
        a = z;
      }
      attn::add_spans(sp, band, it.t0 + it.nt - band, B);  // causality clips the earlier rows
    }
    run_spans(ctx, items, spans_, pool);
    return ok_status();
  }

 private:
  // The vertical tokens of KV head hk (ascending), from the window of the last W queries.
  void choose_verticals(const attn::ExecCtx& ctx, const KvCache& kv, int64_t il, int64_t hk, int64_t W,
                        std::vector<int32_t>& out) const {
    const int64_t H = shape_.n_head, d = shape_.head_dim, g = H / shape_.n_head_kv, n = ctx.n;
    const int64_t n_pre = n - W, rows = g * W;
    constexpr int64_t kKeys = 1024;
    std::vector<float> kbuf(static_cast<size_t>(kKeys * d)), sc(static_cast<size_t>(kKeys));
    std::vector<float> mx(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
    std::vector<double> sum(static_cast<size_t>(rows), 0.0);
    std::vector<float> agg(static_cast<size_t>(n_pre), 0.0f);
    auto qrow = [&](int64_t r) {  // row r: window query t, head hk * g + u (prepared: rotated, scaled)
      const int64_t t = n_pre + r / g, u = r % g;
      return ctx.var[0].q + (t * H + hk * g + u) * d;
    };
    // Two passes over the keys in blocks: each row's log-sum-exp, then its probabilities.
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
        const int64_t nk = std::min(kKeys, n - j0);
        if (pass == 1 && j0 >= n_pre) break;  // only the tokens before the window are scored
        kv.read_keys(il, hk, j0, nk, kbuf.data());
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = n_pre + r / g, vis = std::min(nk, t + 1 - j0);  // causal
          if (vis <= 0) continue;
          kernels::dot_rows_f32(qrow(r), kbuf.data(), vis, d, sc.data());
          if (pass == 0) {
            const float m = *std::max_element(sc.begin(), sc.begin() + vis);
            const float m2 = std::max(mx[static_cast<size_t>(r)], m);
            double s = sum[static_cast<size_t>(r)] * std::exp(static_cast<double>(mx[static_cast<size_t>(r)]) - m2);
            for (int64_t j = 0; j < vis; ++j) s += std::exp(static_cast<double>(sc[static_cast<size_t>(j)]) - m2);
            sum[static_cast<size_t>(r)] = s;
            mx[static_cast<size_t>(r)] = m2;
          } else {
            const double lse = mx[static_cast<size_t>(r)] + std::log(sum[static_cast<size_t>(r)]);
            const int64_t m = std::min(vis, n_pre - j0);
            for (int64_t j = 0; j < m; ++j) {
              const float p = static_cast<float>(std::exp(static_cast<double>(sc[static_cast<size_t>(j)]) - lse));
              float& a = agg[static_cast<size_t>(j0 + j)];
              a = max_reduce_ ? std::max(a, p) : a + p;
            }
          }
        }
      }
    }
    if (!max_reduce_)
      for (float& a : agg) a /= static_cast<float>(rows);
    // Pooled along the sequence (zero padding; probabilities are >= 0, so 0 is also the
    // max-pool identity), then the top `vertical`, ties to the lower token.
    std::vector<float> pooled(static_cast<size_t>(n_pre));
    kernels::pool_seq(agg.data(), n_pre, kernel_, max_pool_, 1.0f, pooled.data());
    const int64_t k = std::min(vertical_, n_pre);
    out.resize(static_cast<size_t>(n_pre));
    std::iota(out.begin(), out.end(), 0);
    std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](int32_t a, int32_t b) {
      return pooled[static_cast<size_t>(a)] > pooled[static_cast<size_t>(b)] ||
             (pooled[static_cast<size_t>(a)] == pooled[static_cast<size_t>(b)] && a < b);
    });
    out.resize(static_cast<size_t>(k));
    std::sort(out.begin(), out.end());
  }

  int64_t vertical_, slash_, obs_, kernel_;
  bool max_pool_, max_reduce_;
  std::vector<std::vector<int32_t>> verticals_;  // [n_head_kv] of the last sparse call
  std::vector<std::vector<attn::Span>> spans_;   // [items]
};

}  // namespace

Expected<BackendPtr> make_vslash(MethodSpec& spec, const AttnShape& s) {
  int64_t vertical = 2048, slash = 2048, obs = 64, kernel = 7;
  LC_TRY(spec.get_int("vertical", &vertical, 1, int64_t{1} << 30,
                      "tokens every query of a sparse call reads besides its band, chosen per KV head by the "
                      "window's attention (SpecKV's prefill_vertical_size), tokens"));
  LC_TRY(spec.get_int("slash", &slash, 0, int64_t{1} << 30,
                      "the largest diagonal offset (a multiple of 64; SpecKV's prefill_window_size): a query reads "
                      "the keys from 64 + slash before the end of its 64-token block, tokens"));
  if (slash % kBlockM != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("vslash: slash={} is not a multiple of {} (the diagonals are {} apart)", slash,
                                  kBlockM, kBlockM));
  LC_TRY(spec.get_int("obs", &obs, 1, 1 << 20,
                      "the call's last queries whose attention chooses the vertical tokens (the window), tokens"));
  LC_TRY(spec.get_int("kernel", &kernel, 1, 1025, "pooling size of the window's attention along the sequence (odd)"));
  if (kernel % 2 == 0)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("vslash: kernel={}: expected an odd size", kernel));
  std::string pool = "max", reduce = "max";
  LC_TRY(spec.get_string("pool", &pool, "max or avg pooling of the window's attention"));
  LC_TRY(spec.get_string("reduce", &reduce,
                         "max or mean of the attention over the group's query heads and the window's queries"));
  if (pool != "max" && pool != "avg")
    return make_error(ErrorCode::kInvalidArgument, fmt::format("vslash: pool must be max or avg, not '{}'", pool));
  if (reduce != "max" && reduce != "mean")
    return make_error(ErrorCode::kInvalidArgument, fmt::format("vslash: reduce must be max or mean, not '{}'", reduce));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  LC_TRY(spec.finish());
  return BackendPtr(new VslashBackend(s, vertical, slash, obs, kernel, pool == "max", reduce == "max", split));
}

}  // namespace lc
