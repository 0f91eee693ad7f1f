#include "model/hparams.h"

#include <fmt/format.h>

#include <cmath>

namespace lc {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kLlama: return "llama";
    case Arch::kQwen2: return "qwen2";
    case Arch::kQwen3: return "qwen3";
  }
  return "?";
}

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone: return "none";
    case RopeScalingType::kLinear: return "linear";
    case RopeScalingType::kYarn: return "yarn";
  }
  return "?";
}

Expected<HParams> read_hparams(const gguf::File& f) {
  HParams hp;
  LC_ASSIGN_OR_RETURN(hp.arch_str, f.get_string("general.architecture"));
  if (hp.arch_str == "llama") {
    hp.arch = Arch::kLlama;
  } else if (hp.arch_str == "qwen2") {
    hp.arch = Arch::kQwen2;
  } else if (hp.arch_str == "qwen3") {
    hp.arch = Arch::kQwen3;
  } else {
    return make_error(fmt::format("{}: unsupported architecture '{}' (supported: llama, qwen2, qwen3)",
                                  f.path(), hp.arch_str));
  }
  const std::string a = hp.arch_str + ".";
  auto u32 = [&](const char* k) { return f.get_u32(a + k); };
  LC_ASSIGN_OR_RETURN(hp.n_embd, u32("embedding_length"));
  LC_ASSIGN_OR_RETURN(hp.n_layer, u32("block_count"));
  LC_ASSIGN_OR_RETURN(hp.n_ff, u32("feed_forward_length"));
  LC_ASSIGN_OR_RETURN(hp.n_head, u32("attention.head_count"));
  LC_ASSIGN_OR_RETURN(hp.n_ctx_train, f.get_u32_or(a + "context_length", 0));
  LC_ASSIGN_OR_RETURN(uint32_t n_head_kv, f.get_u32_or(a + "attention.head_count_kv",
                                                       static_cast<uint32_t>(hp.n_head)));
  hp.n_head_kv = n_head_kv;
  // Written by `longctx train --fixed-distance` (attention `fixed`); other tools ignore it.
  LC_ASSIGN_OR_RETURN(uint32_t fixed_distance, f.get_u32_or("longctx.attention.fixed_distance", 0));
  hp.fixed_distance = fixed_distance;
  LC_ASSIGN_OR_RETURN(uint32_t logn_orig, f.get_u32_or("longctx.attention.logn_orig", 0));
  hp.logn_orig = logn_orig;
  auto bad = [&](const char* what) {
    return make_error(fmt::format("{}: invalid hyper-parameters: {}", f.path(), what));
  };
  if (hp.n_embd <= 0 || hp.n_embd > (1 << 16)) return bad("embedding_length out of range");
  if (hp.n_layer <= 0 || hp.n_layer > 1024) return bad("block_count out of range");
  if (hp.n_head <= 0 || hp.n_head > 1024) return bad("head_count out of range");
  if (hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
    return bad("head_count must be a positive multiple of head_count_kv");
  if (hp.n_ff <= 0 || hp.n_ff > (1 << 20)) return bad("feed_forward_length out of range");
  if (hp.fixed_distance > (1 << 30)) return bad("longctx.attention.fixed_distance out of range");
  if (hp.logn_orig == 1 || hp.logn_orig > (1 << 30)) return bad("longctx.attention.logn_orig out of range");
  const uint32_t dflt_hd = static_cast<uint32_t>(hp.n_embd / hp.n_head);
  LC_ASSIGN_OR_RETURN(hp.head_dim, f.get_u32_or(a + "attention.key_length", dflt_hd));
  LC_ASSIGN_OR_RETURN(hp.head_dim_v, f.get_u32_or(a + "attention.value_length", dflt_hd));
  if (hp.head_dim <= 0 || hp.head_dim > 1024 || hp.head_dim % 2 != 0) return bad("key_length must be even and in (0, 1024]");
  if (hp.head_dim_v <= 0 || hp.head_dim_v > 1024) return bad("value_length out of range");
  LC_ASSIGN_OR_RETURN(hp.n_rot, f.get_u32_or(a + "rope.dimension_count", static_cast<uint32_t>(hp.head_dim)));
  if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
    return bad("rope.dimension_count must be even and at most the head size");
  const float dflt_eps = hp.arch == Arch::kLlama ? 1e-5f : 1e-6f;
  LC_ASSIGN_OR_RETURN(hp.rms_eps, f.get_f32_or(a + "attention.layer_norm_rms_epsilon", dflt_eps));
  if (!(hp.rms_eps >= 0.0f && hp.rms_eps < 1.0f)) return bad("layer_norm_rms_epsilon out of range");
  hp.rope_kind = hp.arch == Arch::kLlama ? RopeKind::kNorm : RopeKind::kNeox;
  LC_ASSIGN_OR_RETURN(hp.rope_base, f.get_f32_or(a + "rope.freq_base", 10000.0f));
  if (!(hp.rope_base > 1.0f) || !std::isfinite(hp.rope_base)) return bad("rope.freq_base must be > 1");

  // Rope scaling, as llama.cpp interprets it: a factor from rope.scaling.factor (or the older
  // rope.scale_linear), freq_scale = 1/factor; YaRN mixes interpolated and extrapolated angles.
  LC_ASSIGN_OR_RETURN(std::string scaling, f.get_string_or(a + "rope.scaling.type", "none"));
  if (scaling == "none" || scaling.empty()) {
    hp.rope_scaling = RopeScalingType::kNone;
  } else if (scaling == "linear") {
    hp.rope_scaling = RopeScalingType::kLinear;
  } else if (scaling == "yarn") {
    hp.rope_scaling = RopeScalingType::kYarn;
  } else {
    return make_error(fmt::format("{}: unsupported rope.scaling.type '{}' (supported: none, linear, yarn)",
                                  f.path(), scaling));
  }
  LC_ASSIGN_OR_RETURN(float factor, f.get_f32_or(a + "rope.scaling.factor", 0.0f));
  if (factor == 0.0f) {
    LC_ASSIGN_OR_RETURN(factor, f.get_f32_or(a + "rope.scale_linear", 0.0f));
  }
  if (factor < 0.0f || !std::isfinite(factor)) return bad("rope.scaling.factor must be positive");
  hp.rope_freq_scale = (factor == 0.0f || hp.rope_scaling == RopeScalingType::kNone) ? 1.0f : 1.0f / factor;
  LC_ASSIGN_OR_RETURN(uint32_t orig, f.get_u32_or(a + "rope.scaling.original_context_length",
                                                  static_cast<uint32_t>(hp.n_ctx_train)));
  hp.rope_orig_ctx = orig;
  hp.yarn_ext_factor = hp.rope_scaling == RopeScalingType::kYarn ? 1.0f : 0.0f;
  LC_ASSIGN_OR_RETURN(hp.yarn_attn_factor, f.get_f32_or(a + "rope.scaling.attn_factor", 1.0f));
  LC_ASSIGN_OR_RETURN(hp.yarn_beta_fast, f.get_f32_or(a + "rope.scaling.yarn_beta_fast", 32.0f));
  LC_ASSIGN_OR_RETURN(hp.yarn_beta_slow, f.get_f32_or(a + "rope.scaling.yarn_beta_slow", 1.0f));
  if (hp.rope_scaling == RopeScalingType::kYarn && hp.rope_orig_ctx <= 0)
    return bad("yarn scaling needs rope.scaling.original_context_length");
  return hp;
}

}  // namespace lc
