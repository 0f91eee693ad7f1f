// Query-only test-time training over a frozen KV cache (see qttt.h for the paper and formula).
//
// Forward of a span, per layer, with the span's own activations only:
//   h = rmsnorm(x) ; q = RoPE(c(pos) * qnorm(W_q h + b_q)) ; o = softmax(scale q K^T) V over the
//   cached keys with index <= the token's ; x += W_o o ; x += W_down swiglu(W_gate h2, W_up h2)
// Backward: the same graph in reverse, with K and V constants. The linear, RMSNorm and SwiGLU
// passes, the cross-entropy and Adam are the trainer's (src/grad); the attention over the paged
// cache is here. Its backward recomputes the probabilities from the saved log-sum-exp (as
// FlashAttention does), so no [S, n_ctx] matrix is stored: dS = P * (dO V^T - rowsum(dO * O)),
// dq = scale * dS K.
#include "runtime/qttt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>

#include "attention/exec.h"
#include "core/sys.h"
#include "grad/adam.h"
#include "grad/ops.h"
#include "kernels/kernels.h"

namespace lc {

// ---------------------------------------------------------------- spec

std::string QtttParams::spec() const {
  return fmt::format("steps={},lr={:g},span={}", steps, lr, span);
}

Expected<QtttParams> parse_qttt(std::string_view text) {
  QtttParams p;
  if (text.empty() || text == "none") {
    p.steps = 0;
    return p;
  }
  const std::string all(text);
  bool seen_steps = false, seen_lr = false, seen_span = false;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (item.empty() || eq == std::string_view::npos || eq == 0)
      return make_error(fmt::format("--qttt '{}': '{}' is not key=value (expected steps=N,lr=X,span=S)", all,
                                    item));
    const std::string key(item.substr(0, eq)), val(item.substr(eq + 1));
    char* end = nullptr;
    if (key == "steps" || key == "span") {
      bool& seen = key == "steps" ? seen_steps : seen_span;
      if (seen) return make_error(fmt::format("--qttt '{}': key '{}' given twice", all, key));
      seen = true;
      errno = 0;
      const long long v = std::strtoll(val.c_str(), &end, 10);
      if (val.empty() || *end != '\0' || errno != 0)
        return make_error(fmt::format("--qttt '{}': {} expects an integer, got '{}'", all, key, val));
      if (key == "steps") {
        if (v < 0 || v > 1000000)
          return make_error(fmt::format("--qttt '{}': steps={} must be in [0, 1000000]", all, v));
        p.steps = v;
      } else {
        if (v < 2 || v > (int64_t{1} << 24))
          return make_error(fmt::format("--qttt '{}': span={} must be at least 2 (a span of S tokens gives S-1 "
                                        "next-token predictions)", all, v));
        p.span = v;
      }
    } else if (key == "lr") {
      if (seen_lr) return make_error(fmt::format("--qttt '{}': key 'lr' given twice", all));
      seen_lr = true;
      const double v = std::strtod(val.c_str(), &end);
      if (val.empty() || *end != '\0' || !std::isfinite(v))
        return make_error(fmt::format("--qttt '{}': lr expects a number, got '{}'", all, val));
      if (v <= 0) return make_error(fmt::format("--qttt '{}': lr={} must be > 0", all, val));
      p.lr = v;
    } else {
      return make_error(fmt::format("--qttt '{}': unknown key '{}' (accepted: steps, lr, span)", all, key));
    }
  }
  return p;
}

// The distance ceiling of the context's attention: 0 for dense, W for `fixed:distance=W` read
// whole (no budget); an error for every backend that reads a subset of the cache.
static Expected<int64_t> qttt_fixed_distance(const Context& ctx) {
  const AttentionCaps caps = ctx.attention().caps();
  const std::string& spec = caps.spec;
  if (caps.exact) return int64_t{0};
  if (caps.fixed_distance > 0 && caps.reads_all_keys) return caps.fixed_distance;
  return make_error(ErrorCode::kUnsupported, fmt::format("--qttt needs --attn dense or fixed (without budget): its gradient is that of exact "
                              "attention over every cached token, while --attn {} reads (or keeps) a subset, so the "
                              "trained queries would answer through a different attention",
                              spec));
}

Status check_qttt_context(const Context& ctx) {
  if (ctx.press())
    return make_error(fmt::format("--qttt cannot run with --kv-press {}: the press removes cache entries, and qTTT "
                                  "trains the queries against the whole frozen cache (every token a span token attends "
                                  "to); use one or the other",
                                  ctx.press()->spec()));
  LC_ASSIGN_OR_RETURN(const int64_t distance, qttt_fixed_distance(ctx));
  (void)distance;
  if (ctx.kv().mixed_rope())
    return make_error("--qttt: the cached keys were rotated with different tables (dynamic-ntk:cache=append), and "
                      "qTTT's gradient rotates them back with one; use dynamic-ntk:cache=rerotate");
  return ok_status();
}

Status check_qttt_span(const QtttParams& p, int64_t n_context) {
  if (p.enabled() && p.span > n_context)
    return make_error(fmt::format("--qttt span={} is longer than the context ({} tokens): use a span of at most "
                                  "{}",
                                  p.span, n_context, std::max<int64_t>(n_context, 2)));
  return ok_status();
}

