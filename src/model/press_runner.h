// The press runner: attaches a KV press (kv/press.h) to a Context through the forward hooks and
// runs it on the press's schedule (after every prefill chunk, after the prompt, every N
// generated tokens; query-aware or query-agnostic). It keeps the observation window the press
// scores with, feeds H2O's observer the real attention, and runs the draft-guided presses
// through a DraftRunner: SpecKV's lookahead and SpecPC's prompt selection (Galim et al.,
// arXiv 2506.08373).
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/press.h"
#include "model/draft.h"
#include "model/forward_hooks.h"
#include "model/query_window.h"

namespace lc {

class PressRunner final : public ForwardHooks {
 public:
  // The press of p.kv_press for a context over `model` (null when p names none); checks that a
  // draft is given when the press needs one and that it shares the model's vocabulary.
  // The backend is checked as attach_backend() does.
  static Expected<std::unique_ptr<PressRunner>> create(const Model& model, const ContextParams& p,
                                                       AttentionBackend& backend);

  const KvPress& press() const { return *press_; }
  // Seconds spent in press work since the context was last cleared: scoring and compaction,
  // SpecKV's lookahead, SpecPC's draft pass, H2O's observer.
  double seconds() const { return t_press_; }
  // SpecPC: indices into the last compressed prompt of the tokens kept (empty: none ran).
  const std::vector<int32_t>& prompt_kept() const { return prompt_kept_; }
  // The request's answer budget (its max new tokens; < 0: none, as in perplexity): how far
  // SpecKV's draft looks ahead when the press says lookahead=answer (its default).
  void set_answer_tokens(int64_t n) { answer_tokens_ = n; }
  // SpecKV: the draft tokens the last after-prompt compression looked ahead with (0: none).
  int64_t lookahead_run() const { return lookahead_run_; }
  // KVzip: the reconstruction passes the last compression ran and their tokens (0: none ran).
  int64_t reconstruction_passes() const { return kvzip_passes_; }
  int64_t reconstruction_tokens() const { return kvzip_tokens_; }
  // lookahead=answer where the runtime generates no answer (perplexity, bench speed/press).
  static constexpr int64_t kLookaheadNoAnswer = 32;

  Status before_prompt(Context& ctx, std::span<const int32_t> prompt, const DecodeCall& call,
                       std::optional<std::vector<int32_t>>& replace) override;
  void on_queries(int64_t il, const float* q, const int32_t* pos, int64_t n) override;
  void on_attention(Context& ctx, int64_t il, const float* q, const int32_t* pos, int64_t n) override;
  Status after_chunk(Context& ctx) override;
  Status after_prompt(Context& ctx, const DecodeCall& call) override;
  Status after_token(Context& ctx) override;
  void on_truncate(int64_t n) override;
  Status attach_backend(AttentionBackend& backend) override;

  // The schedule state and the observation window (runtime::Session's save and restore).
  // Refused while the press accumulates attention statistics of the forward passes (H2O's
  // observer), which are not part of the cache.
  Status save(std::ostream& out) const;
  Status load(std::istream& in, int64_t max_tokens);

 private:
  PressRunner(std::unique_ptr<KvPress> press, const Model& model, const ContextParams& p);
  // n_lookahead: the last n_lookahead queries of the window are SpecKV's draft tokens, whose
  // keys lookahead_keys_ holds.
  Status compress(Context& ctx, PressPhase phase, int64_t n_lookahead = 0);
  Status lookahead_compress(Context& ctx);
  // SpecKV's sparse prefill (prefill=sparse): the draft answers before the prompt, which is
  // evaluated with the answer in one pass (sparse_begin, from before_prompt); after it the
  // answer is cropped, the press compresses, and the last prompt token is evaluated again over
  // the compressed cache (sparse_finish, from after_prompt).
  Status sparse_begin(Context& ctx, std::span<const int32_t> prompt, const DecodeCall& call,
                      std::optional<std::vector<int32_t>>& replace);
  Status sparse_finish(Context& ctx);
  // KVzip: runs the reconstruction prompts through the model, then compresses.
  Status kvzip_compress(Context& ctx);
  // During the lookahead's forward: copies the keys layer il just stored for its n tokens.
  void capture_lookahead_keys(const KvCache& kv, int64_t il, int64_t n);
  Status select_prompt(std::span<const int32_t> prompt, std::vector<int32_t>& selected);

  std::unique_ptr<KvPress> press_;
  std::unique_ptr<OutputProjection> out_proj_;  // W_o per layer, dequantised on first use (criticalkv)
  AttentionObserver* observer_ = nullptr;  // the press's feed of the real attention (H2O)
  std::unique_ptr<DraftRunner> draft_;  // speckv, specpc: the draft model
  int64_t n_layer_ = 0;
  QueryWindow window_;
  bool active_ = false;        // this prompt is compressed (query-agnostic: its context part)
  bool context_done_ = false;  // query-agnostic: the context part has been compressed
  bool in_lookahead_ = false;  // SpecKV's draft tokens run: their attention is not observed
  int64_t n_generated_ = 0;    // single-token decodes since the last prompt
  int64_t answer_tokens_ = -1;  // the request's max new tokens (< 0: none given)
  int64_t lookahead_run_ = 0;
  // SpecKV's draft tokens while they are run: their keys [n_layer, n_head_kv, n, head_dim]
  // (post-RoPE, as stored), the first one's sequence index, and the tokens copied per layer.
  std::vector<float> lookahead_keys_;
  int64_t lookahead_n_ = 0, lookahead_seq0_ = 0;
  std::vector<int64_t> lookahead_done_;
  std::string lookahead_error_;  // a copy that went wrong (reported after the forward)
  // SpecKV's sparse prefill in progress: the prompt's length and last token, the context's own
  // attention, the tokens layer 0 saw in the pass's first forward (one chunk), and guards for the cuts and the
  // evaluation of the last prompt token that sparse_finish makes.
  struct SparsePrefill {
    bool active = false;
    int64_t prompt = 0, first_chunk = -1;
    int32_t last = 0;  // the prompt's last token
    std::string attn;
  } sparse_;
  bool keep_window_ = false, in_recompute_ = false;
  double t_press_ = 0;
  std::vector<int32_t> prompt_kept_;
  // KVzip (kv/press_kvzip.h): the press's reconstruction side, its prompts' token ids, and the
  // first error of its scoring while the reconstruction tokens run.
  KvzipReconstruction* kvzip_ = nullptr;
  std::vector<int32_t> kvzip_first_, kvzip_next_, kvzip_suffix_;
  bool in_kvzip_ = false;
  std::string kvzip_error_;
  int64_t kvzip_passes_ = 0, kvzip_tokens_ = 0;
};

}  // namespace lc
