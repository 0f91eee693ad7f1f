// TOVA — Oren et al., "Transformers are Multi-State RNNs", 2024 (Token Omission Via Attention).
// The current (last) query decides: the model's observation window holds the queries of the
// tokens it appended last, so this is the real last query (of the prompt after prefill, of the
// newest generated token when compressing while decoding), never a draft's lookahead query; its attention is averaged over ALL query heads of the
// layer, so every KV head of a layer ranks tokens the same way:
//   s_j = (1/H) sum_{h < H} softmax_j(q_last,h . k_j * scale)
// Heads may hold different tokens (after a head-wise press): the average is taken per
// sequence index, a head that no longer holds a token adding 0 for it. The paper evicts one
// token per step; evicting the lowest n at once is kvpress's TOVAPress.
#include "kv/press_impl.h"

namespace lc::press {
namespace {

class Tova final : public PressScorer {
 public:
  std::string name() const override { return "tova"; }
  int64_t n_obs() const override { return 1; }
  int64_t default_window() const override { return 1; }
  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    out.by_kv_head.resize(static_cast<size_t>(s.n_head_kv));
    if (c.n_obs == 0) {  // no query: nothing to rank by, keep the most recent
      for (int64_t h = 0; h < s.n_head_kv; ++h) {
        const int32_t* idx = c.kv->seq_index(il, h);
        out.by_kv_head[static_cast<size_t>(h)].assign(idx, idx + c.kv->n_tokens(il, h));
      }
      return ok_status();
    }
    PressContext last = c;  // only the last query
    last.queries = c.queries + (c.n_obs - 1) * s.n_head * s.head_dim;
    last.query_pos = c.query_pos + (c.n_obs - 1);
    last.query_seq = c.query_seq ? c.query_seq + (c.n_obs - 1) : nullptr;
    last.n_obs = 1;
    std::vector<float> qr;
    rotate_queries(last, il, s, qr);
    const int64_t g = s.n_head / s.n_head_kv, n_seq = c.kv->n_appended(il);
    std::vector<double> sum(static_cast<size_t>(n_seq), 0.0);
    std::vector<float> K, P;
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      read_head_keys(*c.kv, il, h, K);
      const int64_t n = c.kv->n_tokens(il, h);
      const int32_t* idx = c.kv->seq_index(il, h);
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
        window_probs(last, il, s, qr.data(), hq, K.data(), n, P);
        for (int64_t j = 0; j < n; ++j) sum[static_cast<size_t>(idx[j])] += P[static_cast<size_t>(j)];
      }
    }
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      const int32_t* idx = c.kv->seq_index(il, h);
      auto& r = out.by_kv_head[static_cast<size_t>(h)];
      r.resize(static_cast<size_t>(c.kv->n_tokens(il, h)));
      for (size_t j = 0; j < r.size(); ++j)
        r[j] = static_cast<float>(sum[static_cast<size_t>(idx[j])] / static_cast<double>(s.n_head));
    }
    return ok_status();
  }
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_tova(Args&, const PressShape&) {
  return std::unique_ptr<PressScorer>(std::make_unique<Tova>());
}

}  // namespace lc::press