// ---------------------------------------------------------------- trainer

namespace {

// Tiles of one layer's span attention: KV head hk, span tokens [t0, t0 + nt). A tile's rows are
// its tokens x the g query heads of the group (row (t - t0) * g + j), at most kRows of them.
constexpr int64_t kRows = 64;

struct Tile {
  int64_t hk, t0, nt;
};

std::vector<Tile> make_tiles(int64_t Hkv, int64_t g, int64_t S) {
  const int64_t nt = std::max<int64_t>(1, kRows / g);
  std::vector<Tile> tiles;
  for (int64_t hk = 0; hk < Hkv; ++hk)
    for (int64_t t0 = 0; t0 < S; t0 += nt) tiles.push_back({hk, t0, std::min(nt, S - t0)});
  return tiles;
}

void grow(Buffer<float>& b, int64_t n) {
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
}

// Layer il's slice of a [L, stride] buffer.
float* at(Buffer<float>& b, int64_t il, int64_t stride) { return b.data() + il * stride; }

}  // namespace

struct QueryTrainer::Impl {
  Context* ctx = nullptr;
  const Model* model = nullptr;
  int64_t E = 0, H = 0, Hkv = 0, g = 0, d = 0, dv = 0, q_dim = 0, o_dim = 0, ff = 0, V = 0, L = 0;
  float scale = 0, eps = 0;

  // Weights (f32): W_q trainable [L, q_dim, E]; the others point into the file when they are
  // f32 there, else into `owned`.
  Buffer<float> wq, wq_grad, adam_m, adam_v;
  int64_t adam_t = 0;
  std::vector<const float*> wo, wgate, wup, wdown;  // [L]
  const float* wout = nullptr;                      // [V, E]
  std::vector<Buffer<float>> owned;
  size_t owned_bytes = 0;

  // Activations of one span of S tokens (grown to the largest span seen).
  int64_t cap = 0;
  Buffer<float> x_in, h1, qpre, qr, o, x_mid, h2, gate, up;  // [L, S, ...]
  Buffer<float> r1, r2, rq, lse;                              // [L, S] / [L, S, H]
  Buffer<float> x, cur, tmp_ff, hf, rf, logits, ce_lse, ce_loss;  // scratch
  Buffer<float> dx, dcur, dq, dff, dff2;
  std::vector<int32_t> pos, neg_pos;  // [S] positions of the span's tokens, and negated
  // Fixed-distance attention (W > 0): a key more than W positions back is scored with the query
  // rotated at W against the key rotated back to 0. qw: [L, S, q_dim] those queries; dqw: their
  // gradient [S, q_dim]; wpos / neg_wpos: [S] copies of W and -W.
  int64_t W = 0;
  Buffer<float> qw, dqw;
  std::vector<int32_t> wpos, neg_wpos;
  std::vector<float> qscale;          // [S] log-n factor of each query (1 without --rope ...+logn)

  // Attention scratch, per thread.
  struct Scratch {
    Buffer<float> q, s, dp, acc, dq, dout, m, l, dd, k, v;
    Buffer<float> qw, dqw, k0, sf;  // fixed-distance attention: queries at W, keys at 0, their scores
    std::vector<int64_t> nf;        // per tile row: keys of the block scored at the fixed distance
  };
  std::vector<Scratch> scratch;

  // The span of the current loss(): tokens [start, start + S) of the context.
  int64_t start = 0, S = 0;
  const int32_t* tok = nullptr;
  std::vector<Tile> tiles;

  float* wq_layer(int64_t il) { return wq.data() + il * q_dim * E; }
  const KvCache& kv() const { return ctx->kv(); }
  ThreadPool& pool() const { return ctx->pool(); }

  const float* widen(const TensorView& w) {
    if (w.type == DType::F32) return static_cast<const float*>(w.data);
    owned.emplace_back(static_cast<size_t>(w.n_elements()));
    float* dst = owned.back().data();
    for (int64_t r = 0; r < w.n_rows(); ++r) kernels::dequantize_row(w.type, w.row(r), dst + r * w.ne[0], w.ne[0]);
    owned_bytes += static_cast<size_t>(w.n_elements()) * sizeof(float);
    return dst;
  }

  void reserve(int64_t n) {
    if (n <= cap) return;
    cap = n;
    auto sz = [](int64_t a) { return static_cast<size_t>(a); };
    x_in.resize(sz(L * n * E));
    h1.resize(sz(L * n * E));
    if (model->layers()[0].q_norm) qpre.resize(sz(L * n * q_dim));
    qr.resize(sz(L * n * q_dim));
    o.resize(sz(L * n * o_dim));
    x_mid.resize(sz(L * n * E));
    h2.resize(sz(L * n * E));
    gate.resize(sz(L * n * ff));
    up.resize(sz(L * n * ff));
    r1.resize(sz(L * n));
    r2.resize(sz(L * n));
    rq.resize(sz(L * n * H));
    lse.resize(sz(L * n * H));
    x.resize(sz(n * E));
    cur.resize(sz(n * std::max({E, q_dim, o_dim})));
    tmp_ff.resize(sz(n * ff));
    hf.resize(sz(n * E));
    rf.resize(sz(n));
    logits.resize(sz(n * V));
    ce_lse.resize(sz(n));
    ce_loss.resize(sz(n));
    dx.resize(sz(n * E));
    dcur.resize(sz(n * std::max({E, q_dim, o_dim})));
    dq.resize(sz(n * q_dim));
    dff.resize(sz(n * ff));
    dff2.resize(sz(n * ff));
    pos.assign(sz(n), 0);
    neg_pos.assign(sz(n), 0);
    if (W > 0) {
      qw.resize(sz(L * n * q_dim));
      dqw.resize(sz(n * q_dim));
      wpos.assign(sz(n), static_cast<int32_t>(W));
      neg_wpos.assign(sz(n), static_cast<int32_t>(-W));
    }
    qscale.assign(sz(n), 1.0f);
  }

