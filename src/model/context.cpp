#include "model/context.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <istream>
#include <ostream>

#include "core/binary_io.h"
#include "core/sys.h"
#include "kernels/kernels.h"
#include "model/draft.h"
#include "model/press_runner.h"

namespace lc {

namespace {
// fn(i) for i in [0, count) over the pool (at least 8 rows a task when there are 64 or more).
template <class Fn>
void for_rows(ThreadPool& pool, int64_t count, Fn&& fn) {
  pool.parallel_for(count, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) fn(i);
  }, count >= 64 ? 8 : count);
}

// Decode-sized batches (at most kFusedRows rows) run a layer's work besides the attention as
// one parallel region: W_o, the FFN and the next layer's Q/K/V (the first layer's Q/K/V in a
// region of its own). The threads meet at barriers where a step needs another thread's rows,
// and do the row-wise work (norms, residual adds, SwiGLU) inside the region instead of between
// regions (issue 22's "fewer, larger parallel regions"). Each thread norms the rows into its
// own part of `norm` ([threads, kFusedRows, n_embd]) and quantises its own copy of the
// activations. Every output element takes the same operations as on the unfused path (same bits).
constexpr int64_t kFusedRows = 8;

// Row ranges of ws (in the joint numbering of all their rows, as matmul_multi splits them)
// that thread t of nt computes.
template <size_t N>
std::array<kernels::RowRange, N> joint_share(const std::array<const TensorView*, N>& ws, int64_t n, int t, int nt) {
  int64_t total = 0, grain = 1;
  for (const TensorView* w : ws) {
    total += w->n_rows();
    grain = std::max(grain, kernels::matmul_grain(*w, n));
  }
  const auto [b, e] = ThreadPool::share(total, grain, t, nt);
  std::array<kernels::RowRange, N> r{};
  int64_t first = 0;
  for (size_t i = 0; i < N; first += ws[i]->n_rows(), ++i)
    r[i] = {std::clamp(b - first, int64_t{0}, ws[i]->n_rows()), std::clamp(e - first, int64_t{0}, ws[i]->n_rows())};
  return r;
}

// Thread t's rows of a matrix of `rows` rows (aligned to `grain` and to 8 floats, so that the
// row-wise kernels' vector and scalar parts fall on the same elements as over whole rows).
kernels::RowRange own_rows(int64_t rows, int64_t grain, int t, int nt) {
  const auto [b, e] = ThreadPool::share(rows, std::max<int64_t>(grain, 8), t, nt);
  return {b, e};
}

// The next layer's start, for a region that runs on into it: attn_norm and Q/K/V (with W_q `wq`).
struct NextQkv {
  const LayerWeights* L = nullptr;  // null: the region ends with the layer
  const TensorView* wq = nullptr;
  float *q = nullptr, *k = nullptr, *v = nullptr;
};

// Thread t's part of attn_norm and Q/K/V over n <= kFusedRows rows of the residual stream x.
void norm_qkv_part(const HParams& hp, const NextQkv& nx, int64_t n, const float* x, float* norm, int t, int nt) {
  const int64_t E = hp.n_embd;
  const std::array<const TensorView*, 3> w = {nx.wq, &nx.L->wk, &nx.L->wv};
  float* y[3] = {nx.q, nx.k, nx.v};
  float* h = norm + t * kFusedRows * E;
  for (int64_t r = 0; r < n; ++r) kernels::rmsnorm(x + r * E, nx.L->attn_norm, h + r * E, E, hp.rms_eps);
  const auto rows = joint_share(w, n, t, nt);
  kernels::matmul_rows(w, y, h, n, rows);
}

// q, k, v of n rows (n <= kFusedRows): one region.
void norm_qkv_fused(const HParams& hp, const NextQkv& nx, int64_t n, const float* x, float* norm, ThreadPool& pool) {
  pool.run([&](int t) { norm_qkv_part(hp, nx, n, x, norm, t, pool.size()); });
}

// The rest of layer L after attention for n <= kFusedRows rows, one region: x += W_o attn
// (each thread its rows of W_o and of x); barrier; h = ffn_norm(x), gate and up (each thread
// the same rows of both) and SwiGLU over them; barrier; x += W_down swiglu; and with `next`,
// barrier and the next layer's attn_norm and Q/K/V: one region per layer besides the attention.
void finish_rows_fused(const HParams& hp, const LayerWeights& L, int64_t n, float* x, float* cur, const float* attn,
                       float* gate, float* up, float* norm, ThreadPool& pool, const NextQkv& next = {}) {
  const int64_t E = hp.n_embd, F = hp.n_ff;
  pool.run([&](int t) {
    const int nt = pool.size();
    auto product_add = [&](const TensorView& w, const float* in) {  // x += W in, thread t's rows
      const kernels::RowRange r = own_rows(E, kernels::matmul_grain(w, n), t, nt);
      const TensorView* ws[1] = {&w};
      float* ys[1] = {cur};
      kernels::matmul_rows(ws, ys, in, n, {&r, 1});
      for (int64_t i = 0; i < n && r.b < r.e; ++i) kernels::add_inplace(x + i * E + r.b, cur + i * E + r.b, r.e - r.b);
    };
    product_add(L.wo, attn);
    pool.barrier();
    float* h = norm + t * kFusedRows * E;
    for (int64_t i = 0; i < n; ++i) kernels::rmsnorm(x + i * E, L.ffn_norm, h + i * E, E, hp.rms_eps);
    const kernels::RowRange r =
        own_rows(F, std::max(kernels::matmul_grain(L.w_gate, n), kernels::matmul_grain(L.w_up, n)), t, nt);
    const TensorView* ws[2] = {&L.w_gate, &L.w_up};
    float* ys[2] = {gate, up};
    const kernels::RowRange rs[2] = {r, r};
    kernels::matmul_rows(ws, ys, h, n, rs);
    for (int64_t i = 0; i < n && r.b < r.e; ++i)
      kernels::swiglu(gate + i * F + r.b, up + i * F + r.b, gate + i * F + r.b, r.e - r.b);
    pool.barrier();
    product_add(L.w_down, gate);
    if (!next.L) return;
    pool.barrier();
    norm_qkv_part(hp, next, n, x, norm, t, nt);
  });
}

// The rest of layer L after attention, over n rows of the residual stream x [n, n_embd]:
// x += W_o attn; x += W_down swiglu(W_gate h, W_up h) with h = ffn_norm(x). cur, gate, up: scratch.
void finish_rows(const HParams& hp, const LayerWeights& L, int64_t n, float* x, float* cur, const float* attn,
                 float* gate, float* up, float* norm, ThreadPool& pool) {
  if (n <= kFusedRows) return finish_rows_fused(hp, L, n, x, cur, attn, gate, up, norm, pool);
  const int64_t E = hp.n_embd;
  kernels::matmul(L.wo, attn, n, cur, pool);
  for_rows(pool, n, [&](int64_t t) { kernels::add_inplace(x + t * E, cur + t * E, E); });
  for_rows(pool, n, [&](int64_t t) { kernels::rmsnorm(x + t * E, L.ffn_norm, cur + t * E, E, hp.rms_eps); });
  {
    const TensorView* w[2] = {&L.w_gate, &L.w_up};
    float* y[2] = {gate, up};
    kernels::matmul_multi(w, y, cur, n, pool);
  }
  for_rows(pool, n, [&](int64_t t) {
    kernels::swiglu(gate + t * hp.n_ff, up + t * hp.n_ff, gate + t * hp.n_ff, hp.n_ff);
  });
  kernels::matmul(L.w_down, gate, n, cur, pool);
  for_rows(pool, n, [&](int64_t t) { kernels::add_inplace(x + t * E, cur + t * E, E); });
}

