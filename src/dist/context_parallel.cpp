#include "dist/context_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/method_spec.h"

namespace lc::dist {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Merges the partial (o2, l2) of one row into (o1, l1): both are softmax-weighted averages over
// disjoint key sets with log-sum-exps l1 and l2.
void merge_row(float* o1, float& l1, const float* o2, float l2, int64_t dv) {
  if (l2 == kNegInf) return;
  if (l1 == kNegInf) {
    std::copy_n(o2, dv, o1);
    l1 = l2;
    return;
  }
  const double m = std::max(l1, l2);
  const double w1 = std::exp(static_cast<double>(l1) - m), w2 = std::exp(static_cast<double>(l2) - m);
  const double inv = 1.0 / (w1 + w2);
  for (int64_t c = 0; c < dv; ++c) o1[c] = static_cast<float>((w1 * o1[c] + w2 * o2[c]) * inv);
  l1 = static_cast<float>(m + std::log(w1 + w2));
}

}  // namespace

std::string CpParams::spec() const {
  if (mode == CpMode::kRing) return zigzag ? "ring" : "ring:split=contiguous";
  std::string s = "star";
  if (anchor > 0) s += fmt::format(":anchor={}", anchor);
  if (block > 0) s += fmt::format("{}block={}", anchor > 0 ? "," : ":", block);
  if (blocks > 0) s += fmt::format("{}blocks={}", anchor > 0 || block > 0 ? "," : ":", blocks);
  return s;
}

Expected<CpParams> parse_cp(std::string_view text) {
  LC_ASSIGN_OR_RETURN(MethodSpec spec, MethodSpec::parse(text, "--cp mode"));
  CpParams p;
  if (spec.name() == "ring") {
    p.mode = CpMode::kRing;
    std::string split = "zigzag";
    LC_TRY(spec.get_string("split", &split,
                           "how the prompt is shared out: zigzag (rank r holds pieces r and 2N-1-r of 2N, so every "
                           "rank does the same attention work) or contiguous (rank r holds the r-th of N runs)"));
    if (split != "zigzag" && split != "contiguous")
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("--cp ring: split must be zigzag or contiguous, not '{}'", split));
    p.zigzag = split == "zigzag";
  } else if (spec.name() == "star") {
    p.mode = CpMode::kStar;
    LC_TRY(spec.get_int("anchor", &p.anchor, 0, int64_t{1} << 30,
                        "tokens of the anchor block every rank but the first reads before its own block (0: the "
                        "first context block, as Star Attention does)"));
    LC_TRY(spec.get_int("block", &p.block, 0, int64_t{1} << 30,
                        "tokens per context block; the blocks are shared out in runs, each rank evaluating each of "
                        "its blocks after the anchor (0: one block per rank)"));
    LC_TRY(spec.get_int("blocks", &p.blocks, 0, int64_t{1} << 30,
                        "context blocks of equal size, instead of block= (0: one block per rank)"));
    if (p.block > 0 && p.blocks > 0)
      return make_error(ErrorCode::kInvalidArgument, "--cp star: give block= (tokens per block) or blocks= (how "
                                                     "many), not both");
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--cp: unknown mode '{}' (ring[:split=zigzag|contiguous] or star[:anchor=A,block=B|blocks=K])",
                                  spec.name()));
  }
  LC_TRY(spec.finish());
  return p;
}

Expected<std::unique_ptr<ContextParallel>> ContextParallel::create(Comm& comm, const CpParams& p, Context& ctx) {
  if (comm.size() < 2)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--cp {}: {} process; start at least 2 (mpirun -np N, N >= 2)", p.spec(),
                                  comm.size()));
  auto cp = std::unique_ptr<ContextParallel>(new ContextParallel(comm, p, ctx));
  // The scratch cache that holds one block of another rank's keys and values while this rank
  // attends it: the same layout, types and rope as this rank's own cache, its own memory.
  KvCacheConfig kc = ctx.kv().config();
  kc.pool = nullptr;
  kc.budget_bytes = 0;
  kc.budget_is_default = false;
  kc.spill_dir.clear();
  kc.rope_provider = nullptr;
  LC_ASSIGN_OR_RETURN(cp->scratch_, KvCache::create(kc));
  for (int64_t il = 0; il < kc.n_layer; ++il) cp->scratch_->set_rope(il, ctx.kv().rope(il));
  LC_ASSIGN_OR_RETURN(cp->scratch_be_, make_attention_backend(ctx.attention().spec(), ctx.attention().shape()));
  LC_TRY(cp->scratch_be_->attach(*cp->scratch_));
  cp->scratch_be_->keep_partial_lse(true);
  cp->scratch_be_->set_detached(true);
  LC_TRY(ctx.set_sequence_parallel(cp.get()));
  return cp;
}

