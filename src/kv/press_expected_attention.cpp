// Expected Attention — Devoto et al., "Expected Attention: KV Cache Compression by Estimating
// Attention from Future Queries Distribution", 2025 (kvpress ExpectedAttentionPress).
// Future queries are modelled as Gaussian, q ~ N(mu, Sigma) (pre-RoPE statistics of the
// observation queries), rotated by the mean RoPE rotation over the next n_future positions,
// R = mean_{p in [P, P + n_future)} R(p): mu' = R mu, Sigma' = R Sigma R^T. The expected
// (unnormalised) attention of key k_j is the Gaussian moment generating function:
//   z_j = scale * k_j^T mu' + scale^2 / 2 * k_j^T Sigma' k_j      (scale = 1/sqrt(d))
//   s_j = softmax_j(z) * (||v_j|| + epsilon)
// per query head; the framework reduces over the group (mean). n_sink = 4 by default.
// Sigma is the biased covariance (1/N over the N observation queries), as kvpress's einsum / N.
// Differences from the authors' code: the statistics come from the observation window the
// model keeps (obs=64 last queries), and the softmax runs over every held token (sinks
// included; they are protected anyway), and epsilon is added to ||v|| where kvpress adds it to
// the attention, (softmax + epsilon) * ||v|| (the same at the default epsilon = 0;
// docs/kv-press.md, "Differences from kvpress").
#include <fmt/format.h>

#include <cfloat>

#include "kv/press_impl.h"

namespace lc::press {
namespace {

class ExpectedAttention final : public PressScorer {
 public:
  ExpectedAttention(int64_t obs, int64_t n_future, bool cov, bool vnorm, double eps)
      : obs_(obs), n_future_(n_future), cov_(cov), vnorm_(vnorm), eps_(eps) {}
  std::string name() const override { return "expected_attention"; }
  std::string params() const override {
    return fmt::format("obs={},n_future={},cov={},vnorm={},epsilon={:g}", obs_, n_future_,
                       cov_ ? 1 : 0, vnorm_ ? 1 : 0, eps_);
  }
  int64_t n_obs() const override { return obs_; }
  int64_t default_window() const override { return 0; }
  int64_t default_sinks() const override { return 4; }