  size_t activation_bytes() const {
    const Buffer<float>* bufs[] = {&x_in, &h1,     &qpre, &qr,     &o,      &x_mid,   &h2, &gate, &up,
                                   &r1,   &r2,     &rq,   &lse,    &x,      &cur,     &tmp_ff, &hf, &rf,
                                   &logits, &ce_lse, &ce_loss, &dx, &dcur, &dq, &dff, &dff2, &qw, &dqw};
    size_t n = 0;
    for (const auto* b : bufs) n += b->size();
    for (const auto& s : scratch) {
      for (const Buffer<float>* b :
           {&s.q, &s.s, &s.dp, &s.acc, &s.dq, &s.dout, &s.m, &s.l, &s.dd, &s.k, &s.v, &s.qw, &s.dqw, &s.k0, &s.sf})
        n += b->size();
    }
    return n * sizeof(float);
  }

  Status begin_span(int64_t span_start, int64_t span);
  void layer_forward(int64_t il);
  double head_forward(bool want_grad);
  void head_backward();
  void layer_backward(int64_t il);
  void attn_forward(int64_t il, const float* qr, const float* qw, float* out, float* lse);
  void attn_backward(int64_t il, const float* qr, const float* qw, const float* out, const float* lse,
                     const float* dout, float* dqr, float* dqw);
  void tile_forward(int64_t il, const Tile& tl, const float* qr, const float* qw, float* out, float* lse, Scratch& sc);
  void tile_backward(int64_t il, const Tile& tl, const float* qr, const float* qw, const float* out, const float* lse,
                     const float* dout, float* dqr, float* dqw, Scratch& sc);
  bool far_scores(int64_t il, const Tile& tl, int64_t R, int64_t first, int64_t cnt, const float* K, Scratch& sc);
  void tile_rows(const Tile& tl, const float* src, float* dst) const;
};

QueryTrainer::QueryTrainer(Context& ctx) : impl_(std::make_unique<Impl>()), ctx_(ctx) {}
QueryTrainer::~QueryTrainer() = default;

int64_t QueryTrainer::n_layer() const { return impl_->L; }
float* QueryTrainer::wq(int64_t il) { return impl_->wq_layer(il); }
const float* QueryTrainer::grad(int64_t il) const { return impl_->wq_grad.data() + il * impl_->q_dim * impl_->E; }

size_t QueryTrainer::bytes() const {
  const Impl& m = *impl_;
  return (m.wq.size() + m.wq_grad.size() + m.adam_m.size() + m.adam_v.size()) * sizeof(float) + m.owned_bytes +
         m.activation_bytes();
}

Expected<std::unique_ptr<QueryTrainer>> QueryTrainer::create(Context& ctx, int64_t n_context) {
  LC_TRY(check_qttt_context(ctx));
  if (n_context < 0) n_context = ctx.n_past();
  if (n_context > ctx.n_past())
    return make_error(fmt::format("--qttt: {} context tokens asked for but the cache holds {}", n_context,
                                  ctx.n_past()));
  if (n_context < 2)
    return make_error(fmt::format("--qttt: the context has {} token(s); a span needs at least 2", n_context));
  const KvCache& kv = ctx.kv();
  for (int64_t il = 0; il < kv.n_layer(); ++il)
    for (int64_t h = 0; h < kv.n_head_kv(); ++h)
      if (kv.n_tokens(il, h) != kv.n_appended(il) || kv.n_tokens(il, h) < n_context)
        return make_error(fmt::format("--qttt: layer {} KV head {} holds {} of the {} tokens appended: qTTT "
                                      "needs every context token in the cache",
                                      il, h, kv.n_tokens(il, h),
                                      kv.n_appended(il)));
  auto t = std::unique_ptr<QueryTrainer>(new QueryTrainer(ctx));
  t->n_context_ = n_context;
  Impl& m = *t->impl_;
  const Model& model = ctx.model();
  const HParams& hp = model.hparams();
  m.ctx = &ctx;
  m.model = &model;
  m.E = hp.n_embd, m.H = hp.n_head, m.Hkv = hp.n_head_kv, m.g = hp.n_gqa(), m.d = hp.head_dim,
  m.dv = hp.head_dim_v, m.q_dim = hp.n_head * hp.head_dim, m.o_dim = hp.n_head * hp.head_dim_v, m.ff = hp.n_ff,
  m.V = hp.n_vocab, m.L = hp.n_layer;
  m.scale = ctx.attention().shape().scale;
  m.eps = hp.rms_eps;
  LC_ASSIGN_OR_RETURN(m.W, qttt_fixed_distance(ctx));
  try {
    const size_t nq = static_cast<size_t>(m.L * m.q_dim * m.E);
    m.wq.resize(nq);
    m.wq_grad.resize(nq);
    m.adam_m.resize(nq);
    m.adam_v.resize(nq);
    m.wo.resize(static_cast<size_t>(m.L));
    m.wgate.resize(static_cast<size_t>(m.L));
    m.wup.resize(static_cast<size_t>(m.L));
    m.wdown.resize(static_cast<size_t>(m.L));
    for (int64_t il = 0; il < m.L; ++il) {
      const LayerWeights& lw = model.layers()[static_cast<size_t>(il)];
      float* dst = t->wq(il);
      for (int64_t r = 0; r < m.q_dim; ++r) kernels::dequantize_row(lw.wq.type, lw.wq.row(r), dst + r * m.E, m.E);
      m.wo[static_cast<size_t>(il)] = m.widen(lw.wo);
      m.wgate[static_cast<size_t>(il)] = m.widen(lw.w_gate);
      m.wup[static_cast<size_t>(il)] = m.widen(lw.w_up);
      m.wdown[static_cast<size_t>(il)] = m.widen(lw.w_down);
    }
    m.wout = m.widen(model.output());
    m.scratch.resize(static_cast<size_t>(ctx.pool().size()));
  } catch (const std::bad_alloc&) {
    return make_error("--qttt: out of memory widening the weights to f32");
  }
  return t;
}