// finish_rows over sub-chunks of at most `sub` rows: cur, gate and up hold `sub` rows.
void finish_layer(const HParams& hp, const LayerWeights& L, int64_t n, int64_t sub, float* x, float* cur,
                  const float* attn, float* gate, float* up, float* norm, ThreadPool& pool) {
  const int64_t E = hp.n_embd, o_dim = hp.n_head * hp.head_dim_v;
  for (int64_t s = 0; s < n; s += sub)
    finish_rows(hp, L, std::min(sub, n - s), x + s * E, cur, attn + s * o_dim, gate, up, norm, pool);
}

LlamaCppRopeParams llama_cpp_rope_params(const HParams& hp, const std::vector<float>& freq_factors) {
  LlamaCppRopeParams r;
  r.n_rot = hp.n_rot;
  r.neox = hp.rope_kind == RopeKind::kNeox;
  r.base = hp.rope_base;
  r.freq_scale = hp.rope_freq_scale;
  r.ext_factor = hp.yarn_ext_factor;
  r.attn_factor = hp.yarn_attn_factor;
  r.beta_fast = hp.yarn_beta_fast;
  r.beta_slow = hp.yarn_beta_slow;
  r.orig_ctx = hp.rope_orig_ctx;
  r.freq_factors = freq_factors;
  return r;
}
AttnShape attn_shape_of(const HParams& hp) {
  AttnShape as;
  as.n_layer = hp.n_layer;
  as.n_head = hp.n_head;
  as.n_head_kv = hp.n_head_kv;
  as.head_dim = hp.head_dim;
  as.head_dim_v = hp.head_dim_v;
  as.fixed_distance = hp.fixed_distance;
  return as;
}
}  // namespace

Context::Context(const Model& model, const ContextParams& p)
    : model_(model), hp_(model.hparams()), params_(p),
      own_pool_(p.pool ? nullptr : std::make_unique<ThreadPool>(p.n_threads > 0 ? p.n_threads : default_thread_count())),
      pool_(p.pool ? p.pool : own_pool_.get()) {}

Context::~Context() = default;

Expected<std::unique_ptr<Context>> Context::create(const Model& model, const ContextParams& p) {
  return create(model, p, nullptr);
}

Expected<std::unique_ptr<Context>> Context::create(const Model& model, const ContextParams& in,
                                                   std::unique_ptr<AttentionBackend> backend) {
  ContextParams p = in;
  const HParams& hp = model.hparams();
  const bool grow = p.n_ctx == 0;
  if (grow) p.n_ctx = kGrowingContext;
  if (p.n_ctx < 1 || p.n_ctx > (int64_t{1} << 31))
    return make_error(fmt::format("context size {} is out of range", p.n_ctx));
  if (p.n_batch < 1 || p.n_batch > kMaxBatch)
    return make_error(fmt::format("batch size {} is out of range [1, {}]", p.n_batch, kMaxBatch));
  p.n_batch = std::min(p.n_batch, p.n_ctx);
  if (p.n_threads < 0 || p.n_threads > 1024)
    return make_error(fmt::format("thread count {} is out of range", p.n_threads));
  RopeModelInfo ri;
  ri.gguf = llama_cpp_rope_params(hp, model.rope_freq_factors());
  ri.n_ctx_train = hp.n_ctx_train;
  // A model trained with logit scaling gets it with its GGUF rope ("" or "gguf"); any other
  // --rope (e.g. `none`, the plain rope) is taken as given.
  const bool own_rope = p.rope.empty() || p.rope == "gguf";
  const std::string rope_spec =
      own_rope && hp.logn_orig > 0 ? fmt::format("logn:orig={}", hp.logn_orig) : p.rope;
  auto plan = make_rope_plan(rope_spec, ri);
  if (!plan) return make_error("--rope: " + plan.error().message);
  auto c = std::unique_ptr<Context>(new Context(model, p));
  c->rope_plan_ = std::make_unique<RopePlan>(std::move(*plan));
  // A growing context starts from the table of the trained length; a dynamic scaling follows the
  // length as it grows (the cache asks the plan per append).
  c->rope_ = c->rope_plan_->table(grow ? std::max<int64_t>(hp.n_ctx_train, 512) : p.n_ctx);

  KvCacheConfig kc;
  kc.n_layer = hp.n_layer;
  kc.n_head_kv = hp.n_head_kv;
  kc.head_dim = hp.head_dim;
  kc.head_dim_v = hp.head_dim_v;
  kc.block_tokens = p.kv_block;
  kc.type_k = p.kv_type_k;
  kc.type_v = p.kv_type_v;
  kc.budget_bytes = p.kv_budget;
  if (grow && p.kv_budget == 0 && p.kv_spill.empty()) {
    // Bounded by the machine: an error that names the limit, never an out-of-memory kill.
    const int64_t avail = available_memory_bytes();
    if (avail > 0) {
      kc.budget_bytes = avail / 4 * 3;
      kc.budget_is_default = true;
    }
  }
  kc.spill_dir = p.kv_spill;
  kc.pool = p.kv_pool;
  kc.policy = p.kv_spill.empty() ? KvBudgetPolicy::kEvict : KvBudgetPolicy::kSpill;
  kc.rope = c->rope_;
  if (c->rope_plan_->dynamic()) {
    const RopePlan* plan = c->rope_plan_.get();
    kc.rope_provider = [plan](int64_t n_ctx) { return plan->table(n_ctx); };
    kc.rope_rerotate = plan->rerotates_cache();
    if (kc.rope_rerotate && kc.type_k != DType::F32)
      return make_error(fmt::format("--rope {}: re-rotating the cached keys at every length needs f32 keys "
                                    "(--kv-type-k f32); {} keys would be rounded again at every step",
                                    c->rope_plan_->describe(), dtype_name(kc.type_k)));
  }
  LC_ASSIGN_OR_RETURN(c->kv_, KvCache::create(kc));
  const AttnShape as = attn_shape_of(hp);
  if (backend) {
    c->backend_ = std::move(backend);
  } else {
    auto attn = make_attention_backend(p.attn, as);
    if (!attn) return make_error("--attn: " + attn.error().message);
    c->backend_ = std::move(*attn);
  }
  LC_TRY(c->check_rope_backend(*c->backend_));
  LC_TRY(c->backend_->attach(*c->kv_));
  if (p.draft) LC_TRY(check_draft_vocab(model, p.model_name, *p.draft, p.draft_name));
  LC_ASSIGN_OR_RETURN(c->press_, PressRunner::create(model, p, *c->backend_));
  if (c->press_) c->hooks_.push_back(c->press_.get());
  const size_t nb = static_cast<size_t>(p.n_batch);
  c->sub_rows_ = std::min<int64_t>(p.n_batch, kLayerRows);
  const size_t ns = static_cast<size_t>(c->sub_rows_);
  const int64_t q_dim = hp.n_head * hp.head_dim;
  const int64_t o_dim = hp.n_head * hp.head_dim_v;
  const int64_t kv_row = hp.n_head_kv * (hp.head_dim + hp.head_dim_v);
  // A chunk larger than the sub-chunks (a ring shard) is refused here, with its size, when its
  // activations would not fit in the memory the machine has free.
  const double chunk_bytes = static_cast<double>(nb) * static_cast<double>(hp.n_embd + q_dim + kv_row + o_dim) *
                             sizeof(float);
  if (nb > static_cast<size_t>(kLayerRows)) {
    const double avail = static_cast<double>(available_memory_bytes());
    if (avail > 0 && chunk_bytes > 0.9 * avail)
      return make_error(ErrorCode::kContextFull,
                        fmt::format("a forward chunk of {} tokens needs {:.0f} MiB of activations and {:.0f} MiB are "
                                    "free: use a smaller batch (-b), or more ranks for a ring shard",
                                    p.n_batch, chunk_bytes / (1 << 20), avail / (1 << 20)));
  }
  try {
    c->x_.resize(nb * static_cast<size_t>(hp.n_embd));
    c->cur_.resize(ns * static_cast<size_t>(std::max({hp.n_embd, q_dim, o_dim})));
    c->q_.resize(nb * static_cast<size_t>(q_dim));
    c->k_.resize(nb * static_cast<size_t>(hp.n_head_kv * hp.head_dim));
    c->v_.resize(nb * static_cast<size_t>(hp.n_head_kv * hp.head_dim_v));
    c->attn_.resize(nb * static_cast<size_t>(o_dim));
    c->gate_.resize(ns * static_cast<size_t>(hp.n_ff));
    c->up_.resize(ns * static_cast<size_t>(hp.n_ff));
    c->norm_.resize(static_cast<size_t>(c->pool_->size() * kFusedRows * hp.n_embd));
    c->pos_.resize(nb);
  } catch (const std::bad_alloc&) {
    return make_error(fmt::format("out of memory allocating activations for batch size {}",
                                  p.n_batch));
  }
  return c;
}