  Status score(const PressContext& c, int64_t il, const PressShape& s, PressScores& out) override {
    const int64_t d = s.head_dim, H = s.n_head, g = s.n_head / s.n_head_kv, dv = c.kv->head_dim_v();
    const RopeTable& rt = c.kv->rope(il);
    const int64_t half = rt.n_rot / 2;
    // Mean rotation over the next n_future positions, per pair: (cbar, sbar), mscale included
    // (the backend rotates queries with it).
    std::vector<double> cb(static_cast<size_t>(half)), sb(static_cast<size_t>(half));
    const int64_t p0 = c.n_obs > 0 ? static_cast<int64_t>(c.query_pos[c.n_obs - 1]) + 1 : c.kv->n_appended(il);
    for (int64_t i = 0; i < half; ++i) {
      double sc = 0, ss = 0;
      for (int64_t p = p0; p < p0 + n_future_; ++p) {
        const double a = static_cast<double>(p) * rt.inv_freq[static_cast<size_t>(i)];
        sc += std::cos(a), ss += std::sin(a);
      }
      cb[static_cast<size_t>(i)] = sc / static_cast<double>(n_future_) * rt.mscale;
      sb[static_cast<size_t>(i)] = ss / static_cast<double>(n_future_) * rt.mscale;
    }
    const double scale = attn_scale(s);
    out.by_query_head.resize(static_cast<size_t>(H));
    for_each_head(c, s.n_head_kv, [&](int64_t h) {
      std::vector<float> K, V;
      read_head_keys(*c.kv, il, h, K);
      const int64_t n = c.kv->n_tokens(il, h);
      std::vector<double> vn(static_cast<size_t>(n), 1.0), u(static_cast<size_t>(d)), z(static_cast<size_t>(n));
      if (vnorm_ && n > 0) {
        V.resize(static_cast<size_t>(n * dv));
        c.kv->read_values(il, h, 0, n, V.data());
        for (int64_t j = 0; j < n; ++j) {
          double a = 0;
          for (int64_t e = 0; e < dv; ++e) a += static_cast<double>(V[static_cast<size_t>(j * dv + e)]) * V[static_cast<size_t>(j * dv + e)];
          vn[static_cast<size_t>(j)] = std::sqrt(a) + eps_;
        }
      }
      std::vector<double> mu(static_cast<size_t>(d)), sig(static_cast<size_t>(d * d));
      for (int64_t hq = h * g; hq < (h + 1) * g; ++hq) {
        std::fill(mu.begin(), mu.end(), 0.0);
        std::fill(sig.begin(), sig.end(), 0.0);
        for (int64_t t = 0; t < c.n_obs; ++t)
          for (int64_t e = 0; e < d; ++e) mu[static_cast<size_t>(e)] += c.queries[(t * H + hq) * d + e];
        if (c.n_obs > 0)
          for (double& m : mu) m /= static_cast<double>(c.n_obs);
        if (cov_ && c.n_obs > 1) {
          for (int64_t t = 0; t < c.n_obs; ++t) {
            const float* q = c.queries + (t * H + hq) * d;
            for (int64_t a = 0; a < d; ++a)
              for (int64_t b = 0; b < d; ++b)
                sig[static_cast<size_t>(a * d + b)] += (q[a] - mu[static_cast<size_t>(a)]) * (q[b] - mu[static_cast<size_t>(b)]);
          }
          for (double& x : sig) x /= static_cast<double>(c.n_obs);  // biased, as kvpress
        }
        double mx = -DBL_MAX;
        for (int64_t j = 0; j < n; ++j) {
          // u = R^T k: then k^T (R mu) = u^T mu and k^T R Sigma R^T k = u^T Sigma u.
          const float* k = K.data() + j * d;
          for (int64_t e = 0; e < d; ++e) u[static_cast<size_t>(e)] = k[e];
          for (int64_t i = 0; i < half; ++i) {
            const int64_t a = rt.neox ? i : 2 * i, b = rt.neox ? i + half : 2 * i + 1;
            const double c0 = cb[static_cast<size_t>(i)], s0 = sb[static_cast<size_t>(i)];
            u[static_cast<size_t>(a)] = c0 * k[a] + s0 * k[b];
            u[static_cast<size_t>(b)] = -s0 * k[a] + c0 * k[b];
          }
          double lin = 0, quad = 0;
          for (int64_t e = 0; e < d; ++e) lin += u[static_cast<size_t>(e)] * mu[static_cast<size_t>(e)];
          if (cov_ && c.n_obs > 1)
            for (int64_t a = 0; a < d; ++a) {
              double r = 0;
              for (int64_t b = 0; b < d; ++b) r += sig[static_cast<size_t>(a * d + b)] * u[static_cast<size_t>(b)];
              quad += u[static_cast<size_t>(a)] * r;
            }
          z[static_cast<size_t>(j)] = scale * lin + 0.5 * scale * scale * quad;
          mx = std::max(mx, z[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += (z[static_cast<size_t>(j)] = std::exp(z[static_cast<size_t>(j)] - mx));
        auto& r = out.by_query_head[static_cast<size_t>(hq)];
        r.resize(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j)
          r[static_cast<size_t>(j)] = static_cast<float>(z[static_cast<size_t>(j)] / sum * vn[static_cast<size_t>(j)]);
      }
    });
    return ok_status();
  }

 private:
  int64_t obs_, n_future_;
  bool cov_, vnorm_;
  double eps_;
};

}  // namespace

Expected<std::unique_ptr<PressScorer>> make_expected_attention(Args& a, const PressShape&) {
  LC_ASSIGN_OR_RETURN(int64_t obs, a.integer("obs", 64, 1, 1 << 20,
                                             "last queries whose mean and covariance model the future queries, "
                                             "tokens"));
  LC_ASSIGN_OR_RETURN(int64_t nf, a.integer("n_future", 512, 1, 1 << 24,
                                            "future positions whose mean RoPE rotation is applied to the query "
                                            "statistics, tokens"));
  LC_ASSIGN_OR_RETURN(int64_t cov, a.integer("cov", 1, 0, 1,
                                             "1: include the covariance term scale^2/2 k^T Sigma k; 0: the mean "
                                             "query alone"));
  LC_ASSIGN_OR_RETURN(int64_t vnorm, a.integer("vnorm", 1, 0, 1,
                                               "1: multiply the expected attention by the norm of v + epsilon; 0: do not"));
  LC_ASSIGN_OR_RETURN(double eps, a.number("epsilon", 0, 0, 1e6, "added to the norm of v (vnorm=1)"));
  return std::unique_ptr<PressScorer>(std::make_unique<ExpectedAttention>(obs, nf, cov == 1, vnorm == 1, eps));
}

}  // namespace lc::press