// Sizes the buffers for a span of `span` tokens at `span_start` and fills its positions, query
// scales and attention tiles.
Status QueryTrainer::Impl::begin_span(int64_t span_start, int64_t span) {
  const int64_t B = kv().block_tokens();
  const int64_t RM = std::max(kRows, g);  // rows of the largest attention tile
  try {
    reserve(span);
    for (Scratch& sc : scratch) {
      for (Buffer<float>* b : {&sc.q, &sc.dq}) grow(*b, RM * d);
      for (Buffer<float>* b : {&sc.s, &sc.dp}) grow(*b, RM * B);
      for (Buffer<float>* b : {&sc.acc, &sc.dout}) grow(*b, RM * dv);
      for (Buffer<float>* b : {&sc.m, &sc.l, &sc.dd}) grow(*b, RM);
      grow(sc.k, B * d);
      grow(sc.v, B * dv);
      if (W > 0) {
        for (Buffer<float>* b : {&sc.qw, &sc.dqw}) grow(*b, RM * d);
        grow(sc.sf, RM * B);
        grow(sc.k0, B * d);
        sc.nf.resize(static_cast<size_t>(RM));
      }
    }
  } catch (const std::bad_alloc&) {
    return make_error(fmt::format("--qttt: out of memory for the activations of a {}-token span", span));
  }
  start = span_start;
  S = span;
  tok = ctx->tokens().data() + start;
  for (int64_t t = 0; t < S; ++t) {
    pos[static_cast<size_t>(t)] = kv().positions(0, 0)[start + t];
    neg_pos[static_cast<size_t>(t)] = -pos[static_cast<size_t>(t)];
    qscale[static_cast<size_t>(t)] = ctx->rope_plan().q_scale(pos[static_cast<size_t>(t)]);
  }
  tiles = make_tiles(Hkv, g, S);
  return ok_status();
}

// Fixed-distance attention (W > 0), for the R rows of a tile and keys [first, first + cnt)
// whose near scores are in sc.s: sc.nf[r] is how many of the block's keys row r sees at the
// fixed distance (they are the first ones: keys are in position order); their scores are
// replaced by those of the row's query at W against the keys rotated back to 0 (sc.k0), as
// attention `fixed` computes them. Returns whether any row has such keys.
bool QueryTrainer::Impl::far_scores(int64_t il, const Tile& tl, int64_t R, int64_t first, int64_t cnt,
                                    const float* K, Scratch& sc) {
  if (W <= 0) return false;
  const int32_t* kp = kv().positions(il, tl.hk) + first;
  bool any = false;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t lim = static_cast<int64_t>(pos[static_cast<size_t>(tl.t0 + r / g)]) - W;
    const int64_t nf = std::lower_bound(kp, kp + cnt, lim, [](int32_t a, int64_t b) { return a < b; }) - kp;
    sc.nf[static_cast<size_t>(r)] = nf;
    any = any || nf > 0;
  }
  if (!any) return false;
  std::memcpy(sc.k0.data(), K, sizeof(float) * static_cast<size_t>(cnt * d));
  attn::unrotate_rows(sc.k0.data(), cnt, d, kp, kv().rope(il));
  grad::gemm<float>(false, true, R, cnt, d, scale, sc.qw.data(), d, sc.k0.data(), d, 0.0f, sc.sf.data(), cnt);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(sc.s.data() + r * cnt, sc.sf.data() + r * cnt,
                sizeof(float) * static_cast<size_t>(sc.nf[static_cast<size_t>(r)]));
  return true;
}