size_t Context::activation_bytes() const {
  return (x_.size() + cur_.size() + q_.size() + k_.size() + v_.size() + attn_.size() +
          gate_.size() + up_.size() + norm_.size()) * sizeof(float) + logits_.capacity() * sizeof(float);
}

void Context::truncate(int64_t n) {
  pending_ = PendingDecode{};
  const int64_t before = n_past_;
  n_past_ = n < n_past_ ? n : n_past_;
  kv_->truncate(n_past_);
  if (sp_ && (n_past_ < before || n_past_ == 0)) sp_->on_truncate(n_past_);
  // Hidden ranges wholly cut off are forgotten; one the cut goes through keeps its head.
  int64_t n_hidden = 0;
  std::vector<HiddenRange> kept;
  for (const HiddenRange& r : hidden_) {
    if (r.first >= n_past_) continue;
    kept.push_back({r.first, std::min(r.count, n_past_ - r.first), r.id});
    n_hidden += kept.back().count;
  }
  hidden_ = std::move(kept);
  const int64_t n_tok = std::max<int64_t>(n_past_ - n_hidden, 0);
  if (static_cast<int64_t>(tokens_.size()) > n_tok) tokens_.resize(static_cast<size_t>(n_tok));
  for (ForwardHooks* h : hooks_) h->on_truncate(n_past_);
}

Expected<HiddenFragment> Context::hide(int64_t first, int64_t count) {
  if (count < 1)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("hide: the range [{}, {}) is empty", first, first + count));
  if (first < 0 || first + count > n_past_)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("hide: the range [{}, {}) is outside the sequence [0, {})", first, first + count,
                                  n_past_));
  for (const HiddenRange& r : hidden_)
    if (first < r.first + r.count && r.first < first + count)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("hide: the range [{}, {}) overlaps the hidden range [{}, {})", first,
                                    first + count, r.first, r.first + r.count));
  // KvPress::observer() is not const; asking does not change the press.
  if (press_ && const_cast<KvPress&>(press_->press()).observer())
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("hide: --kv-press {} accumulates attention statistics per token over the forward "
                                  "passes; hiding tokens would make them wrong",
                                  press_->press().spec()));
  // Where [first, first + count) sits in tokens_: sequence index minus the hidden tokens before it.
  int64_t before = 0;
  for (const HiddenRange& r : hidden_)
    if (r.first < first) before += r.count;
  const int64_t slot = first - before;
  if (slot < 0 || slot + count > static_cast<int64_t>(tokens_.size()))
    return make_error(fmt::format("hide: the token list ({} tokens) does not cover [{}, {})", tokens_.size(),
                                  first, first + count));
  LC_ASSIGN_OR_RETURN(KvFragment kvf, kv_->extract(first, count));
  static std::atomic<uint64_t> next_id{1};
  HiddenFragment f;
  f.first = first;
  f.count = count;
  f.id = next_id.fetch_add(1);
  f.tokens.assign(tokens_.begin() + slot, tokens_.begin() + slot + count);
  f.kv = std::move(kvf);
  tokens_.erase(tokens_.begin() + slot, tokens_.begin() + slot + count);
  const auto at = std::find_if(hidden_.begin(), hidden_.end(), [&](const HiddenRange& r) { return r.first > first; });
  hidden_.insert(at, HiddenRange{first, count, f.id});
  return f;
}

Status Context::restore(HiddenFragment&& f) {
  const auto it = std::find_if(hidden_.begin(), hidden_.end(), [&](const HiddenRange& r) { return r.id == f.id && r.first == f.first; });
  if (it == hidden_.end() || f.count < it->count || static_cast<int64_t>(f.tokens.size()) != f.count ||
      f.kv.first_seq != f.first || f.kv.count != f.count)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("restore: the fragment [{}, {}) is not hidden in this context (restored already, "
                                  "hidden elsewhere, or cut off by a truncate)",
                                  f.first, f.first + f.count));
  if (it->count < f.count) {  // truncated into the range since: only its head comes back
    f.kv.drop_from(f.first + it->count);
    f.tokens.resize(static_cast<size_t>(it->count));
    f.count = it->count;
  }
  LC_TRY(kv_->insert(f.kv));
  int64_t before = 0;
  for (const HiddenRange& r : hidden_)
    if (r.first < f.first) before += r.count;
  tokens_.insert(tokens_.begin() + (f.first - before), f.tokens.begin(), f.tokens.end());
  hidden_.erase(it);
  f = HiddenFragment{};
  return ok_status();
}

void Context::detach_hooks(ForwardHooks* h) { std::erase(hooks_, h); }

const KvPress* Context::press() const { return press_ ? &press_->press() : nullptr; }

double Context::press_seconds() const { return press_ ? press_->seconds() : 0.0; }

void Context::set_answer_tokens(int64_t n) {
  if (press_) press_->set_answer_tokens(n);
}

const std::vector<int32_t>& Context::prompt_kept() const {
  static const std::vector<int32_t> none;
  return press_ ? press_->prompt_kept() : none;
}

Status Context::decode(std::span<const int32_t> tokens, Logits which) { return decode_impl(tokens, which, false); }

Status Context::decode_context(std::span<const int32_t> tokens) { return decode_impl(tokens, Logits::kNone, true); }

Status Context::decode_impl(std::span<const int32_t> in, Logits which, bool context_part) {
  LC_TRY(begin_decode(in, which, context_part));
  for (;;) {
    LC_ASSIGN_OR_RETURN(bool done, decode_step());
    if (done) return ok_status();
  }
}

Expected<int64_t> Context::adopt_prefix(const Context& src, int64_t n) {
  if (&src.model_ != &model_)
    return make_error(ErrorCode::kInvalidArgument, "adopt_prefix: the contexts run different models");
  if (n_past_ != 0 || !tokens_.empty() || pending_.active)
    return make_error(ErrorCode::kInvalidArgument, "adopt_prefix: this context is not empty");
  if (!hooks_.empty() || !src.hooks_.empty())
    return make_error(ErrorCode::kUnsupported, "adopt_prefix: a press keeps state beside the cache");
  if (!hidden_.empty() || !src.hidden_.empty() || src.pending_.active)
    return make_error(ErrorCode::kUnsupported, "adopt_prefix: the source has hidden tokens or a call in progress");
  if (rope_plan_->dynamic() || src.rope_plan_->dynamic())
    return make_error(ErrorCode::kUnsupported, "adopt_prefix: a dynamic rope re-rotates cached keys");
  if (src.backend_->spec() != backend_->spec())
    return make_error(ErrorCode::kUnsupported, "adopt_prefix: the contexts use different attention methods");
  n = std::min<int64_t>(n, static_cast<int64_t>(src.tokens_.size()));
  LC_ASSIGN_OR_RETURN(const int64_t took, kv_->adopt_prefix(*src.kv_, n));
  tokens_.assign(src.tokens_.begin(), src.tokens_.begin() + took);
  n_past_ = took;
  return took;
}

