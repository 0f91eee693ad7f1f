// SpecPC — Galim et al., "Draft-based Approximate Inference for LLMs" (arXiv 2506.08373):
// a small draft model of the same vocabulary reads the prompt and generates `lookahead` tokens;
// its attention says which prompt tokens matter, and the target then prefills only those.
//
// Scores (the authors' AttentionCache with their defaults): for every draft layer il >=
// start_layer, query head hq and observation query t — the draft's last `window` prompt
// queries, then the queries of its first lookahead-1 generated tokens (the last generated token
// is never run through the draft) —
//   p_t,hq(j) = softmax over the keys t sees of (rope(q_t,hq) . k_j * scale), j < n_prompt
//   w_t       = t / (n_win - 1) for window queries when weighted (linspace(0, 1)), else 1
//   s_j       = max over (il, hq, t) of w_t * p_t,hq(j)         (reduce=max; sum otherwise)
// Selection: s is max-pooled along the sequence (kernel, zero padding, centred as the authors'
// F.pad((k-1)//2, k-1-(k-1)//2)); the top `keep` tokens by pooled score, best first, each
// bring their neighbours (offsets -(n-1)//2 .. n-1-(n-1)//2, nearest first); the last `window`
// prompt tokens come first; the list, de-duplicated in that order, is cut at `keep` and sorted.
// Ties go to the lower index.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/press.h"

namespace lc {

// queries[il]: [n_q, n_head, head_dim] pre-RoPE queries of layer il (null for layers not
// voting); q_pos / q_seq: [n_q]; the first n_win are window queries. kv: the draft's cache.
std::vector<float> specpc_scores(const KvCache& kv, const PressShape& s, const std::vector<const float*>& queries,
                                 const int32_t* q_pos, const int32_t* q_seq, int64_t n_q, int64_t n_win,
                                 int64_t n_prompt, const PromptCompression& p);
// Ascending indices of the prompt tokens kept (keep of them, or all when keep >= n).
std::vector<int32_t> specpc_select(const std::vector<float>& scores, int64_t keep, const PromptCompression& p);
// The first voting layer for a draft of n_layer layers.
inline int64_t specpc_first_layer(const PromptCompression& p, int64_t n_layer) {
  return p.start_layer < n_layer ? p.start_layer : n_layer - 1;
}

}  // namespace lc
