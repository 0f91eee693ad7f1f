// RoPE context extension, chosen by name on the command line (`--rope SPEC`), overriding the
// model's GGUF rope metadata. A scaling method computes a RopeTable (per-pair inv_freq and the
// cos/sin factor mscale); RopeTable::apply is the one kernel that rotates q and k. Attention
// logit scaling (`logn`) multiplies q by a per-position factor and composes with any method.
//
// Spec grammar (docs/rope.md has every method, key and default):
//   SPEC      := ""  |  COMPONENT ( "+" COMPONENT )*
//   COMPONENT := NAME [ ":" KEY "=" VALUE ( "," KEY "=" VALUE )* ]
// At most one position method and at most one `logn`; no position method (or "" / "gguf")
// means the model's own rope from its GGUF metadata. Examples:
//   "yarn:factor=8,orig=4096"   "ntk:factor=4+logn"   "logn:orig=8192"   "none"
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/method_info.h"
#include "core/status.h"
#include "rope/rope_table.h"

namespace lc {

// What a scaling needs to know about the model. gguf carries n_rot, neox, base and the
// metadata scaling (the `gguf` method reproduces it exactly); n_ctx_train is the default L0.
struct RopeModelInfo {
  LlamaCppRopeParams gguf;
  int64_t n_ctx_train = 0;  // the model's training context (GGUF context_length)
};

class RopeScaling {
 public:
  virtual ~RopeScaling() = default;
  // The table for a sequence whose positions are [0, n_ctx). Static methods ignore n_ctx;
  // dynamic ones (dynamic-ntk) change with it, so keys rotated under an older table drift.
  virtual RopeTable table(int64_t n_ctx) const = 0;
  virtual bool dynamic() const { return false; }
  // For a dynamic table: true if cached keys are re-rotated to every new table, false if each
  // keeps the table it was appended with.
  virtual bool rerotates_cache() const { return true; }
  // The canonical spec with every parameter resolved, e.g. "yarn:factor=8,orig=4096,...".
  virtual std::string describe() const = 0;
};

// Log-n attention logit scaling: q at 0-based position pos (1-based n = pos + 1) is multiplied
// by max(1, ln n / ln l0). Needs l0 >= 2.
float logn_scale(int64_t pos, int64_t l0);

// A position method plus optional log-n scaling: what the model calls.
class RopePlan {
 public:
  RopePlan(std::unique_ptr<RopeScaling> scaling, int64_t logn_l0);

  RopeTable table(int64_t n_ctx) const { return scaling_->table(n_ctx); }
  bool dynamic() const { return scaling_->dynamic(); }
  bool rerotates_cache() const { return scaling_->rerotates_cache(); }
  const RopeScaling& scaling() const { return *scaling_; }

  bool logn() const { return logn_l0_ > 0; }
  int64_t logn_l0() const { return logn_l0_; }
  // Factor for q at position pos: logn_scale(pos, L0) with logn, else 1.
  float q_scale(int64_t pos) const { return logn() ? logn_scale(pos, logn_l0_) : 1.0f; }
  // Multiplies every head of token t of q: [n_tokens, n_head, head_dim] by q_scale(pos[t]);
  // a no-op without logn.
  void scale_q(float* q, int64_t n_tokens, int64_t n_head, int64_t head_dim,
               const int32_t* pos) const;

  std::string describe() const;

 private:
  std::unique_ptr<RopeScaling> scaling_;
  int64_t logn_l0_ = 0;  // 0: no log-n scaling
};

// One position method: "NAME[:key=value,...]" ("" or "gguf": the model's metadata rope).
Expected<std::unique_ptr<RopeScaling>> make_rope_scaling(std::string_view spec,
                                                         const RopeModelInfo& info);
// A full spec, position method and/or logn joined by '+'.
Expected<RopePlan> make_rope_plan(std::string_view spec, const RopeModelInfo& info);

// Method names in registry order, and a multi-line help text (names, keys, defaults).
std::vector<std::string> rope_method_names();
// Each method (logn included) with its keys, types, defaults and help, from its declaration.
std::vector<MethodInfo> rope_method_info();
std::string rope_spec_help();

}  // namespace lc