Status Context::begin_decode(std::span<const int32_t> in, Logits which, bool context_part) {
  pending_ = PendingDecode{};
  if (in.empty()) return make_error("decode: no tokens");
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] < 0 || in[i] >= hp_.n_vocab)
      return make_error(fmt::format("token id {} at index {} is outside the vocabulary [0, {})", in[i], i,
                                    hp_.n_vocab));
  }
  const DecodeCall call{in.size() > 1 || context_part, context_part, which};
  std::vector<int32_t> tokens(in.begin(), in.end());
  if (call.prompt) {
    for (ForwardHooks* h : hooks_) {
      std::optional<std::vector<int32_t>> replace;
      LC_TRY(h->before_prompt(*this, tokens, call, replace));
      if (replace) {
        if (replace->empty()) return make_error("decode: a method selected no prompt tokens");
        tokens = std::move(*replace);
      }
    }
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  kv_->set_rope_length_hint(n_past_ + n);  // a dynamic rope rotates a prompt with its whole length's table
  if (n_past_ + n > params_.n_ctx) {
    return make_error(ErrorCode::kContextFull, fmt::format("{} tokens do not fit: {} already in the context of {} "
                                "(raise --ctx-size)",
                                n, n_past_, params_.n_ctx));
  }
  n_outputs_ = which == Logits::kAll ? n : which == Logits::kLast ? 1 : 0;
  logits_.resize(static_cast<size_t>(n_outputs_ * hp_.n_vocab));
  pending_.active = true;
  pending_.tokens = std::move(tokens);
  pending_.call = call;
  return ok_status();
}

Expected<bool> Context::decode_step(int64_t max_tokens) {
  if (!pending_.active) return make_error("decode_step: no decode call is pending (begin_decode first)");
  if (sp_) return decode_sharded();
  PendingDecode& pd = pending_;
  const DecodeCall& call = pd.call;
  const Logits which = call.which;
  const int64_t n = static_cast<int64_t>(pd.tokens.size());
  const int64_t i = pd.done;
  const int64_t m = std::min({params_.n_batch, n - i, max_tokens > 0 ? max_tokens : n});
  Logits w = Logits::kNone;
  if (which == Logits::kAll) w = Logits::kAll;
  if (which == Logits::kLast && i + m == n) w = Logits::kLast;
  auto end_with = [&](const Status& s) -> Expected<bool> {
    pending_ = PendingDecode{};
    return s.error();
  };
  Status st = forward_chunk(pd.tokens.data() + i, m, w, logits_.data() + (w == Logits::kAll ? i * hp_.n_vocab : 0),
                            n_past_);
  if (!st.is_ok()) {
    kv_->truncate(n_past_);  // drop this chunk's partial appends: the cache stays consistent
    return end_with(st);
  }
  return finish_step(i, m);
}

Expected<bool> Context::finish_step(int64_t i, int64_t m) {
  PendingDecode& pd = pending_;
  const DecodeCall& call = pd.call;
  const int64_t n = static_cast<int64_t>(pd.tokens.size());
  auto end_with = [&](const Status& s) -> Expected<bool> {
    pending_ = PendingDecode{};
    return s.error();
  };
  tokens_.insert(tokens_.end(), pd.tokens.begin() + i, pd.tokens.begin() + i + m);
  pd.done = i + m;
  if (call.prompt && i + m < n)
    for (ForwardHooks* h : hooks_)
      if (Status s = h->after_chunk(*this); !s) return end_with(s);
  if (on_chunk_ && !on_chunk_(i + m, n) && i + m < n)
    return end_with(make_error(ErrorCode::kCancelled, fmt::format("cancelled after {} of {} tokens", i + m, n)));
  if (i + m < n) return false;
  const DecodeCall done_call = call;
  pending_ = PendingDecode{};
  for (ForwardHooks* h : hooks_) LC_TRY(done_call.prompt ? h->after_prompt(*this, done_call) : h->after_token(*this));
  return true;
}

Expected<bool> Context::decode_sharded() {
  const DecodeCall call = pending_.call;
  const std::vector<int32_t> tokens = std::move(pending_.tokens);
  pending_ = PendingDecode{};
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (call.which == Logits::kAll)
    return make_error(ErrorCode::kUnsupported, "decode: every token's logits are not kept when the sequence is "
                                               "spread over processes");
  LC_ASSIGN_OR_RETURN(const ShardPlan plan, sp_->plan(n, call));
  const int64_t n_before = n_past_;
  const size_t tokens_before = tokens_.size();
  auto undo = [&](const Status& st) -> Expected<bool> {
    kv_->truncate(n_before);
    n_past_ = n_before;
    tokens_.resize(tokens_before);
    return st.error();
  };
  bool have_logits = false;
  // Kept between calls (no allocation per generated token): one step's tokens, and the call's
  // stored tokens the cache holds now, as (offset of the sequence index from n_before, token).
  std::vector<int32_t>& step_tokens = shard_tokens_;
  std::vector<std::pair<int64_t, int32_t>>& held = shard_held_;
  held.clear();
  std::vector<KvFragment> aside;  // set-aside tokens (ShardStep::hide_*), with their entries
  std::vector<std::pair<int64_t, int32_t>> aside_held;
  // Moves held's entries in [first, first + count) to `to` (or drops them).
  auto take = [&](int64_t first, int64_t count, std::vector<std::pair<int64_t, int32_t>>* to) {
    auto it = std::stable_partition(held.begin(), held.end(), [&](const auto& e) {
      return e.first < first || e.first >= first + count;
    });
    if (to) to->insert(to->end(), it, held.end());
    held.erase(it, held.end());
  };
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const ShardStep& st = plan.steps[i];
    const int64_t rows = st.count + st.tail_count;
    if (st.count < 1 || st.first < 0 || st.first + st.count > n || rows > params_.n_batch || st.tail_count < 0 ||
        (st.tail_count > 0 && (st.tail_first < st.first + st.count || st.tail_first + st.tail_count > n)))
      return undo(make_error(fmt::format("sequence parallel: a step of {} + {} tokens at {} and {} does not fit a "
                                         "call of {} with chunks of {}", st.count, st.tail_count, st.first,
                                         st.tail_first, n, params_.n_batch)));
    if (st.store && n_past_ + rows > params_.n_ctx)
      return undo(make_error(ErrorCode::kContextFull,
                             fmt::format("{} tokens do not fit: {} already in this process's context of {} "
                                         "(raise --ctx-size)", rows, n_past_, params_.n_ctx)));
    const int64_t stored = n_past_ - n_before;
    for (const auto& [first, count] : {std::pair{st.drop_first, st.drop_count}, std::pair{st.hide_first, st.hide_count}})
      if (count < 0 || (count > 0 && (first < 0 || first + count > stored)))
        return undo(make_error(fmt::format("sequence parallel: a step drops or sets aside tokens [{}, {}) of the "
                                           "{} the call stored", first, first + count, stored)));
    if (st.drop_count > 0) {
      auto frag = kv_->extract(n_before + st.drop_first, st.drop_count);
      if (!frag) return undo(frag.error());
      take(st.drop_first, st.drop_count, nullptr);
    }
    if (st.hide_count > 0) {
      auto frag = kv_->extract(n_before + st.hide_first, st.hide_count);
      if (!frag) return undo(frag.error());
      aside.push_back(std::move(*frag));
      take(st.hide_first, st.hide_count, &aside_held);
    }
    if (st.restore) {
      for (const KvFragment& f : aside)
        if (Status s = kv_->insert(f); !s) return undo(s);
      aside.clear();
      held.insert(held.end(), aside_held.begin(), aside_held.end());
      aside_held.clear();
    }
    step_tokens.assign(tokens.begin() + st.first, tokens.begin() + st.first + st.count);
    step_tokens.insert(step_tokens.end(), tokens.begin() + st.tail_first,
                       tokens.begin() + st.tail_first + st.tail_count);
    const int64_t end = st.tail_count > 0 ? st.tail_first + st.tail_count : st.first + st.count;
    const Logits w = call.which == Logits::kLast && end == n ? Logits::kLast : Logits::kNone;
    const int64_t seq0 = n_past_ - n_before;
    if (Status s = forward_chunk(step_tokens.data(), rows, w, logits_.data(), st.pos0, &st); !s) return undo(s);
    if (st.store)
      for (int64_t j = 0; j < rows; ++j) held.emplace_back(seq0 + j, step_tokens[static_cast<size_t>(j)]);
    have_logits |= w == Logits::kLast;
  }
  if (!aside.empty())
    return undo(make_error("sequence parallel: a plan set tokens aside and never brought them back"));
  // tokens_ lists what the cache holds, in sequence order.
  std::sort(held.begin(), held.end());
  for (const auto& e : held) tokens_.push_back(e.second);
  if (call.which == Logits::kLast)
    if (Status s = sp_->share_logits(logits_.data(), hp_.n_vocab, have_logits); !s) return undo(s);
  return true;
}