ContextParallel::~ContextParallel() {
  if (ctx_.sequence_parallel()) (void)ctx_.set_sequence_parallel(nullptr);
}

void ContextParallel::on_truncate(int64_t n) {
  if (n == 0) {
    n_global_ = 0;
    broken_ = false;
    cuts_.clear();
  } else {
    broken_ = true;
  }
}

Expected<ShardPlan> ContextParallel::plan(int64_t n, const DecodeCall& call) {
  if (broken_)
    return make_error(ErrorCode::kUnsupported, "--cp: the sequence was cut back in the middle; a sequence spread "
                                               "over processes can only be cleared");
  const int N = comm_.size(), r = comm_.rank();
  const int64_t chunk = ctx_.n_batch();
  ShardPlan plan;
  ring_call_ = false;
  // A call after the first prompt: every rank evaluates it; the last one stores it.
  auto global_step = [&](int64_t first, int64_t count) {
    ShardStep s;
    s.first = first;
    s.count = count;
    s.pos0 = n_global_ + first;
    s.store = r == N - 1;
    s.merge = true;
    return s;
  };
  if (n_global_ > 0) {
    for (int64_t i = 0; i < n; i += chunk) plan.steps.push_back(global_step(i, std::min(chunk, n - i)));
    n_global_ += n;
    return plan;
  }
  if (p_.mode == CpMode::kRing) {
    const int pieces = p_.zigzag ? 2 * N : N;
    if (n < pieces)
      return make_error(ErrorCode::kInvalidArgument,
                        p_.zigzag ? fmt::format("--cp ring: the prompt has {} tokens, fewer than the {} pieces of the "
                                                "zigzag split over {} ranks (2 per rank; or split=contiguous)",
                                                n, pieces, N)
                                  : fmt::format("--cp ring: the prompt has {} tokens, fewer than the {} ranks", n, N));
    cuts_.assign(static_cast<size_t>(pieces + 1), 0);
    for (int j = 0; j <= pieces; ++j) cuts_[static_cast<size_t>(j)] = n * j / pieces;
    int64_t a = 0, b = 0, c = 0, d = 0;
    ring_pieces(r, &a, &b, &c, &d);
    if ((b - a) + (d - c) > chunk)
      return make_error(ErrorCode::kUnsupported,
                        fmt::format("--cp ring: this rank's shard of {} tokens is over the largest forward chunk "
                                    "({}): ring attention evaluates a shard layer by layer in one piece; use more "
                                    "ranks (or --cp star)", (b - a) + (d - c), chunk));
    ShardStep s;
    s.first = a;
    s.count = b - a;
    s.pos0 = a;
    s.tail_first = c;
    s.tail_count = d - c;
    s.merge = true;
    plan.steps.push_back(s);
    ring_call_ = true;
    ring_root_ = p_.zigzag ? 0 : N - 1;  // zigzag: rank 0 holds the last piece
    stats_.shard_first = a;
    stats_.shard_end = b;
    stats_.tail_first = c;
    stats_.tail_end = d;
    n_global_ = n;
    return plan;
  }
  // Star Attention.
  const int64_t q = std::clamp<int64_t>(n_query_, 1, n);
  const int64_t D = n - q;  // the context
  if (D < N)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--cp star: the context has {} tokens (the prompt's {} less the query's {}), fewer "
                                  "than the {} ranks", D, n, q, N));
  // Context blocks: `block` tokens each (the last one shorter), or `blocks` (else one per rank)
  // of equal size; rank r gets the run [nb r / N, nb (r + 1) / N) of the nb blocks.
  const int64_t B = p_.block;
  const int64_t nb = B > 0 ? (D + B - 1) / B : p_.blocks > 0 ? p_.blocks : N;
  if (nb < N || nb > D)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--cp {}: the context's {} tokens make {} block(s), {} the {} ranks", p_.spec(), D,
                                  nb, nb < N ? "fewer than" : "more than its tokens; or fewer than", N));
  cuts_.assign(static_cast<size_t>(nb + 1), 0);
  for (int64_t j = 0; j <= nb; ++j) cuts_[static_cast<size_t>(j)] = B > 0 ? std::min(j * B, D) : D * j / nb;
  const int64_t j0 = nb * r / N, j1 = nb * (r + 1) / N;
  const int64_t a = cuts_[static_cast<size_t>(j0)], b = cuts_[static_cast<size_t>(j1)];
  auto local = [&](int64_t first, int64_t count, int64_t pos0) {
    for (int64_t i = 0; i < count; i += chunk) {
      ShardStep s;
      s.first = first + i;
      s.count = std::min(chunk, count - i);
      s.pos0 = pos0 + i;
      plan.steps.push_back(s);
    }
  };
  // Each block after the anchor (the first block has none), alone: before a block's first
  // step the previous block's anchor is dropped and the previous block set aside; before the
  // query's first step the last anchor is dropped and every block comes back.
  const int64_t anchor_len = p_.anchor > 0 ? std::min(p_.anchor, D) : cuts_[1];
  int64_t at = 0;                          // the call's stored tokens so far (ShardStep offsets)
  int64_t prev_anchor = 0, prev_len = 0;   // the previous block's anchor and block
  bool set_aside = false;
  stats_.prefill_pairs = 0;
  stats_.star_blocks = j1 - j0;
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t first = cuts_[static_cast<size_t>(j)], len = cuts_[static_cast<size_t>(j + 1)] - first;
    const int64_t anchor = j > 0 ? std::min(anchor_len, first) : 0;
    const size_t step0 = plan.steps.size();
    local(0, anchor, 0);
    local(first, len, first);
    if (j > j0) {
      ShardStep& s = plan.steps[step0];
      s.drop_first = at - prev_len - prev_anchor;
      s.drop_count = prev_anchor;
      s.hide_first = at - prev_len;
      s.hide_count = prev_len;
      set_aside = true;
    }
    at += anchor + len;
    stats_.prefill_pairs += (anchor + len) * (anchor + len + 1) / 2;
    prev_anchor = anchor;
    prev_len = len;
  }
  const size_t q0 = plan.steps.size();
  for (int64_t i = D; i < n; i += chunk) plan.steps.push_back(global_step(i, std::min(chunk, n - i)));
  plan.steps[q0].drop_first = at - prev_len - prev_anchor;
  plan.steps[q0].drop_count = prev_anchor;
  plan.steps[q0].restore = set_aside;
  stats_.shard_first = a;
  stats_.shard_end = b;
  stats_.tail_first = stats_.tail_end = 0;
  n_global_ = n;
  (void)call;
  return plan;
}