// Copies the tile's rows of a [S, H, d] query buffer into dst ([R, d]).
void QueryTrainer::Impl::tile_rows(const Tile& tl, const float* src, float* dst) const {
  for (int64_t t = 0; t < tl.nt; ++t)
    std::memcpy(dst + t * g * d, src + ((tl.t0 + t) * H + tl.hk * g) * d, sizeof(float) * g * d);
}

// One tile of attn_forward: an online softmax over the cached blocks the tile's tokens see.
void QueryTrainer::Impl::tile_forward(int64_t il, const Tile& tl, const float* qr, const float* qw, float* out,
                                      float* lse, Scratch& sc) {
  const int64_t B = kv().block_tokens();
  const int64_t R = tl.nt * g;
  tile_rows(tl, qr, sc.q.data());
  if (qw) tile_rows(tl, qw, sc.qw.data());
  std::fill(sc.acc.data(), sc.acc.data() + R * dv, 0.0f);
  std::fill(sc.m.data(), sc.m.data() + R, -std::numeric_limits<float>::infinity());
  std::fill(sc.l.data(), sc.l.data() + R, 0.0f);
  const int64_t lv = start + tl.t0 + tl.nt;  // keys the tile's last token sees
  for (int64_t first = 0; first < lv; first += B) {
    const int64_t cnt = std::min(B, lv - first);
    const float* K = kv().keys_f32(il, tl.hk, first, cnt, sc.k.data());
    const float* Vv = kv().values_f32(il, tl.hk, first, cnt, sc.v.data());
    grad::gemm<float>(false, true, R, cnt, d, scale, sc.q.data(), d, K, d, 0.0f, sc.s.data(), cnt);
    far_scores(il, tl, R, first, cnt, K, sc);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t t = tl.t0 + r / g;
      const int64_t vis = std::clamp<int64_t>(start + t + 1 - first, 0, cnt);
      float* s = sc.s.data() + r * cnt;
      if (vis == 0) {
        std::fill(s, s + cnt, 0.0f);
        continue;
      }
      const float mx = *std::max_element(s, s + vis);
      const float mn = std::max(sc.m[static_cast<size_t>(r)], mx);
      const float corr = std::exp(sc.m[static_cast<size_t>(r)] - mn);
      sc.l[static_cast<size_t>(r)] *= corr;
      kernels::scale_inplace(sc.acc.data() + r * dv, corr, dv);
      float sum = 0;
      for (int64_t j = 0; j < vis; ++j) sum += (s[j] = std::exp(s[j] - mn));
      std::fill(s + vis, s + cnt, 0.0f);
      sc.l[static_cast<size_t>(r)] += sum;
      sc.m[static_cast<size_t>(r)] = mn;
    }
    grad::gemm<float>(false, false, R, dv, cnt, 1.0f, sc.s.data(), cnt, Vv, dv, 1.0f, sc.acc.data(), dv);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = tl.t0 + r / g, h = tl.hk * g + r % g;
    const float l = sc.l[static_cast<size_t>(r)];
    float* orow = out + (t * H + h) * dv;
    for (int64_t c = 0; c < dv; ++c) orow[c] = sc.acc[static_cast<size_t>(r * dv + c)] / l;
    lse[t * H + h] = sc.m[static_cast<size_t>(r)] + std::log(l);
  }
}

// Attention of the span's queries qr: [S, H, d] (rotated) over layer il's cached keys; out:
// [S, H, dv], lse: [S, H]. qw: the same queries rotated at the fixed distance (null without one).
void QueryTrainer::Impl::attn_forward(int64_t il, const float* qr, const float* qw, float* out, float* lse) {
  pool().parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t b, int64_t e, int ith) {
    for (int64_t it = b; it < e; ++it)
      tile_forward(il, tiles[static_cast<size_t>(it)], qr, qw, out, lse, scratch[static_cast<size_t>(ith)]);
  });
}