Status Context::set_sequence_parallel(SequenceParallel* sp) {
  if (sp == nullptr) {
    sp_ = nullptr;
    backend_->keep_partial_lse(false);
    return ok_status();
  }
  if (n_past_ != 0 || pending_.active) return make_error("sequence parallel: the context is not empty");
  if (press_ || !hooks_.empty())
    return make_error(ErrorCode::kUnsupported, "sequence parallel: a KV press (--kv-press) runs on one process's "
                                               "cache only");
  if (rope_plan_->dynamic())
    return make_error(ErrorCode::kUnsupported, "sequence parallel: a dynamic rope re-rotates the whole cache as "
                                               "it grows; give a static one");
  if (has_query_weights()) return make_error(ErrorCode::kUnsupported, "sequence parallel: qTTT is not supported");
  if (!backend_->supports_detached())
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("sequence parallel: attention {} cannot attend a shard that does not hold its "
                                  "queries (use dense, fixed, quest or quest_fast)", backend_->spec()));
  backend_->keep_partial_lse(true);
  sp_ = sp;
  return ok_status();
}

Status Context::evaluate_scratch(std::span<const int32_t> tokens) {
  if (sp_) return make_error(ErrorCode::kUnsupported, "evaluate_scratch: the sequence is spread over processes");
  const int64_t P = n_past_, n = static_cast<int64_t>(tokens.size());
  if (P + n > params_.n_ctx) return make_error(ErrorCode::kContextFull, "evaluate_scratch: the tokens do not fit");
  Status st = ok_status();
  for (int64_t i = 0; i < n && st; i += params_.n_batch)
    st = forward_chunk(tokens.data() + i, std::min(params_.n_batch, n - i), Logits::kNone, nullptr, n_past_);
  kv_->truncate(P);
  n_past_ = P;
  return st;
}

void Context::prepare_qkv_row(const LayerWeights& L, float* qt, float* kt, float* vt, const int32_t* pos) const {
  const HParams& hp = hp_;
  const int64_t q_dim = hp.n_head * hp.head_dim, k_dim = hp.n_head_kv * hp.head_dim,
                v_dim = hp.n_head_kv * hp.head_dim_v;
  if (L.bq) kernels::add_inplace(qt, L.bq, q_dim);
  if (L.bk) kernels::add_inplace(kt, L.bk, k_dim);
  if (L.bv) kernels::add_inplace(vt, L.bv, v_dim);
  if (L.q_norm) {
    for (int64_t h = 0; h < hp.n_head; ++h)
      kernels::rmsnorm(qt + h * hp.head_dim, L.q_norm, qt + h * hp.head_dim, hp.head_dim, hp.rms_eps);
    for (int64_t h = 0; h < hp.n_head_kv; ++h)
      kernels::rmsnorm(kt + h * hp.head_dim, L.k_norm, kt + h * hp.head_dim, hp.head_dim, hp.rms_eps);
  }
  // Queries and keys go to the attention backend and the cache before RoPE: the cache
  // rotates keys with its table, the backend rotates queries at the positions it uses.
  rope_plan_->scale_q(qt, 1, hp.n_head, hp.head_dim, pos);
}

std::vector<Status> Context::decode_batch(std::span<Context* const> ctxs, std::span<const int32_t> tokens) {
  return batch_forward(ctxs, tokens, nullptr, 0, nullptr);
}

Context::MixedResult Context::decode_mixed(std::span<Context* const> ctxs, std::span<const int32_t> tokens,
                                           Context& pf, int64_t max_tokens) {
  MixedResult r{{}, false, false};
  if (std::find(ctxs.begin(), ctxs.end(), &pf) != ctxs.end()) {
    r.rows.assign(ctxs.size(), make_error(ErrorCode::kInvalidArgument,
                                          "decode_mixed: the prefill context is also a decode row"));
    r.prefill = make_error(ErrorCode::kInvalidArgument, "decode_mixed: the prefill context is also a decode row");
    return r;
  }
  if (!pf.pending_.active) {
    r.rows = decode_batch(ctxs, tokens);
    r.prefill = make_error("decode_step: no decode call is pending (begin_decode first)");
    return r;
  }
  const int64_t B = static_cast<int64_t>(ctxs.size());
  const PendingDecode& pd = pf.pending_;
  const int64_t left = static_cast<int64_t>(pd.tokens.size()) - pd.done;
  int64_t m = std::min({pf.params_.n_batch, left, max_tokens > 0 ? max_tokens : left});
  const Context* lead = B > 0 ? ctxs[0] : nullptr;
  bool can = lead != nullptr && pf.sp_ == nullptr && pd.call.which != Logits::kAll && &lead->model_ == &pf.model_;
  if (can) {
    m = std::min(m, lead->params_.n_batch - B);
    can = m > 0 && static_cast<int64_t>(tokens.size()) == B;
  }
  if (!can) {
    if (B > 0) r.rows = decode_batch(ctxs, tokens);
    r.prefill = pf.decode_step(max_tokens);
    return r;
  }
  r.rows = batch_forward(ctxs, tokens, &pf, m, &r.prefill);
  r.merged = true;
  return r;
}

