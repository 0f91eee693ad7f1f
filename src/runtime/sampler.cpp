#include "runtime/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace lc {

Status validate(const SamplerParams& p) {
  if (!std::isfinite(p.temp) || p.temp < 0) return make_error("--temp must be a finite value >= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) return make_error("--top-p must be in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p < 1)) return make_error("--min-p must be in [0, 1)");
  if (!std::isfinite(p.repeat_penalty) || p.repeat_penalty <= 0)
    return make_error("--repeat-penalty must be a finite value > 0");
  if (p.repeat_last_n < 0) return make_error("--repeat-last-n must be >= 0");
  if (!std::isfinite(p.presence_penalty) || std::fabs(p.presence_penalty) > 2)
    return make_error("presence_penalty must be in [-2, 2]");
  if (!std::isfinite(p.frequency_penalty) || std::fabs(p.frequency_penalty) > 2)
    return make_error("frequency_penalty must be in [-2, 2]");
  for (const auto& [id, b] : p.logit_bias) {
    if (id < 0) return make_error(fmt::format("logit bias: token id {} is negative", id));
    if (!(b == -std::numeric_limits<float>::infinity() || (std::isfinite(b) && std::fabs(b) <= 100)))
      return make_error(fmt::format("logit bias of token {}: {} is not in [-100, 100] (or -inf to ban it)", id, b));
  }
  return ok_status();
}

Status check_logit_bias_vocab(const SamplerParams& p, int32_t n_vocab) {
  for (const auto& [id, b] : p.logit_bias)
    if (id >= n_vocab)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("logit bias: token id {} is not in the vocabulary (ids 0 to {})", id, n_vocab - 1));
  return ok_status();
}

Expected<std::pair<int32_t, float>> parse_logit_bias(std::string_view text) {
  const size_t sign = text.find_first_of("+-", 1);
  auto bad = [&] {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--logit-bias '{}': expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 2-inf)",
                                  text));
  };
  if (sign == std::string_view::npos || sign == 0) return bad();
  const std::string id_text(text.substr(0, sign)), bias_text(text.substr(sign + 1));
  if (id_text.find_first_not_of("0123456789") != std::string::npos || id_text.size() > 9 || bias_text.empty())
    return bad();
  float bias = 0;
  if (bias_text == "inf") {
    bias = std::numeric_limits<float>::infinity();
  } else {
    size_t used = 0;
    try {
      bias = std::stof(bias_text, &used);
    } catch (const std::exception&) {
      return bad();
    }
    if (used != bias_text.size() || !std::isfinite(bias) || bias_text[0] == '+' || bias_text[0] == '-') return bad();
  }
  if (text[sign] == '-') bias = -bias;
  if (bias == std::numeric_limits<float>::infinity())
    return make_error(ErrorCode::kInvalidArgument, fmt::format("--logit-bias '{}': +inf is not a bias (use a "
                                                               "bias of at most 100)", text));
  if (std::fabs(bias) > 100 && bias != -std::numeric_limits<float>::infinity())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--logit-bias '{}': the bias must be in [-100, 100] (or -inf to ban the token)", text));
  return std::pair<int32_t, float>{std::stoi(id_text), bias};
}

int32_t argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int32_t n_vocab, std::span<const int32_t> history) {
  cands_.resize(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) cands_[static_cast<size_t>(i)] = {i, logits[i]};
  for (const auto& [id, b] : p_.logit_bias)
    if (id >= 0 && id < n_vocab) cands_[static_cast<size_t>(id)].logit += b;

  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n > 0 && !history.empty()) {
    const size_t n = std::min(history.size(), static_cast<size_t>(p_.repeat_last_n));
    // Each distinct recent token is penalised once, however often it occurred.
    std::unordered_set<int32_t> seen(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n_vocab) continue;
      float& l = cands_[static_cast<size_t>(id)].logit;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
  }

  if ((p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) && p_.repeat_last_n > 0 && !history.empty()) {
    const size_t n = std::min(history.size(), static_cast<size_t>(p_.repeat_last_n));
    std::unordered_map<int32_t, int> count;
    for (size_t i = history.size() - n; i < history.size(); ++i) ++count[history[i]];
    for (const auto& [id, c] : count) {
      if (id < 0 || id >= n_vocab) continue;
      cands_[static_cast<size_t>(id)].logit -= static_cast<float>(c) * p_.frequency_penalty + p_.presence_penalty;
    }
  }

  if (p_.temp <= 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i)
      if (cands_[static_cast<size_t>(i)].logit > cands_[static_cast<size_t>(best)].logit) best = i;
    return best;
  }

  auto by_logit = [](const Cand& a, const Cand& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = cands_.size();
  // Every token banned: the lowest id (no distribution is left to draw from).
  if (!p_.logit_bias.empty() && std::all_of(cands_.begin(), cands_.end(),
                  [](const Cand& c) { return c.logit == -std::numeric_limits<float>::infinity(); }))
    return 0;
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    n = static_cast<size_t>(p_.top_k);
    std::partial_sort(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(n), cands_.end(), by_logit);
  } else {
    std::sort(cands_.begin(), cands_.end(), by_logit);
  }
  // Softmax over the survivors (at temperature 1, as the filters in llama.cpp see them).
  auto softmax = [&](size_t count, float temp) {
    probs_.resize(count);
    const float mx = cands_[0].logit;
    double sum = 0;
    for (size_t i = 0; i < count; ++i) sum += (probs_[i] = std::exp((cands_[i].logit - mx) / temp));
    for (size_t i = 0; i < count; ++i) probs_[i] = static_cast<float>(probs_[i] / sum);
  };
  if (p_.top_p < 1.0f) {
    softmax(n, 1.0f);
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += probs_[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<size_t>(1, keep);
  }
  if (p_.min_p > 0.0f) {
    softmax(n, 1.0f);
    const float thr = probs_[0] * p_.min_p;
    size_t keep = 1;
    while (keep < n && probs_[keep] >= thr) ++keep;
    n = keep;
  }
  softmax(n, p_.temp);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double r = u(rng_), cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += probs_[i];
    if (r < cum) return cands_[i].id;
  }
  return cands_[n - 1].id;
}

}  // namespace lc
