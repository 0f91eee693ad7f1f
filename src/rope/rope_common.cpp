// Formulas shared by several RoPE methods, and the argument store.
#include <algorithm>
#include <cmath>

#include "core/status.h"
#include "rope/rope_method.h"

namespace lc::rope_detail {

void RopeArgs::set(std::string key, std::string text, double value) {
  num_[key] = value;
  for (auto& kv : order_) {
    if (kv.first == key) {
      kv.second = std::move(text);
      return;
    }
  }
  order_.emplace_back(std::move(key), std::move(text));
}

double RopeArgs::real(std::string_view key) const {
  auto it = num_.find(key);
  LC_CHECK(it != num_.end());  // a method reads only the keys it declared
  return it->second;
}

int64_t RopeArgs::integer(std::string_view key) const {
  return static_cast<int64_t>(std::llround(real(key)));
}

const std::string& RopeArgs::text(std::string_view key) const {
  for (const auto& kv : order_)
    if (kv.first == key) return kv.second;
  LC_CHECK(false && "undeclared key");
  return order_.front().second;
}

std::string RopeArgs::canonical(std::string_view method) const {
  std::string s(method);
  for (size_t i = 0; i < order_.size(); ++i) {
    s += i == 0 ? ":" : ",";
    s += order_[i].first + "=" + order_[i].second;
  }
  return s;
}

std::vector<double> plain_theta(int64_t n_rot, double base) {
  std::vector<double> theta(static_cast<size_t>(n_rot / 2));
  for (size_t i = 0; i < theta.size(); ++i)
    theta[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
  return theta;
}

RopeTable make_table(const std::vector<double>& theta, double mscale, const RopeModelInfo& info) {
  RopeTable t;
  t.n_rot = info.gguf.n_rot;
  t.neox = info.gguf.neox;
  t.mscale = static_cast<float>(mscale);
  t.inv_freq.resize(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) t.inv_freq[i] = static_cast<float>(theta[i]);
  return t;
}

std::pair<double, double> yarn_corr_range(int64_t n_rot, int64_t l0, double base,
                                          double beta_fast, double beta_slow) {
  // Solving l0 / λ_i = beta for i with λ_i = 2π base^(2i/d) gives
  // i = d ln(l0 / (2π beta)) / (2 ln base): a pair index, as in the YaRN reference code.
  const double d = static_cast<double>(n_rot);
  auto corr_dim = [&](double beta) {
    return d * std::log(static_cast<double>(l0) / (beta * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr_dim(beta_fast)));
  const double high = std::min(d - 1.0, std::ceil(corr_dim(beta_slow)));
  return {low, high};
}

double yarn_mscale(double s) { return s <= 1.0 ? 1.0 : 0.1 * std::log(s) + 1.0; }

}  // namespace lc::rope_detail
