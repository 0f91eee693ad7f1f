#include "train/config.h"

#include <fmt/format.h>

#include <cmath>

namespace lc::train {

Expected<ModelConfig> resolve_config(ModelConfig c) {
  auto bad = [](const char* msg) { return make_error(std::string("model config: ") + msg); };
  if (c.n_layer < 1 || c.n_layer > 256) return bad("n_layer must be in [1, 256]");
  if (c.n_embd < 2 || c.n_embd > 16384) return bad("n_embd must be in [2, 16384]");
  if (c.n_head < 1 || c.n_head > c.n_embd) return bad("n_head must be in [1, n_embd]");
  if (c.n_embd % c.n_head != 0) return make_error(fmt::format(
      "model config: n_embd ({}) must be a multiple of n_head ({})", c.n_embd, c.n_head));
  if (c.head_dim() % 2 != 0) return make_error(fmt::format(
      "model config: the head size n_embd / n_head = {} must be even (RoPE rotates pairs)", c.head_dim()));
  if (c.n_head_kv == 0) c.n_head_kv = c.n_head;
  if (c.n_head_kv < 1 || c.n_head % c.n_head_kv != 0) return make_error(fmt::format(
      "model config: n_head ({}) must be a multiple of n_head_kv ({})", c.n_head, c.n_head_kv));
  if (c.n_ff == 0) c.n_ff = (c.n_embd * 8 / 3 + 31) / 32 * 32;
  if (c.n_ff < 1 || c.n_ff > (1 << 20)) return bad("n_ff must be in [1, 2^20]");
  if (c.n_vocab < 2 || c.n_vocab > (1 << 24)) return bad("n_vocab must be in [2, 2^24] (is the tokenizer empty?)");
  if (c.n_ctx < 2 || c.n_ctx > (1 << 20)) return bad("n_ctx must be in [2, 2^20]");
  if (!(c.rope_base > 1.0f) || !std::isfinite(c.rope_base)) return bad("rope base must be > 1");
  if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f)) return bad("rms eps must be in (0, 1)");
  if (c.fixed_distance < 0 || c.fixed_distance > (1 << 20)) return bad("fixed distance must be in [0, 2^20]");
  if (c.logn_orig < 0 || c.logn_orig == 1 || c.logn_orig > (1 << 20)) return bad("logn length must be 0 or in [2, 2^20]");
  return c;
}

std::string describe(const ModelConfig& c) {
  return fmt::format("{} layers, n_embd {}, {} heads ({} kv), n_ff {}, vocab {}, n_ctx {}, {} output",
                     c.n_layer, c.n_embd, c.n_head, c.n_head_kv,
                     c.n_ff, c.n_vocab, c.n_ctx, c.tied ? "tied" : "separate") +
         (c.fixed_distance > 0 ? fmt::format(", fixed distance {}", c.fixed_distance) : std::string()) +
         (c.logn_orig > 0 ? fmt::format(", logn from {}", c.logn_orig) : std::string());
}

}  // namespace lc::train