std::vector<Status> Context::batch_forward(std::span<Context* const> ctxs, std::span<const int32_t> tokens,
                                           Context* pf, int64_t pf_m, Expected<bool>* pf_out) {
  const int64_t B = static_cast<int64_t>(ctxs.size());
  std::vector<Status> out(ctxs.size(), ok_status());
  if (B == 0) return out;
  auto fail_all = [&](const std::string& msg) {
    for (auto& s : out) s = make_error(ErrorCode::kInvalidArgument, msg);
    return out;
  };
  if (static_cast<int64_t>(tokens.size()) != B)
    return fail_all(fmt::format("decode_batch: {} tokens for {} sequences", tokens.size(), B));
  Context& lead = *ctxs[0];
  const HParams& hp = lead.hp_;
  if (B > lead.params_.n_batch)
    return fail_all(fmt::format("decode_batch: {} sequences exceed the batch size {}", B, lead.params_.n_batch));
  std::vector<char> live(ctxs.size(), 1);
  std::vector<char> dropped(ctxs.size(), 0);  // rows whose attention failed in this layer
  for (int64_t i = 0; i < B; ++i) {
    Context* c = ctxs[static_cast<size_t>(i)];
    Status& s = out[static_cast<size_t>(i)];
    if (c == nullptr || &c->model_ != &lead.model_) {
      s = make_error(ErrorCode::kInvalidArgument, "decode_batch: every sequence must run on the same model");
    } else if (std::find(ctxs.begin(), ctxs.begin() + i, c) != ctxs.begin() + i) {
      s = make_error(ErrorCode::kInvalidArgument, "decode_batch: a context appears twice in one batch");
    } else if (c->pending_.active) {
      s = make_error(ErrorCode::kInvalidArgument, "decode_batch: the context has a decode call pending");
    } else if (c->sp_) {
      s = make_error(ErrorCode::kUnsupported, "decode_batch: the sequence is spread over processes");
    } else if (tokens[static_cast<size_t>(i)] < 0 || tokens[static_cast<size_t>(i)] >= hp.n_vocab) {
      s = make_error(ErrorCode::kInvalidArgument, fmt::format("token id {} is outside the vocabulary [0, {})",
                                                              tokens[static_cast<size_t>(i)], hp.n_vocab));
    } else if (c->n_past_ + 1 > c->params_.n_ctx) {
      s = make_error(ErrorCode::kContextFull, fmt::format("1 token does not fit: {} already in the context of {} "
                                                          "(raise --ctx-size)", c->n_past_, c->params_.n_ctx));
    }
    if (!s) live[static_cast<size_t>(i)] = 0;
  }
  const int64_t E = hp.n_embd, q_dim = hp.n_head * hp.head_dim, k_dim = hp.n_head_kv * hp.head_dim,
                v_dim = hp.n_head_kv * hp.head_dim_v, o_dim = hp.n_head * hp.head_dim_v;
  const Model& model = lead.model_;
  ThreadPool& pool = *lead.pool_;
  const int64_t S = lead.sub_rows_;
  // The prefill chunk (decode_mixed): rows B .. B + P - 1 are tokens [pf_i, pf_i + P) of pf's
  // pending call, at positions pf->n_past_ + t. It fails alone (pf_live), as a decode row does.
  const int64_t P = pf ? pf_m : 0;
  const int64_t R = B + P;
  const int64_t pf_i = pf ? pf->pending_.done : 0;
  const Logits pf_which = pf && pf_i + P == static_cast<int64_t>(pf->pending_.tokens.size())
                              ? pf->pending_.call.which : Logits::kNone;  // kLast on the last chunk
  bool pf_live = pf != nullptr;
  Status pf_status = ok_status();
  float* x = lead.x_.data();
  float* cur = lead.cur_.data();
  std::vector<int32_t> pos(static_cast<size_t>(R));
  bool any_wq = false;
  for (int64_t i = 0; i < B; ++i) {
    Context* c = ctxs[static_cast<size_t>(i)];
    const int32_t id = live[static_cast<size_t>(i)] ? tokens[static_cast<size_t>(i)] : 0;
    kernels::dequantize_row(model.tok_embd().type, model.tok_embd().row(id), x + i * E, E);
    pos[static_cast<size_t>(i)] = live[static_cast<size_t>(i)] ? static_cast<int32_t>(c->n_past_) : 0;
    if (live[static_cast<size_t>(i)] && c->has_query_weights()) any_wq = true;
  }
  for (int64_t t = 0; t < P; ++t) {
    const int32_t id = pf->pending_.tokens[static_cast<size_t>(pf_i + t)];
    kernels::dequantize_row(model.tok_embd().type, model.tok_embd().row(id), x + (B + t) * E, E);
    pos[static_cast<size_t>(B + t)] = static_cast<int32_t>(pf->n_past_ + t);
  }
  const bool pf_wq = pf && pf->has_query_weights();
  auto rows = [&](int64_t count, auto&& fn) { for_rows(pool, count, fn); };
  float* q = lead.q_.data();
  float* k = lead.k_.data();
  float* v = lead.v_.data();
  float* attn = lead.attn_.data();
  // Decode-sized with one W_q for every row: each layer's region runs on into the next one's q, k, v.
  const bool run_on = R <= kFusedRows && !any_wq && !pf_wq;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = model.layers()[static_cast<size_t>(il)];
    for (int64_t s = 0; s < R && (il == 0 || !run_on); s += S) {  // rows [s, s + m) of the batch, normed into cur
      const int64_t m = std::min(S, R - s);
      if (!any_wq && !pf_wq && m <= kFusedRows) {
        norm_qkv_fused(hp, {&L, &L.wq, q + s * q_dim, k + s * k_dim, v + s * v_dim}, m, x + s * E, lead.norm_.data(), pool);
        continue;
      }
      rows(m, [&](int64_t t) { kernels::rmsnorm(x + (s + t) * E, L.attn_norm, cur + t * E, E, hp.rms_eps); });
      if (!any_wq && !pf_wq) {
        const TensorView* w[3] = {&L.wq, &L.wk, &L.wv};
        float* y[3] = {q + s * q_dim, k + s * k_dim, v + s * v_dim};
        kernels::matmul_multi(w, y, cur, m, pool);
        continue;
      }
      // qTTT's trained W_q differs per sequence: the query rows go one by one.
      const TensorView* w[2] = {&L.wk, &L.wv};
      float* y[2] = {k + s * k_dim, v + s * v_dim};
      kernels::matmul_multi(w, y, cur, m, pool);
      for (int64_t i = s; i < std::min(B, s + m); ++i) {
        const Context* c = ctxs[static_cast<size_t>(i)];
        const TensorView& wq = live[static_cast<size_t>(i)] && c->has_query_weights()
                                   ? c->wq_views_[static_cast<size_t>(il)] : L.wq;
        kernels::matmul(wq, cur + (i - s) * E, 1, q + i * q_dim, pool);
      }
      const int64_t p0 = std::max(B, s);  // the prefill rows of this sub-chunk
      if (p0 < s + m)
        kernels::matmul(pf_wq ? pf->wq_views_[static_cast<size_t>(il)] : L.wq, cur + (p0 - s) * E, s + m - p0,
                        q + p0 * q_dim, pool);
    }
    auto fail = [&](int64_t i, const Status& s) {  // the cache is cut back after the parallel part
      out[static_cast<size_t>(i)] = s;
      live[static_cast<size_t>(i)] = 0;
      dropped[static_cast<size_t>(i)] = 1;
    };
    auto cut_back = [&] {  // serial: truncating returns blocks to the (maybe shared) pool
      for (int64_t i = 0; i < B; ++i)
        if (dropped[static_cast<size_t>(i)]) {
          ctxs[static_cast<size_t>(i)]->kv_->truncate(ctxs[static_cast<size_t>(i)]->n_past_);
          dropped[static_cast<size_t>(i)] = 0;
        }
    };
    // Each row's K/V go into its own cache first, one row after the other: the caches may
    // take their blocks from one shared pool (a server's slots), which is not thread-safe.
    for (int64_t i = 0; i < B; ++i) {
      if (!live[static_cast<size_t>(i)]) continue;
      Context& c = *ctxs[static_cast<size_t>(i)];
      float* qi = q + i * q_dim;
      const int32_t* pi = &pos[static_cast<size_t>(i)];
      c.prepare_qkv_row(L, qi, k + i * k_dim, v + i * v_dim, pi);
      for (ForwardHooks* h : c.hooks_) h->on_queries(il, qi, pi, 1);
      if (Status s = c.kv_->append(il, 1, k + i * k_dim, v + i * v_dim, pi); !s) fail(i, s);
    }
    cut_back();
    // Row i's attention over its own cache. With at least as many rows as threads, the rows
    // are spread over the threads, each running its rows' backends single-threaded (one
    // parallel region per layer instead of one per row); otherwise each row uses the pool.
    auto attend = [&](int64_t i, ThreadPool& tp) {
      if (live[static_cast<size_t>(i)]) {
        Context& c = *ctxs[static_cast<size_t>(i)];
        float* qi = q + i * q_dim;
        const int32_t* pi = &pos[static_cast<size_t>(i)];
        if (Status s = c.backend_->forward(il, 1, qi, pi, *c.kv_, attn + i * o_dim, tp); !s) {
          fail(i, s);
        } else {
          for (ForwardHooks* h : c.hooks_) h->on_attention(c, il, qi, pi, 1);
          return;
        }
      }
      std::fill(attn + i * o_dim, attn + (i + 1) * o_dim, 0.0f);
    };
    if (pool.size() > 1 && B >= pool.size()) {
      pool.for_each_dynamic(B, [&](int64_t i, int) {
        thread_local ThreadPool serial(1);
        attend(i, serial);
      });
    } else {
      for (int64_t i = 0; i < B; ++i) attend(i, pool);
    }
    cut_back();
    // The prefill chunk's rows, as forward_chunk runs them (its own cache, backend and hooks).
    if (pf_live)
      if (Status s = pf->attend_rows(il, L, P, q + B * q_dim, k + B * k_dim, v + B * v_dim, pos.data() + B,
                                     attn + B * o_dim, pool);
          !s)
        pf_live = false, pf_status = s;
    if (P > 0 && !pf_live) std::fill(attn + B * o_dim, attn + R * o_dim, 0.0f);
    if (!run_on) {
      finish_layer(hp, L, R, S, x, cur, attn, lead.gate_.data(), lead.up_.data(), lead.norm_.data(), pool);
      continue;
    }
    NextQkv next;
    if (il + 1 < hp.n_layer) {
      const LayerWeights& Ln = model.layers()[static_cast<size_t>(il + 1)];
      next = {&Ln, &Ln.wq, q, k, v};
    }
    finish_rows_fused(hp, L, R, x, cur, attn, lead.gate_.data(), lead.up_.data(), lead.norm_.data(), pool, next);
  }
  // Output rows: the B decode rows, then the prefill chunk's last row when its call wants it.
  const int64_t pf_out_rows = pf_live && pf_which == Logits::kLast ? 1 : 0;
  const int64_t O = B + pf_out_rows;
  std::vector<float>& logits = lead.batch_logits_;  // kept between steps: no allocation per token
  try {
    logits.resize(static_cast<size_t>(O * hp.n_vocab));
  } catch (const std::bad_alloc&) {
    for (int64_t i = 0; i < B; ++i)
      if (live[static_cast<size_t>(i)]) {
        ctxs[static_cast<size_t>(i)]->kv_->truncate(ctxs[static_cast<size_t>(i)]->n_past_);
        out[static_cast<size_t>(i)] = make_error("decode_batch: out of memory for the logits");
        live[static_cast<size_t>(i)] = 0;
      }
    if (pf_live) pf_live = false, pf_status = make_error("decode_batch: out of memory for the logits");
  }
  if (logits.size() == static_cast<size_t>(O * hp.n_vocab))
    for (int64_t s = 0; s < O; s += S) {  // output row i is batch row i, the last one row R - 1
      const int64_t m = std::min(S, O - s);
      rows(m, [&](int64_t i) {
        const int64_t r = s + i < B ? s + i : R - 1;
        kernels::rmsnorm(x + r * E, model.output_norm(), cur + i * E, E, hp.rms_eps);
      });
      kernels::matmul(model.output(), cur, m, logits.data() + s * hp.n_vocab, pool);
    }
  for (int64_t i = 0; i < B; ++i) {
    if (!live[static_cast<size_t>(i)]) continue;
    Context& c = *ctxs[static_cast<size_t>(i)];
    c.n_past_ += 1;
    c.tokens_.push_back(tokens[static_cast<size_t>(i)]);
    c.n_outputs_ = 1;
    c.logits_.assign(logits.begin() + i * hp.n_vocab, logits.begin() + (i + 1) * hp.n_vocab);
    for (ForwardHooks* h : c.hooks_)
      if (Status s = h->after_token(c); !s) {
        out[static_cast<size_t>(i)] = s;
        break;
      }
  }
  if (pf) {
    if (!pf_live) {
      pf->kv_->truncate(pf->n_past_);  // as decode_step: drop the chunk's partial appends
      pf->pending_ = PendingDecode{};
      *pf_out = pf_status.error();
    } else {
      if (pf_out_rows)
        std::copy(logits.begin() + B * hp.n_vocab, logits.begin() + (B + 1) * hp.n_vocab, pf->logits_.begin());
      pf->n_past_ += P;
      *pf_out = pf->finish_step(pf_i, P);
    }
  }
  return out;
}

