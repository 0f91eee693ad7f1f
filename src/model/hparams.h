// Hyper-parameters of a Llama-family model, read from GGUF metadata the way llama.cpp reads them.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "gguf/gguf.h"

namespace lc {

enum class Arch { kLlama, kQwen2, kQwen3 };
enum class RopeKind { kNorm, kNeox };  // adjacent pairs / halves
enum class RopeScalingType { kNone, kLinear, kYarn };

const char* arch_name(Arch a);
const char* rope_scaling_name(RopeScalingType t);

struct HParams {
  Arch arch = Arch::kLlama;
  std::string arch_str;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t fixed_distance = 0;  // trained distance ceiling (longctx.attention.fixed_distance), 0: none
  int64_t logn_orig = 0;       // trained logit scaling `logn:orig=N` (longctx.attention.logn_orig), 0: none
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;    // key/query head size
  int64_t head_dim_v = 0;  // value head size
  int64_t n_ff = 0;
  int64_t n_rot = 0;       // rotated dims per head
  float rms_eps = 1e-5f;
  RopeKind rope_kind = RopeKind::kNorm;
  float rope_base = 10000.0f;
  RopeScalingType rope_scaling = RopeScalingType::kNone;
  float rope_freq_scale = 1.0f;  // 1 / scaling factor
  int64_t rope_orig_ctx = 0;     // original training context (YaRN)
  float yarn_ext_factor = 0.0f;
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;

  int64_t n_gqa() const { return n_head / n_head_kv; }
};

Expected<HParams> read_hparams(const gguf::File& f);

}  // namespace lc