// One tile of attn_backward: the probabilities recomputed from lse, block by block.
void QueryTrainer::Impl::tile_backward(int64_t il, const Tile& tl, const float* qr, const float* qw, const float* out,
                                       const float* lse, const float* dout, float* dqr, float* dqw, Scratch& sc) {
  const int64_t B = kv().block_tokens();
  const int64_t R = tl.nt * g;
  tile_rows(tl, qr, sc.q.data());
  if (qw) {
    tile_rows(tl, qw, sc.qw.data());
    std::fill(sc.dqw.data(), sc.dqw.data() + R * d, 0.0f);
  }
  for (int64_t t = 0; t < tl.nt; ++t) {
    const int64_t row0 = (tl.t0 + t) * H + tl.hk * g;
    std::memcpy(sc.dout.data() + t * g * dv, dout + row0 * dv, sizeof(float) * g * dv);
    for (int64_t j = 0; j < g; ++j) {
      sc.dd[static_cast<size_t>(t * g + j)] = kernels::dot_f32(dout + (row0 + j) * dv, out + (row0 + j) * dv, dv);
      sc.m[static_cast<size_t>(t * g + j)] = lse[row0 + j];
    }
  }
  std::fill(sc.dq.data(), sc.dq.data() + R * d, 0.0f);
  const int64_t lv = start + tl.t0 + tl.nt;
  for (int64_t first = 0; first < lv; first += B) {
    const int64_t cnt = std::min(B, lv - first);
    const float* K = kv().keys_f32(il, tl.hk, first, cnt, sc.k.data());
    const float* Vv = kv().values_f32(il, tl.hk, first, cnt, sc.v.data());
    grad::gemm<float>(false, true, R, cnt, d, scale, sc.q.data(), d, K, d, 0.0f, sc.s.data(), cnt);
    grad::gemm<float>(false, true, R, cnt, dv, 1.0f, sc.dout.data(), dv, Vv, dv, 0.0f, sc.dp.data(), cnt);
    const bool far = far_scores(il, tl, R, first, cnt, K, sc);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t t = tl.t0 + r / g;
      const int64_t vis = std::clamp<int64_t>(start + t + 1 - first, 0, cnt);
      float* s = sc.s.data() + r * cnt;
      const float* dp = sc.dp.data() + r * cnt;
      const float ls = sc.m[static_cast<size_t>(r)], D = sc.dd[static_cast<size_t>(r)];
      for (int64_t j = 0; j < vis; ++j) s[j] = std::exp(s[j] - ls) * (dp[j] - D);
      std::fill(s + vis, s + cnt, 0.0f);
    }
    if (far) {  // dS of the far keys goes to the queries at W, against the keys at 0
      for (int64_t r = 0; r < R; ++r) {
        float* s = sc.s.data() + r * cnt;
        float* sf = sc.sf.data() + r * cnt;
        const int64_t nf = sc.nf[static_cast<size_t>(r)];
        std::memcpy(sf, s, sizeof(float) * static_cast<size_t>(nf));
        std::fill(sf + nf, sf + cnt, 0.0f);
        std::fill(s, s + nf, 0.0f);
      }
      grad::gemm<float>(false, false, R, d, cnt, scale, sc.sf.data(), cnt, sc.k0.data(), d, 1.0f, sc.dqw.data(), d);
    }
    grad::gemm<float>(false, false, R, d, cnt, scale, sc.s.data(), cnt, K, d, 1.0f, sc.dq.data(), d);
  }
  for (int64_t t = 0; t < tl.nt; ++t) {
    const int64_t row0 = (tl.t0 + t) * H + tl.hk * g;
    std::memcpy(dqr + row0 * d, sc.dq.data() + t * g * d, sizeof(float) * g * d);
    if (qw) std::memcpy(dqw + row0 * d, sc.dqw.data() + t * g * d, sizeof(float) * g * d);
  }
}

// dqr: [S, H, d] (overwritten) from dout: [S, H, dv]; with a fixed distance also dqw, the
// gradient of the queries at W (overwritten).
void QueryTrainer::Impl::attn_backward(int64_t il, const float* qr, const float* qw, const float* out,
                                       const float* lse, const float* dout, float* dqr, float* dqw) {
  pool().parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t b, int64_t e, int ith) {
    for (int64_t it = b; it < e; ++it)
      tile_backward(il, tiles[static_cast<size_t>(it)], qr, qw, out, lse, dout, dqr, dqw,
                    scratch[static_cast<size_t>(ith)]);
  });
}

// Layer il on the residual stream x: [S, E], saving what the backward pass needs.
void QueryTrainer::Impl::layer_forward(int64_t il) {
  ThreadPool& tp = pool();
  const LayerWeights& lw = model->layers()[static_cast<size_t>(il)];
  const int64_t sE = S * E, sQ = S * q_dim, sO = S * o_dim, sF = S * ff;
  float* xs = x.data();
  float* xin = at(x_in, il, sE);
  float* h = at(h1, il, sE);
  float* q = at(qr, il, sQ);
  std::memcpy(xin, xs, sizeof(float) * sE);
  grad::rmsnorm_forward<float>(xs, lw.attn_norm, h, at(r1, il, S), S, E, eps, tp);
  grad::linear_forward<float>(h, wq_layer(il), q, S, E, q_dim, tp);
  if (lw.bq)
    grad::parallel_rows(tp, S, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) kernels::add_inplace(q + t * q_dim, lw.bq, q_dim);
    });
  if (lw.q_norm) {  // per head, on S * H rows of d
    float* qp = at(qpre, il, sQ);
    std::memcpy(qp, q, sizeof(float) * sQ);
    grad::rmsnorm_forward<float>(qp, lw.q_norm, q, at(rq, il, S * H), S * H, d, eps, tp);
  }
  grad::parallel_rows(tp, S, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) kernels::scale_inplace(q + t * q_dim, qscale[static_cast<size_t>(t)], q_dim);
  });
  float* qf = nullptr;
  if (W > 0) {  // the queries at the fixed distance: the same scaled query, rotated at W
    qf = at(qw, il, sQ);
    std::memcpy(qf, q, sizeof(float) * sQ);
    kv().rope(il).apply(qf, S, H, d, wpos.data());
  }
  kv().rope(il).apply(q, S, H, d, pos.data());
  float* ol = at(o, il, sO);
  attn_forward(il, q, qf, ol, at(lse, il, S * H));
  grad::linear_forward<float>(ol, wo[static_cast<size_t>(il)], cur.data(), S, o_dim, E, tp);
  kernels::add_inplace(xs, cur.data(), sE);
  float* xm = at(x_mid, il, sE);
  float* h2l = at(h2, il, sE);
  float* gl = at(gate, il, sF);
  float* ul = at(up, il, sF);
  std::memcpy(xm, xs, sizeof(float) * sE);
  grad::rmsnorm_forward<float>(xs, lw.ffn_norm, h2l, at(r2, il, S), S, E, eps, tp);
  grad::linear_forward<float>(h2l, wgate[static_cast<size_t>(il)], gl, S, E, ff, tp);
  grad::linear_forward<float>(h2l, wup[static_cast<size_t>(il)], ul, S, E, ff, tp);
  grad::swiglu_forward<float>(gl, ul, tmp_ff.data(), sF, tp);
  grad::linear_forward<float>(tmp_ff.data(), wdown[static_cast<size_t>(il)], cur.data(), S, ff, E, tp);
  kernels::add_inplace(xs, cur.data(), sE);
}