Status Context::attend_rows(int64_t il, const LayerWeights& L, int64_t n, float* q, float* k, float* v,
                            const int32_t* pos, float* attn, ThreadPool& pool, const ShardStep* shard) {
  const int64_t q_dim = hp_.n_head * hp_.head_dim, k_dim = hp_.n_head_kv * hp_.head_dim,
                v_dim = hp_.n_head_kv * hp_.head_dim_v;
  for_rows(pool, n, [&](int64_t t) { prepare_qkv_row(L, q + t * q_dim, k + t * k_dim, v + t * v_dim, pos + t); });
  for (ForwardHooks* h : hooks_) h->on_queries(il, q, pos, n);
  const bool store = shard == nullptr || shard->store;
  if (store) LC_TRY(kv_->append(il, n, k, v, pos));
  if (shard) {
    backend_->set_detached(!store);
    const Status st = backend_->forward(il, n, q, pos, *kv_, attn, pool);
    backend_->set_detached(false);
    LC_TRY(st);
    if (shard->merge) LC_TRY(sp_->merge_attention(*this, il, n, q, k, v, pos, attn, backend_->partial_lse()));
  } else {
    LC_TRY(backend_->forward(il, n, q, pos, *kv_, attn, pool));
  }
  for (ForwardHooks* h : hooks_) h->on_attention(*this, il, q, pos, n);
  return ok_status();
}

