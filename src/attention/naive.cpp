// Naive attention: the oracle. softmax(q.K^T * scale) V with every score of a row materialised
// and accumulated in double, over exactly the tokens the cache holds for the query's KV head
// (causal within the chunk). Slow on purpose; tests only.
#include <cmath>
#include <vector>

#include "attention/methods.h"
#include "kernels/kernels.h"

namespace lc {
namespace {

class NaiveBackend final : public AttentionBackend {
 public:
  explicit NaiveBackend(const AttnShape& s) : AttentionBackend(s) {}
  std::string spec() const override { return "naive"; }
  AttentionCaps caps() const override { return exact_caps(); }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    LC_TRY(check_call(il, n, kv));
    const int64_t H = shape_.n_head, Hkv = shape_.n_head_kv, d = shape_.head_dim, dv = shape_.head_dim_v;
    const int64_t g = H / Hkv;
    std::vector<float> qr(q, q + n * H * d);
    const RopeTable& rt = kv.rope(il);
    if (rt.n_rot > 0) rt.apply(qr.data(), n, H, d, pos);
    if (record_) {
      selection_ = Selection{il, n, H, {}};
      selection_.keys.assign(static_cast<size_t>(n * H), {});
    }
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      const int64_t N = kv.n_tokens(il, hk);
      std::vector<float> K(static_cast<size_t>(N * d)), V(static_cast<size_t>(N * dv));
      kv.read_keys(il, hk, 0, N, K.data());
      kv.read_values(il, hk, 0, N, V.data());
      std::vector<double> sc(static_cast<size_t>(N));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t vis = N - n + t + 1;
        for (int64_t h = hk * g; h < (hk + 1) * g; ++h) {
          const float* qh = qr.data() + (t * H + h) * d;
          double mx = -INFINITY;
          for (int64_t j = 0; j < vis; ++j) {
            double a = 0;
            for (int64_t c = 0; c < d; ++c) a += static_cast<double>(qh[c]) * K[static_cast<size_t>(j * d + c)];
            sc[static_cast<size_t>(j)] = a * shape_.scale;
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          double sum = 0;
          for (int64_t j = 0; j < vis; ++j) sum += (sc[static_cast<size_t>(j)] = std::exp(sc[static_cast<size_t>(j)] - mx));
          float* o = out + (t * H + h) * dv;
          for (int64_t c = 0; c < dv; ++c) {
            double a = 0;
            for (int64_t j = 0; j < vis; ++j) a += sc[static_cast<size_t>(j)] * V[static_cast<size_t>(j * dv + c)];
            o[c] = static_cast<float>(a / sum);
          }
          if (record_) {
            auto& rec = selection_.keys[static_cast<size_t>(t * H + h)];
            for (int64_t j = 0; j < vis; ++j)
              rec.push_back(SelectedKey{kv.seq_index(il, hk)[j], pos[t], kv.positions(il, hk)[j]});
          }
        }
      }
    }
    return ok_status();
  }
};

}  // namespace

Expected<std::unique_ptr<AttentionBackend>> make_naive(MethodSpec& spec, const AttnShape& s) {
  LC_TRY(spec.finish());
  return std::unique_ptr<AttentionBackend>(new NaiveBackend(s));
}

}  // namespace lc