// The output norm, the logits and the mean cross-entropy of rows 0 .. S-2 (they predict tokens
// 1 .. S-1 of the span); with want_grad the logits become dL/dlogits.
double QueryTrainer::Impl::head_forward(bool want_grad) {
  ThreadPool& tp = pool();
  const int64_t P = S - 1;
  grad::rmsnorm_forward<float>(x.data(), model->output_norm(), hf.data(), rf.data(), P, E, eps, tp);
  grad::linear_forward<float>(hf.data(), wout, logits.data(), P, E, V, tp);
  const double total =
      grad::cross_entropy_forward<float>(logits.data(), tok + 1, ce_lse.data(), ce_loss.data(), P, V, tp);
  if (want_grad)
    grad::cross_entropy_backward<float>(logits.data(), tok + 1, ce_lse.data(), P, V, 1.0f / static_cast<float>(P), tp);
  return total / static_cast<double>(P);
}

// From dL/dlogits to dL/dx (the residual stream after the last layer) in dx.
void QueryTrainer::Impl::head_backward() {
  ThreadPool& tp = pool();
  const int64_t P = S - 1;
  grad::linear_backward_dx<float>(logits.data(), wout, dcur.data(), P, E, V, false, tp);
  std::fill(dx.data(), dx.data() + S * E, 0.0f);  // the last row predicts nothing
  grad::rmsnorm_backward<float>(dcur.data(), x.data(), model->output_norm(), rf.data(), dx.data(), nullptr, P, E, tp);
}

// Layer il backwards: dL/dW_q of the layer into grad, and (above the first layer) dx becomes
// the gradient of the layer's input.
void QueryTrainer::Impl::layer_backward(int64_t il) {
  ThreadPool& tp = pool();
  const LayerWeights& lw = model->layers()[static_cast<size_t>(il)];
  const int64_t sE = S * E, sQ = S * q_dim, sO = S * o_dim, sF = S * ff;
  // MLP: x_out = x_mid + W_down swiglu(W_gate h2, W_up h2), h2 = rmsnorm(x_mid).
  grad::linear_backward_dx<float>(dx.data(), wdown[static_cast<size_t>(il)], dff.data(), S, ff, E, false, tp);
  grad::swiglu_backward<float>(dff.data(), at(gate, il, sF), at(up, il, sF), dff.data(), dff2.data(), sF, tp);
  grad::linear_backward_dx<float>(dff.data(), wgate[static_cast<size_t>(il)], dcur.data(), S, E, ff, false, tp);
  grad::linear_backward_dx<float>(dff2.data(), wup[static_cast<size_t>(il)], dcur.data(), S, E, ff, true, tp);
  grad::rmsnorm_backward<float>(dcur.data(), at(x_mid, il, sE), lw.ffn_norm, at(r2, il, S), dx.data(), nullptr, S,
                                E, tp);
  // Attention: x_mid = x_in + W_o attn(q), q from h1 = rmsnorm(x_in).
  float* dout = cur.data();  // [S, o_dim]
  grad::linear_backward_dx<float>(dx.data(), wo[static_cast<size_t>(il)], dout, S, o_dim, E, false, tp);
  float* dql = dq.data();
  attn_backward(il, at(qr, il, sQ), W > 0 ? at(qw, il, sQ) : nullptr, at(o, il, sO), at(lse, il, S * H), dout, dql,
                dqw.data());
  // RoPE is orthogonal up to mscale: its transpose is the rotation by the negated angles.
  kv().rope(il).apply(dql, S, H, d, neg_pos.data());
  if (W > 0) {
    kv().rope(il).apply(dqw.data(), S, H, d, neg_wpos.data());
    kernels::add_inplace(dql, dqw.data(), sQ);
  }
  grad::parallel_rows(tp, S, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) kernels::scale_inplace(dql + t * q_dim, qscale[static_cast<size_t>(t)], q_dim);
  });
  if (lw.q_norm)  // in place, per head
    grad::rmsnorm_backward<float>(dql, at(qpre, il, sQ), lw.q_norm, at(rq, il, S * H), dql, nullptr, S * H, d, tp,
                                  false);
  const float* h = at(h1, il, sE);
  grad::linear_backward_dw<float>(dql, h, wq_grad.data() + il * q_dim * E, S, E, q_dim, false, tp);
  if (il == 0) return;  // nothing below the first layer is trained
  grad::linear_backward_dx<float>(dql, wq_layer(il), dcur.data(), S, E, q_dim, false, tp);
  grad::rmsnorm_backward<float>(dcur.data(), at(x_in, il, sE), lw.attn_norm, at(r1, il, S), dx.data(), nullptr, S, E,
                                tp);
}