Status Context::forward_chunk(const int32_t* tokens, int64_t n, Logits which, float* logits, int64_t pos0,
                              const ShardStep* shard) {
  const HParams& hp = hp_;
  const int64_t E = hp.n_embd;
  float* x = x_.data();
  float* cur = cur_.data();

  // A sequence-parallel step's second run of tokens (its tail) sits at its own positions.
  const int64_t head = shard && shard->tail_count > 0 ? shard->count : n;
  const int64_t tail_pos0 = shard ? pos0 + (shard->tail_first - shard->first) : 0;
  for (int64_t t = 0; t < n; ++t) {
    const TensorView& te = model_.tok_embd();
    kernels::dequantize_row(te.type, te.row(tokens[t]), x + t * E, E);
    pos_[static_cast<size_t>(t)] = static_cast<int32_t>(t < head ? pos0 + t : tail_pos0 + (t - head));
  }

  auto rows = [&](int64_t count, auto&& fn) { for_rows(*pool_, count, fn); };
  const int64_t q_dim = hp.n_head * hp.head_dim, k_dim = hp.n_head_kv * hp.head_dim,
                v_dim = hp.n_head_kv * hp.head_dim_v;
  const int64_t S = sub_rows_;

  const bool store = shard == nullptr || shard->store;
  auto wq_of = [&](int64_t il) -> const TensorView* {
    return wq_views_.empty() ? &model_.layers()[static_cast<size_t>(il)].wq : &wq_views_[static_cast<size_t>(il)];
  };
  bool qkv_ready = false;  // the previous layer's region computed this layer's q, k, v
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = model_.layers()[static_cast<size_t>(il)];
    const TensorView* w[3] = {wq_of(il), &L.wk, &L.wv};
    for (int64_t s = 0; s < n && !qkv_ready; s += S) {
      const int64_t m = std::min(S, n - s);
      if (m <= kFusedRows) {
        norm_qkv_fused(hp, {&L, w[0], q_.data() + s * q_dim, k_.data() + s * k_dim, v_.data() + s * v_dim}, m,
                       x + s * E, norm_.data(), *pool_);
        continue;
      }
      rows(m, [&](int64_t t) { kernels::rmsnorm(x + (s + t) * E, L.attn_norm, cur + t * E, E, hp.rms_eps); });
      float* y[3] = {q_.data() + s * q_dim, k_.data() + s * k_dim, v_.data() + s * v_dim};
      kernels::matmul_multi(w, y, cur, m, *pool_);
    }
    LC_TRY(attend_rows(il, L, n, q_.data(), k_.data(), v_.data(), pos_.data(), attn_.data(), *pool_, shard));
    if (n > kFusedRows) {
      finish_layer(hp, L, n, S, x, cur, attn_.data(), gate_.data(), up_.data(), norm_.data(), *pool_);
      continue;
    }
    NextQkv next;  // decode-sized: the region runs on into the next layer's q, k, v
    if (il + 1 < hp.n_layer)
      next = {&model_.layers()[static_cast<size_t>(il + 1)], wq_of(il + 1), q_.data(), k_.data(), v_.data()};
    finish_rows_fused(hp, L, n, x, cur, attn_.data(), gate_.data(), up_.data(), norm_.data(), *pool_, next);
    qkv_ready = next.L != nullptr;
  }
  if (store) n_past_ += n;

  if (which == Logits::kNone) return ok_status();
  const int64_t first = which == Logits::kAll ? 0 : n - 1;
  const int64_t n_out = n - first;
  for (int64_t s = 0; s < n_out; s += S) {
    const int64_t m = std::min(S, n_out - s);
    rows(m, [&](int64_t i) {
      kernels::rmsnorm(x + (first + s + i) * E, model_.output_norm(), cur + i * E, E, hp.rms_eps);
    });
    kernels::matmul(model_.output(), cur, m, logits + s * hp.n_vocab, *pool_);
  }
  return ok_status();
}

void Context::set_query_weights(Buffer<float> wq) {
  const int64_t q_dim = hp_.n_head * hp_.head_dim;
  LC_CHECK(wq.size() == static_cast<size_t>(hp_.n_layer * q_dim * hp_.n_embd));
  wq_override_ = std::move(wq);
  wq_views_.assign(static_cast<size_t>(hp_.n_layer), TensorView{});
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    TensorView& v = wq_views_[static_cast<size_t>(il)];
    v.data = wq_override_.data() + il * q_dim * hp_.n_embd;
    v.type = DType::F32;
    v.ne[0] = hp_.n_embd;
    v.ne[1] = q_dim;
  }
}

namespace {
constexpr uint32_t kCtxStateMagic = 0x3243434cu;  // "LCC2"
}  // namespace

Status Context::save_state(std::ostream& out) const {
  using namespace bin;
  if (!hidden_.empty())
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("cannot save a context while {} fragment(s) are hidden (restore them first)",
                                  hidden_.size()));
  put(out, kCtxStateMagic);
  put<int64_t>(out, n_past_);
  put_vec(out, tokens_);
  put<int64_t>(out, n_outputs_);
  put_vec(out, logits_);
  put<uint8_t>(out, press_ ? 1 : 0);
  if (press_) LC_TRY(press_->save(out));
  put_array(out, wq_override_.data(), wq_views_.empty() ? 0 : wq_override_.size());
  if (!out) return make_error(ErrorCode::kIo, "context: write error while saving the state");
  return kv_->write_state(out);
}

Status Context::load_state(std::istream& in) {
  using namespace bin;
  clear();
  clear_query_weights();
  auto fail = [&](Status st) {
    clear();
    clear_query_weights();
    return st;
  };
  auto bad = [&](const char* what) { return fail(make_error(ErrorCode::kBadFile, fmt::format("saved context: {}", what))); };
  uint32_t magic = 0;
  int64_t n_past = 0, n_outputs = 0;
  uint8_t has_press = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  if (!get(in, magic) || magic != kCtxStateMagic) return bad("not a saved context (bad magic)");
  const uint64_t max_tokens = static_cast<uint64_t>(params_.n_ctx);
  if (!get(in, n_past) || n_past < 0 || n_past > params_.n_ctx) {
    if (n_past > params_.n_ctx)
      return make_error(ErrorCode::kContextFull,
                        fmt::format("the saved session holds {} tokens but the context holds {} (raise --ctx-size)",
                                    n_past, params_.n_ctx));
    return bad("truncated header");
  }
  if (!get_array(in, tokens, max_tokens) || static_cast<int64_t>(tokens.size()) != n_past) return bad("bad token list");
  for (int32_t t : tokens)
    if (t < 0 || t >= hp_.n_vocab) return bad("a token id is outside the vocabulary");
  if (!get(in, n_outputs) || n_outputs < 0 || n_outputs > n_past) return bad("bad output count");
  if (!get_array(in, logits, static_cast<uint64_t>(n_outputs * hp_.n_vocab)) ||
      static_cast<int64_t>(logits.size()) != n_outputs * hp_.n_vocab)
    return bad("bad logits");
  if (!get(in, has_press)) return bad("truncated header");
  if ((has_press != 0) != (press_ != nullptr))
    return fail(make_error(ErrorCode::kInvalidArgument, press_ ? "the saved session was made without --kv-press"
                                                               : "the saved session was made with a --kv-press"));
  if (press_)
    if (Status st = press_->load(in, params_.n_ctx); !st) return fail(st);
  Buffer<float> wq;
  const uint64_t wq_n = static_cast<uint64_t>(hp_.n_layer * hp_.n_head * hp_.head_dim * hp_.n_embd);
  if (!get_array(in, wq, wq_n) || (wq.size() != 0 && wq.size() != wq_n)) return bad("bad query weights");
  if (Status st = kv_->read_state(in); !st) return fail(st);
  // A fresh backend: it summarises the restored cache from scratch.
  if (Status st = set_attention(backend_->spec()); !st) return fail(st);
  n_past_ = n_past;
  tokens_ = std::move(tokens);
  n_outputs_ = n_outputs;
  logits_ = std::move(logits);
  if (wq.size() != 0) set_query_weights(std::move(wq));
  return ok_status();
}

void Context::clear_query_weights() {
  wq_views_.clear();
  wq_override_.resize(0);
}

Status Context::check_rope_backend(const AttentionBackend& b) const {
  if (!rope_plan_->dynamic() || rope_plan_->rerotates_cache()) return ok_status();
  const AttentionCaps caps = b.caps();
  if (caps.unrotates_keys || caps.relabels_positions)
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("--attn {} with --rope {}: the attention rotates cached keys with one table, but "
                                  "with cache=append each key keeps the table of the length it was appended at; "
                                  "use dynamic-ntk:cache=rerotate (with --kv-type-k f32)",
                                  caps.spec, rope_plan_->describe()));
  return ok_status();
}

Status Context::set_attention(std::string_view spec) {
  const AttnShape as = attn_shape_of(hp_);
  auto attn = make_attention_backend(spec, as);
  if (!attn) return make_error("--attn: " + attn.error().message);
  for (ForwardHooks* h : hooks_) LC_TRY(h->attach_backend(**attn));
  if (sp_) {
    if (!(*attn)->supports_detached())
      return make_error(ErrorCode::kUnsupported,
                        fmt::format("--attn: {} cannot attend a shard that does not hold its queries (the sequence "
                                    "is spread over processes: use dense, fixed, quest or quest_fast)", (*attn)->spec()));
    (*attn)->keep_partial_lse(true);
  }
  LC_TRY(check_rope_backend(**attn));
  LC_TRY((*attn)->attach(*kv_));
  backend_ = std::move(*attn);
  params_.attn = std::string(spec);
  return ok_status();
}

}  // namespace lc