Status ContextParallel::merge_attention(Context& ctx, int64_t il, int64_t n, const float* q, const float* k,
                                        const float* v, const int32_t* pos, float* out, const float* lse) {
  if (lse == nullptr) return make_error("--cp: the attention backend kept no log-sum-exp to merge with");
  const int64_t H = ctx.attention().shape().n_head;
  lse_.assign(lse, lse + n * H);
  Status st = ring_call_ ? ring_merge(il, n, q, k, v, pos, out) : gather_merge(n, out);
  stats_.bytes_sent = comm_.bytes_sent();
  return st;
}

Status ContextParallel::gather_merge(int64_t n, float* out) {
  const AttnShape& sh = ctx_.attention().shape();
  const int64_t rows = n * sh.n_head, dv = sh.head_dim_v, N = comm_.size();
  const size_t per = static_cast<size_t>(rows * (dv + 1));
  send_.resize(per);
  std::copy_n(out, rows * dv, send_.begin());
  std::copy(lse_.begin(), lse_.end(), send_.begin() + rows * dv);
  recv_.resize(per * static_cast<size_t>(N));
  const auto t0 = std::chrono::steady_clock::now();
  LC_TRY(comm_.allgather(send_.data(), per * sizeof(float), recv_.data()));
  stats_.t_comm += seconds_since(t0);
  // In rank order on every rank: the same bits everywhere.
  std::fill(out, out + rows * dv, 0.0f);
  std::fill(lse_.begin(), lse_.end(), kNegInf);
  for (int64_t j = 0; j < N; ++j) {
    const float* o = recv_.data() + static_cast<size_t>(j) * per;
    const float* l = o + rows * dv;
    for (int64_t r = 0; r < rows; ++r) merge_row(out + r * dv, lse_[static_cast<size_t>(r)], o + r * dv, l[r], dv);
  }
  return ok_status();
}

void ContextParallel::ring_pieces(int j, int64_t* a, int64_t* b, int64_t* c, int64_t* d) const {
  auto cut = [&](int i) { return cuts_[static_cast<size_t>(i)]; };
  *a = cut(j);
  *b = cut(j + 1);
  if (p_.zigzag) {
    const int late = 2 * comm_.size() - 1 - j;
    *c = cut(late);
    *d = cut(late + 1);
  } else {
    *c = *d = *b;
  }
}