Expected<double> QueryTrainer::loss(int64_t start, int64_t S, bool want_grad) {
  Impl& m = *impl_;
  if (S < 2 || start < 0 || start + S > n_context_)
    return make_error(fmt::format("--qttt: span [{}, {}) is not inside the context of {} tokens", start,
                                  start + S, n_context_));
  const KvCache& kv = ctx_.kv();
  if (ctx_.n_past() < n_context_ || kv.n_tokens(0, 0) < n_context_)
    return make_error("--qttt: the context was truncated after the trainer was made");
  LC_TRY(m.begin_span(start, S));
  const TensorView& te = m.model->tok_embd();
  for (int64_t t = 0; t < S; ++t) kernels::dequantize_row(te.type, te.row(m.tok[t]), m.x.data() + t * m.E, m.E);
  for (int64_t il = 0; il < m.L; ++il) m.layer_forward(il);
  const double mean = m.head_forward(want_grad);
  if (!want_grad) return mean;
  m.head_backward();
  for (int64_t il = m.L - 1; il >= 0; --il) m.layer_backward(il);
  return mean;
}

void QueryTrainer::adam_step(double lr) {
  Impl& m = *impl_;
  // Plain Adam: beta1 0.9, beta2 0.999, eps 1e-8, no weight decay.
  const grad::AdamParams a{0.9f, 0.999f, 1e-8f, 0.0f};
  ++m.adam_t;
  grad::adam_update(a, m.adam_t, static_cast<float>(lr), m.wq.data(), m.wq_grad.data(), m.adam_m.data(),
                    m.adam_v.data(), static_cast<int64_t>(m.wq.size()), ctx_.pool());
}

void QueryTrainer::install() {
  Buffer<float> w(impl_->wq.size());
  std::memcpy(w.data(), impl_->wq.data(), sizeof(float) * w.size());
  ctx_.set_query_weights(std::move(w));
}

// ---------------------------------------------------------------- driver

Expected<std::unique_ptr<QtttRun>> QtttRun::create(Context& ctx, const QtttParams& p, uint64_t seed,
                                                   int64_t n_context) {
  std::unique_ptr<QtttRun> r(new QtttRun());
  r->p_ = p;
  r->st_.steps = p.steps;
  r->st_.span = p.span;
  r->t0_ = now_seconds();
  if (!p.enabled()) {
    r->done_ = true;
    return r;
  }
  if (n_context < 0) n_context = ctx.n_past();
  r->st_.n_context = n_context;
  LC_TRY(check_qttt_span(p, n_context));
  LC_ASSIGN_OR_RETURN(r->tr_, QueryTrainer::create(ctx, n_context));
  r->rng_.seed(seed);
  r->n_starts_ = static_cast<uint64_t>(n_context - p.span + 1);
  return r;
}

Expected<bool> QtttRun::step() {
  if (done_) return true;
  const double t1 = now_seconds();
  const int64_t start = static_cast<int64_t>(rng_() % n_starts_);
  LC_ASSIGN_OR_RETURN(double l, tr_->loss(start, p_.span, true));
  tr_->adam_step(p_.lr);
  st_.step_loss.push_back(l);
  st_.starts.push_back(start);
  st_.step_seconds += now_seconds() - t1;
  if (static_cast<int64_t>(st_.starts.size()) < p_.steps) return false;
  st_.loss_before = st_.step_loss.front();
  LC_ASSIGN_OR_RETURN(st_.loss_after, tr_->loss(st_.starts.front(), p_.span, false));
  st_.extra_bytes = tr_->bytes();
  tr_->install();
  tr_.reset();
  st_.seconds = now_seconds() - t0_;  // from create(): other work between the steps counts too
  done_ = true;
  return true;
}

Expected<QtttStats> run_qttt(Context& ctx, const QtttParams& p, uint64_t seed, int64_t n_context) {
  LC_ASSIGN_OR_RETURN(std::unique_ptr<QtttRun> r, QtttRun::create(ctx, p, seed, n_context));
  for (;;) {
    LC_ASSIGN_OR_RETURN(bool done, r->step());
    if (done) break;
  }
  return r->stats();
}

std::string qttt_summary(const QtttStats& s) {
  if (s.steps == 0) return "qTTT:       off (steps=0)";
  return fmt::format("qTTT:       {} steps x {} tokens in {:.3f} s ({:.2f} s of steps = {:.1f} tokens/s), loss on the "
                     "first span {:.4f} -> {:.4f}, {:.2f} MiB extra",
                     s.steps, s.span, s.seconds, s.step_seconds, s.tokens_per_second(),
                     s.loss_before, s.loss_after, static_cast<double>(s.extra_bytes) / (1024.0 * 1024.0));
}

}  // namespace lc