Status ContextParallel::ring_merge(int64_t il, int64_t n, const float* q, const float* k, const float* v,
                                   const int32_t* pos, float* out) {
  const KvCache& kv = ctx_.kv();
  const int64_t kd = kv.n_head_kv() * kv.head_dim(), vd = kv.n_head_kv() * kv.head_dim_v();
  const int N = comm_.size(), r = comm_.rank();
  // A block on the wire: keys [m, kd], values [m, vd], positions [m] (int32 in float slots), in
  // the order its rank evaluated them (the early piece, then the late one).
  auto floats_of = [&](int64_t m) { return static_cast<size_t>(m * (kd + vd + 1)); };
  send_.resize(floats_of(n));
  std::copy_n(k, n * kd, send_.begin());
  std::copy_n(v, n * vd, send_.begin() + n * kd);
  std::memcpy(send_.data() + n * (kd + vd), pos, static_cast<size_t>(n) * sizeof(int32_t));
  int64_t a = 0, b = 0, c = 0, d = 0;
  ring_pieces(r, &a, &b, &c, &d);
  const int64_t own_early = b - a;
  // Its own shard's causal pairs: each piece with itself, and the late piece with the early one.
  if (il == 0) stats_.prefill_pairs = own_early * (own_early + 1) / 2 + (n - own_early) * (n - own_early + 1) / 2 +
                                   (n - own_early) * own_early;
  const int to = (r + 1) % N, from = (r - 1 + N) % N;
  for (int s = 1; s < N; ++s) {
    const int origin = (r - s + N) % N;  // whose block arrives in this step
    ring_pieces(origin, &a, &b, &c, &d);
    const int64_t m = (b - a) + (d - c);
    recv_.resize(floats_of(m));
    const auto t0 = std::chrono::steady_clock::now();
    LC_TRY(comm_.sendrecv(send_.data(), send_.size() * sizeof(float), to, recv_.data(), recv_.size() * sizeof(float),
                          from));
    stats_.t_comm += seconds_since(t0);
    std::swap(send_, recv_);  // what arrived goes on to the next rank in the next step
    const float* bk = send_.data();
    const float* bv = bk + m * kd;
    const auto* bp = reinterpret_cast<const int32_t*>(bv + m * vd);
    if (!p_.zigzag) {
      if (origin < r) LC_TRY(attend_block(il, 0, n, q, pos, m, bk, bv, bp, out));
    } else if (origin < r) {
      // Its early piece precedes both of ours; its late piece follows both.
      LC_TRY(attend_block(il, 0, n, q, pos, b - a, bk, bv, bp, out));
    } else {
      // Both its pieces lie between ours: our late piece sees all of it, our early piece none.
      LC_TRY(attend_block(il, own_early, n - own_early, q, pos, m, bk, bv, bp, out));
    }
  }
  return ok_status();
}

Status ContextParallel::attend_block(int64_t il, int64_t r0, int64_t n, const float* q, const int32_t* qpos,
                                     int64_t m, const float* k, const float* v, const int32_t* kpos, float* out) {
  if (n <= 0 || m <= 0) return ok_status();
  const AttnShape& sh = ctx_.attention().shape();
  const int64_t H = sh.n_head, dv = sh.head_dim_v, rows = n * H;
  if (il == 0) stats_.prefill_pairs += n * m;
  scratch_->clear();
  LC_TRY(scratch_->append(il, m, k, v, kpos));
  part_.resize(static_cast<size_t>(rows * dv));
  LC_TRY(scratch_be_->forward(il, n, q + r0 * H * sh.head_dim, qpos + r0, *scratch_, part_.data(), ctx_.pool()));
  const float* l2 = scratch_be_->partial_lse();
  if (l2 == nullptr) return make_error("--cp: the attention backend kept no log-sum-exp to merge with");
  float* o = out + r0 * H * dv;
  float* l1 = lse_.data() + r0 * H;
  for (int64_t i = 0; i < rows; ++i) merge_row(o + i * dv, l1[i], part_.data() + i * dv, l2[i], dv);
  return ok_status();
}

Status ContextParallel::share_logits(float* logits, int64_t n_vocab, bool have) {
  // The ring prompt's last token is on ring_root_; every later call's is on every rank.
  const int root = ring_call_ ? ring_root_ : comm_.size() - 1;
  if (comm_.rank() == root && !have)
    return make_error(fmt::format("--cp: rank {} has no logits for the call's last token", root));
  const auto t0 = std::chrono::steady_clock::now();
  Status st = comm_.bcast(logits, static_cast<size_t>(n_vocab) * sizeof(float), root);
  stats_.t_comm += seconds_since(t0);
  return st;
}

}  // namespace lc::dist
