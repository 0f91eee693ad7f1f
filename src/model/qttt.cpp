// Query-only test-time training over a frozen KV cache (see qttt.h for the paper and formula).
//
// Forward of a span, per layer, with the span's own activations only:
//   h = rmsnorm(x) ; q = RoPE(c(pos) * qnorm(W_q h + b_q)) ; o = softmax(scale q K^T) V over the
//   cached keys with index <= the token's ; x += W_o o ; x += W_down swiglu(W_gate h2, W_up h2)
// Backward: the same graph in reverse, with K and V constants. The attention backward recomputes
// the probabilities from the saved log-sum-exp (as FlashAttention does), so no [S, n_ctx]
// matrix is stored: dS = P * (dO V^T - rowsum(dO * O)), dq = scale * dS K.
#include "model/qttt.h"

#include <cblas.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>

#include "attention/exec.h"
#include "core/sys.h"
#include "kernels/kernels.h"

namespace lc {

// ---------------------------------------------------------------- spec

std::string QtttParams::spec() const {
  return strprintf("steps=%lld,lr=%g,span=%lld", (long long)steps, lr, (long long)span);
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
      return make_error(strprintf("--qttt '%s': '%.*s' is not key=value (expected steps=N,lr=X,span=S)", all.c_str(),
                                  (int)item.size(), item.data()));
    const std::string key(item.substr(0, eq)), val(item.substr(eq + 1));
    char* end = nullptr;
    if (key == "steps" || key == "span") {
      bool& seen = key == "steps" ? seen_steps : seen_span;
      if (seen) return make_error(strprintf("--qttt '%s': key '%s' given twice", all.c_str(), key.c_str()));
      seen = true;
      errno = 0;
      const long long v = std::strtoll(val.c_str(), &end, 10);
      if (val.empty() || *end != '\0' || errno != 0)
        return make_error(strprintf("--qttt '%s': %s expects an integer, got '%s'", all.c_str(), key.c_str(), val.c_str()));
      if (key == "steps") {
        if (v < 0 || v > 1000000)
          return make_error(strprintf("--qttt '%s': steps=%lld must be in [0, 1000000]", all.c_str(), v));
        p.steps = v;
      } else {
        if (v < 2 || v > (int64_t{1} << 24))
          return make_error(strprintf("--qttt '%s': span=%lld must be at least 2 (a span of S tokens gives S-1 "
                                      "next-token predictions)", all.c_str(), v));
        p.span = v;
      }
    } else if (key == "lr") {
      if (seen_lr) return make_error(strprintf("--qttt '%s': key 'lr' given twice", all.c_str()));
      seen_lr = true;
      const double v = std::strtod(val.c_str(), &end);
      if (val.empty() || *end != '\0' || !std::isfinite(v))
        return make_error(strprintf("--qttt '%s': lr expects a number, got '%s'", all.c_str(), val.c_str()));
      if (v <= 0) return make_error(strprintf("--qttt '%s': lr=%s must be > 0", all.c_str(), val.c_str()));
      p.lr = v;
    } else {
      return make_error(strprintf("--qttt '%s': unknown key '%s' (accepted: steps, lr, span)", all.c_str(), key.c_str()));
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
  return make_error(ErrorCode::kUnsupported, strprintf("--qttt needs --attn dense or fixed (without budget): its gradient is that of exact "
                              "attention over every cached token, while --attn %s reads (or keeps) a subset, so the "
                              "trained queries would answer through a different attention",
                              spec.c_str()));
}

Status check_qttt_context(const Context& ctx) {
  if (ctx.press())
    return make_error(strprintf("--qttt cannot run with --kv-press %s: the press removes cache entries, and qTTT "
                                "trains the queries against the whole frozen cache (every token a span token attends "
                                "to); use one or the other",
                                ctx.press()->spec().c_str()));
  LC_ASSIGN_OR_RETURN(const int64_t distance, qttt_fixed_distance(ctx));
  (void)distance;
  return Status::ok();
}

Status check_qttt_span(const QtttParams& p, int64_t n_context) {
  if (p.enabled() && p.span > n_context)
    return make_error(strprintf("--qttt span=%lld is longer than the context (%lld tokens): use a span of at most "
                                "%lld",
                                (long long)p.span, (long long)n_context, (long long)std::max<int64_t>(n_context, 2)));
  return Status::ok();
}

// ---------------------------------------------------------------- helpers

namespace {

// Our ThreadPool splits the GEMMs; OpenBLAS threads would fight it for the cores.
void blas_single_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb),
              beta, C, static_cast<int>(ldc));
}

void ranges(ThreadPool& pool, int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    if (b < e) fn(b, e);
  }, grain);
}

// y[n, out] = x[n, in] W[out, in]^T, split over output features.
void linear(ThreadPool& pool, const float* x, const float* w, float* y, int64_t n, int64_t in, int64_t out) {
  ranges(pool, out, 16, [&](int64_t o0, int64_t o1) {
    sgemm(false, true, n, o1 - o0, in, 1.0f, x, in, w + o0 * in, in, 0.0f, y + o0, out);
  });
}

// dx[n, in] (+)= dy[n, out] W[out, in], split over input features (each thread reads its own
// columns of W).
void linear_dx(ThreadPool& pool, const float* dy, const float* w, float* dx, int64_t n, int64_t in, int64_t out,
               bool accumulate) {
  ranges(pool, in, 16, [&](int64_t i0, int64_t i1) {
    sgemm(false, false, n, i1 - i0, out, 1.0f, dy, out, w + i0, in, accumulate ? 1.0f : 0.0f, dx + i0, in);
  });
}

// dw[out, in] = dy[n, out]^T x[n, in], split over output features.
void linear_dw(ThreadPool& pool, const float* dy, const float* x, float* dw, int64_t n, int64_t in, int64_t out) {
  ranges(pool, out, 16, [&](int64_t o0, int64_t o1) {
    sgemm(true, false, o1 - o0, in, n, 1.0f, dy + o0, out, x, in, 0.0f, dw + o0 * in, in);
  });
}

// y = x * r * w, r = 1 / sqrt(mean(x^2) + eps) (sum in double), one row.
float rmsnorm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(s / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
  return r;
}

// dx += r * (dy * w - x * r^2 * mean(dy * w * x)), one row; dx may alias nothing else.
void rmsnorm_row_backward(const float* dy, const float* x, const float* w, float r, float* dx, int64_t n) {
  double c = 0;
  for (int64_t i = 0; i < n; ++i) c += static_cast<double>(dy[i]) * w[i] * x[i];
  const float k = static_cast<float>(c / static_cast<double>(n)) * r * r;
  for (int64_t i = 0; i < n; ++i) dx[i] += r * (dy[i] * w[i] - x[i] * k);
}

// The same backward in place: dy becomes dx (each output needs only its own dy and the sum).
void rmsnorm_row_backward_inplace(float* dy, const float* x, const float* w, float r, int64_t n) {
  double c = 0;
  for (int64_t i = 0; i < n; ++i) c += static_cast<double>(dy[i]) * w[i] * x[i];
  const float k = static_cast<float>(c / static_cast<double>(n)) * r * r;
  for (int64_t i = 0; i < n; ++i) dy[i] = r * (dy[i] * w[i] - x[i] * k);
}

float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

// ---------------------------------------------------------------- trainer

struct QueryTrainer::Impl {
  const Model* model = nullptr;
  const HParams* hp = nullptr;
  int64_t E = 0, H = 0, Hkv = 0, g = 0, d = 0, dv = 0, q_dim = 0, o_dim = 0, ff = 0, V = 0, L = 0;
  float scale = 0;

  // Weights (f32): W_q trainable [L, q_dim, E]; the others point into the file when they are
  // f32 there, else into `owned`.
  Buffer<float> wq, grad, adam_m, adam_v;
  int64_t adam_t = 0;
  std::vector<const float*> wo, wgate, wup, wdown;  // [L]
  const float* wout = nullptr;                      // [V, E]
  std::vector<Buffer<float>> owned;
  size_t owned_bytes = 0;

  // Activations of one span of S tokens (grown to the largest span seen).
  int64_t cap = 0;
  Buffer<float> x_in, h1, qpre, qr, o, x_mid, h2, gate, up;  // [L, S, ...]
  Buffer<float> r1, r2, rq, lse;                              // [L, S] / [L, S, H]
  Buffer<float> x, cur, tmp_ff, x_fin, hf, rf, logits;        // scratch
  Buffer<float> dx, dcur, dq, dff, dff2, dlog;
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

  const float* widen(const TensorView& w) {
    if (w.type == DType::F32) return static_cast<const float*>(w.data);
    owned.emplace_back(static_cast<size_t>(w.n_elements()));
    float* dst = owned.back().data();
    for (int64_t r = 0; r < w.n_rows(); ++r) kernels::dequantize_row(w.type, w.row(r), dst + r * w.ne[0], w.ne[0]);
    owned_bytes += static_cast<size_t>(w.n_elements()) * sizeof(float);
    return dst;
  }

  void reserve(int64_t S) {
    if (S <= cap) return;
    cap = S;
    auto sz = [](int64_t a) { return static_cast<size_t>(a); };
    x_in.resize(sz(L * S * E));
    h1.resize(sz(L * S * E));
    if (model->layers()[0].q_norm) qpre.resize(sz(L * S * q_dim));
    qr.resize(sz(L * S * q_dim));
    o.resize(sz(L * S * o_dim));
    x_mid.resize(sz(L * S * E));
    h2.resize(sz(L * S * E));
    gate.resize(sz(L * S * ff));
    up.resize(sz(L * S * ff));
    r1.resize(sz(L * S));
    r2.resize(sz(L * S));
    rq.resize(sz(L * S * H));
    lse.resize(sz(L * S * H));
    x.resize(sz(S * E));
    cur.resize(sz(S * std::max({E, q_dim, o_dim})));
    tmp_ff.resize(sz(S * ff));
    x_fin.resize(sz(S * E));
    hf.resize(sz(S * E));
    rf.resize(sz(S));
    logits.resize(sz(S * V));
    dx.resize(sz(S * E));
    dcur.resize(sz(S * std::max({E, q_dim, o_dim})));
    dq.resize(sz(S * q_dim));
    dff.resize(sz(S * ff));
    dff2.resize(sz(S * ff));
    pos.assign(sz(S), 0);
    neg_pos.assign(sz(S), 0);
    if (W > 0) {
      qw.resize(sz(L * S * q_dim));
      dqw.resize(sz(S * q_dim));
      wpos.assign(sz(S), static_cast<int32_t>(W));
      neg_wpos.assign(sz(S), static_cast<int32_t>(-W));
    }
    qscale.assign(sz(S), 1.0f);
  }

  size_t activation_bytes() const {
    const Buffer<float>* bufs[] = {&x_in, &h1, &qpre, &qr, &o, &x_mid, &h2, &gate, &up, &r1, &r2, &rq, &lse,
                                   &x, &cur, &tmp_ff, &x_fin, &hf, &rf, &logits, &dx, &dcur, &dq, &dff, &dff2,
                                   &qw, &dqw};
    size_t n = 0;
    for (const auto* b : bufs) n += b->size();
    for (const auto& s : scratch) {
      for (const Buffer<float>* b :
           {&s.q, &s.s, &s.dp, &s.acc, &s.dq, &s.dout, &s.m, &s.l, &s.dd, &s.k, &s.v, &s.qw, &s.dqw, &s.k0, &s.sf})
        n += b->size();
    }
    return n * sizeof(float);
  }
};

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

}  // namespace

QueryTrainer::QueryTrainer(Context& ctx) : impl_(std::make_unique<Impl>()), ctx_(ctx) {}
QueryTrainer::~QueryTrainer() = default;

int64_t QueryTrainer::n_layer() const { return impl_->L; }
float* QueryTrainer::wq(int64_t il) { return impl_->wq.data() + il * impl_->q_dim * impl_->E; }
const float* QueryTrainer::grad(int64_t il) const { return impl_->grad.data() + il * impl_->q_dim * impl_->E; }

size_t QueryTrainer::bytes() const {
  const Impl& m = *impl_;
  return (m.wq.size() + m.grad.size() + m.adam_m.size() + m.adam_v.size()) * sizeof(float) + m.owned_bytes +
         m.activation_bytes();
}

Expected<std::unique_ptr<QueryTrainer>> QueryTrainer::create(Context& ctx, int64_t n_context) {
  LC_TRY(check_qttt_context(ctx));
  if (n_context < 0) n_context = ctx.n_past();
  if (n_context > ctx.n_past())
    return make_error(strprintf("--qttt: %lld context tokens asked for but the cache holds %lld", (long long)n_context,
                                (long long)ctx.n_past()));
  if (n_context < 2)
    return make_error(strprintf("--qttt: the context has %lld token(s); a span needs at least 2", (long long)n_context));
  const KvCache& kv = ctx.kv();
  for (int64_t il = 0; il < kv.n_layer(); ++il)
    for (int64_t h = 0; h < kv.n_head_kv(); ++h)
      if (kv.n_tokens(il, h) != kv.n_appended(il) || kv.n_tokens(il, h) < n_context)
        return make_error(strprintf("--qttt: layer %lld KV head %lld holds %lld of the %lld tokens appended: qTTT "
                                    "needs every context token in the cache",
                                    (long long)il, (long long)h, (long long)kv.n_tokens(il, h),
                                    (long long)kv.n_appended(il)));
  auto t = std::unique_ptr<QueryTrainer>(new QueryTrainer(ctx));
  t->n_context_ = n_context;
  Impl& m = *t->impl_;
  const Model& model = ctx.model();
  const HParams& hp = model.hparams();
  m.model = &model;
  m.hp = &hp;
  m.E = hp.n_embd, m.H = hp.n_head, m.Hkv = hp.n_head_kv, m.g = hp.n_gqa(), m.d = hp.head_dim,
  m.dv = hp.head_dim_v, m.q_dim = hp.n_head * hp.head_dim, m.o_dim = hp.n_head * hp.head_dim_v, m.ff = hp.n_ff,
  m.V = hp.n_vocab, m.L = hp.n_layer;
  m.scale = ctx.attention().shape().scale;
  LC_ASSIGN_OR_RETURN(m.W, qttt_fixed_distance(ctx));
  blas_single_thread();
  try {
    const size_t nq = static_cast<size_t>(m.L * m.q_dim * m.E);
    m.wq.resize(nq);
    m.grad.resize(nq);
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

Expected<double> QueryTrainer::loss(int64_t start, int64_t S, bool want_grad) {
  Impl& m = *impl_;
  if (S < 2 || start < 0 || start + S > n_context_)
    return make_error(strprintf("--qttt: span [%lld, %lld) is not inside the context of %lld tokens", (long long)start,
                                (long long)(start + S), (long long)n_context_));
  const KvCache& kv = ctx_.kv();
  if (ctx_.n_past() < n_context_ || kv.n_tokens(0, 0) < n_context_)
    return make_error("--qttt: the context was truncated after the trainer was made");
  const int64_t B = kv.block_tokens();
  const int64_t RM = std::max(kRows, m.g);  // rows of the largest attention tile
  try {
    m.reserve(S);
    for (Impl::Scratch& sc : m.scratch) {
      for (Buffer<float>* b : {&sc.q, &sc.dq}) grow(*b, RM * m.d);
      for (Buffer<float>* b : {&sc.s, &sc.dp}) grow(*b, RM * B);
      for (Buffer<float>* b : {&sc.acc, &sc.dout}) grow(*b, RM * m.dv);
      for (Buffer<float>* b : {&sc.m, &sc.l, &sc.dd}) grow(*b, RM);
      grow(sc.k, B * m.d);
      grow(sc.v, B * m.dv);
      if (m.W > 0) {
        for (Buffer<float>* b : {&sc.qw, &sc.dqw}) grow(*b, RM * m.d);
        grow(sc.sf, RM * B);
        grow(sc.k0, B * m.d);
        sc.nf.resize(static_cast<size_t>(RM));
      }
    }
  } catch (const std::bad_alloc&) {
    return make_error(strprintf("--qttt: out of memory for the activations of a %lld-token span", (long long)S));
  }
  ThreadPool& pool = ctx_.pool();
  const Model& model = *m.model;
  const HParams& hp = *m.hp;
  const int64_t E = m.E, H = m.H, d = m.d, dv = m.dv, q_dim = m.q_dim, o_dim = m.o_dim, ff = m.ff, V = m.V;
  const int64_t g = m.g;
  const float eps = hp.rms_eps;
  const int32_t* tok = ctx_.tokens().data() + start;
  for (int64_t t = 0; t < S; ++t) {
    m.pos[static_cast<size_t>(t)] = kv.positions(0, 0)[start + t];
    m.neg_pos[static_cast<size_t>(t)] = -m.pos[static_cast<size_t>(t)];
    m.qscale[static_cast<size_t>(t)] = ctx_.rope_plan().q_scale(m.pos[static_cast<size_t>(t)]);
  }
  auto rows = [&](int64_t n, const std::function<void(int64_t)>& fn) {
    ranges(pool, n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
  };
  const std::vector<Tile> tiles = make_tiles(m.Hkv, g, S);

  // Fixed-distance attention (m.W > 0), for the R rows of a tile and keys [first, first + cnt)
  // whose near scores are in sc.s: sc.nf[r] is how many of the block's keys row r sees at the
  // fixed distance (they are the first ones: keys are in position order); their scores are
  // replaced by those of the row's query at W against the keys rotated back to 0 (sc.k0), as
  // attention `fixed` computes them. Returns whether any row has such keys.
  auto far_scores = [&](int64_t il, const Tile& tl, int64_t R, int64_t first, int64_t cnt, const float* K,
                        Impl::Scratch& sc) {
    if (m.W <= 0) return false;
    const int32_t* kp = kv.positions(il, tl.hk) + first;
    bool any = false;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t lim = static_cast<int64_t>(m.pos[static_cast<size_t>(tl.t0 + r / g)]) - m.W;
      const int64_t nf = std::lower_bound(kp, kp + cnt, lim, [](int32_t a, int64_t b) { return a < b; }) - kp;
      sc.nf[static_cast<size_t>(r)] = nf;
      any = any || nf > 0;
    }
    if (!any) return false;
    std::memcpy(sc.k0.data(), K, sizeof(float) * static_cast<size_t>(cnt * d));
    attn::unrotate_rows(sc.k0.data(), cnt, d, kp, kv.rope(il));
    sgemm(false, true, R, cnt, d, m.scale, sc.qw.data(), d, sc.k0.data(), d, 0.0f, sc.sf.data(), cnt);
    for (int64_t r = 0; r < R; ++r)
      std::memcpy(sc.s.data() + r * cnt, sc.sf.data() + r * cnt, sizeof(float) * static_cast<size_t>(sc.nf[static_cast<size_t>(r)]));
    return true;
  };
  // Copies the tile's rows of a [S, H, d] query buffer into dst ([R, d]).
  auto tile_rows = [&](const Tile& tl, const float* src, float* dst) {
    for (int64_t t = 0; t < tl.nt; ++t)
      std::memcpy(dst + t * g * d, src + ((tl.t0 + t) * H + tl.hk * g) * d, sizeof(float) * g * d);
  };

  // Attention of the span's queries qr: [S, H, d] (rotated) over layer il's cached keys; out:
  // [S, H, dv], lse: [S, H].
  // qw: the same queries rotated at the fixed distance (null without one).
  auto attn_forward = [&](int64_t il, const float* qr, const float* qw, float* out, float* lse) {
    pool.parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t b, int64_t e, int ith) {
      Impl::Scratch& sc = m.scratch[static_cast<size_t>(ith)];
      for (int64_t it = b; it < e; ++it) {
        const Tile& tl = tiles[static_cast<size_t>(it)];
        const int64_t R = tl.nt * g;
        tile_rows(tl, qr, sc.q.data());
        if (qw) tile_rows(tl, qw, sc.qw.data());
        std::fill(sc.acc.data(), sc.acc.data() + R * dv, 0.0f);
        std::fill(sc.m.data(), sc.m.data() + R, -std::numeric_limits<float>::infinity());
        std::fill(sc.l.data(), sc.l.data() + R, 0.0f);
        const int64_t lv = start + tl.t0 + tl.nt;  // keys the tile's last token sees
        for (int64_t first = 0; first < lv; first += B) {
          const int64_t cnt = std::min(B, lv - first);
          const float* K = kv.keys_f32(il, tl.hk, first, cnt, sc.k.data());
          const float* Vv = kv.values_f32(il, tl.hk, first, cnt, sc.v.data());
          sgemm(false, true, R, cnt, d, m.scale, sc.q.data(), d, K, d, 0.0f, sc.s.data(), cnt);
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
          sgemm(false, false, R, dv, cnt, 1.0f, sc.s.data(), cnt, Vv, dv, 1.0f, sc.acc.data(), dv);
        }
        for (int64_t r = 0; r < R; ++r) {
          const int64_t t = tl.t0 + r / g, h = tl.hk * g + r % g;
          const float l = sc.l[static_cast<size_t>(r)];
          float* orow = out + (t * H + h) * dv;
          for (int64_t c = 0; c < dv; ++c) orow[c] = sc.acc[static_cast<size_t>(r * dv + c)] / l;
          lse[t * H + h] = sc.m[static_cast<size_t>(r)] + std::log(l);
        }
      }
    });
  };

  // dqr: [S, H, d] (overwritten) from dout: [S, H, dv]; with a fixed distance also dqw, the
  // gradient of the queries at W (overwritten).
  auto attn_backward = [&](int64_t il, const float* qr, const float* qw, const float* out, const float* lse,
                           const float* dout, float* dqr, float* dqw) {
    pool.parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t b, int64_t e, int ith) {
      Impl::Scratch& sc = m.scratch[static_cast<size_t>(ith)];
      for (int64_t it = b; it < e; ++it) {
        const Tile& tl = tiles[static_cast<size_t>(it)];
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
            sc.dd[static_cast<size_t>(t * g + j)] =
                kernels::dot_f32(dout + (row0 + j) * dv, out + (row0 + j) * dv, dv);
            sc.m[static_cast<size_t>(t * g + j)] = lse[row0 + j];
          }
        }
        std::fill(sc.dq.data(), sc.dq.data() + R * d, 0.0f);
        const int64_t lv = start + tl.t0 + tl.nt;
        for (int64_t first = 0; first < lv; first += B) {
          const int64_t cnt = std::min(B, lv - first);
          const float* K = kv.keys_f32(il, tl.hk, first, cnt, sc.k.data());
          const float* Vv = kv.values_f32(il, tl.hk, first, cnt, sc.v.data());
          sgemm(false, true, R, cnt, d, m.scale, sc.q.data(), d, K, d, 0.0f, sc.s.data(), cnt);
          sgemm(false, true, R, cnt, dv, 1.0f, sc.dout.data(), dv, Vv, dv, 0.0f, sc.dp.data(), cnt);
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
            sgemm(false, false, R, d, cnt, m.scale, sc.sf.data(), cnt, sc.k0.data(), d, 1.0f, sc.dqw.data(), d);
          }
          sgemm(false, false, R, d, cnt, m.scale, sc.s.data(), cnt, K, d, 1.0f, sc.dq.data(), d);
        }
        for (int64_t t = 0; t < tl.nt; ++t) {
          const int64_t row0 = (tl.t0 + t) * H + tl.hk * g;
          std::memcpy(dqr + row0 * d, sc.dq.data() + t * g * d, sizeof(float) * g * d);
          if (qw) std::memcpy(dqw + row0 * d, sc.dqw.data() + t * g * d, sizeof(float) * g * d);
        }
      }
    });
  };

  auto at = [](Buffer<float>& b, int64_t il, int64_t stride) { return b.data() + il * stride; };
  const int64_t sE = S * E, sQ = S * q_dim, sO = S * o_dim, sF = S * ff;
  float* x = m.x.data();
  const TensorView& te = model.tok_embd();
  for (int64_t t = 0; t < S; ++t) kernels::dequantize_row(te.type, te.row(tok[t]), x + t * E, E);

  // ---- forward
  for (int64_t il = 0; il < m.L; ++il) {
    const LayerWeights& lw = model.layers()[static_cast<size_t>(il)];
    float* xin = at(m.x_in, il, sE);
    float* h1 = at(m.h1, il, sE);
    float* r1 = at(m.r1, il, S);
    float* qr = at(m.qr, il, sQ);
    float* rq = at(m.rq, il, S * H);
    std::memcpy(xin, x, sizeof(float) * sE);
    rows(S, [&](int64_t t) { r1[t] = rmsnorm_row(x + t * E, lw.attn_norm, h1 + t * E, E, eps); });
    linear(pool, h1, wq(il), qr, S, E, q_dim);
    rows(S, [&](int64_t t) {
      float* q = qr + t * q_dim;
      if (lw.bq) kernels::add_inplace(q, lw.bq, q_dim);
      if (lw.q_norm) {
        std::memcpy(at(m.qpre, il, sQ) + t * q_dim, q, sizeof(float) * q_dim);
        for (int64_t h = 0; h < H; ++h) rq[t * H + h] = rmsnorm_row(q + h * d, lw.q_norm, q + h * d, d, eps);
      }
      kernels::scale_inplace(q, m.qscale[static_cast<size_t>(t)], q_dim);
    });
    float* qw = nullptr;
    if (m.W > 0) {  // the queries at the fixed distance: the same scaled query, rotated at W
      qw = at(m.qw, il, sQ);
      std::memcpy(qw, qr, sizeof(float) * sQ);
      kv.rope(il).apply(qw, S, H, d, m.wpos.data());
    }
    kv.rope(il).apply(qr, S, H, d, m.pos.data());
    float* o = at(m.o, il, sO);
    attn_forward(il, qr, qw, o, at(m.lse, il, S * H));
    linear(pool, o, m.wo[static_cast<size_t>(il)], m.cur.data(), S, o_dim, E);
    kernels::add_inplace(x, m.cur.data(), sE);
    float* xmid = at(m.x_mid, il, sE);
    float* h2 = at(m.h2, il, sE);
    float* r2 = at(m.r2, il, S);
    float* gate = at(m.gate, il, sF);
    float* up = at(m.up, il, sF);
    std::memcpy(xmid, x, sizeof(float) * sE);
    rows(S, [&](int64_t t) { r2[t] = rmsnorm_row(x + t * E, lw.ffn_norm, h2 + t * E, E, eps); });
    linear(pool, h2, m.wgate[static_cast<size_t>(il)], gate, S, E, ff);
    linear(pool, h2, m.wup[static_cast<size_t>(il)], up, S, E, ff);
    rows(S, [&](int64_t t) { kernels::swiglu(gate + t * ff, up + t * ff, m.tmp_ff.data() + t * ff, ff); });
    linear(pool, m.tmp_ff.data(), m.wdown[static_cast<size_t>(il)], m.cur.data(), S, ff, E);
    kernels::add_inplace(x, m.cur.data(), sE);
  }

  // ---- loss: rows 0 .. S-2 predict tokens 1 .. S-1 of the span
  const int64_t P = S - 1;
  std::memcpy(m.x_fin.data(), x, sizeof(float) * sE);
  rows(P, [&](int64_t t) { m.rf[t] = rmsnorm_row(x + t * E, model.output_norm(), m.hf.data() + t * E, E, eps); });
  linear(pool, m.hf.data(), m.wout, m.logits.data(), P, E, V);
  std::vector<double> row_loss(static_cast<size_t>(P));
  rows(P, [&](int64_t t) {
    float* lg = m.logits.data() + t * V;
    const float mx = *std::max_element(lg, lg + V);
    double sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(static_cast<double>(lg[c] - mx));
    const double lse = static_cast<double>(mx) + std::log(sum);
    row_loss[static_cast<size_t>(t)] = lse - static_cast<double>(lg[tok[t + 1]]);
    if (want_grad) {
      // dL/dlogits = (softmax - onehot) / P, in place.
      const float inv = 1.0f / static_cast<float>(P);
      for (int64_t c = 0; c < V; ++c) lg[c] = static_cast<float>(std::exp(static_cast<double>(lg[c]) - lse)) * inv;
      lg[tok[t + 1]] -= inv;
    }
  });
  double total = 0;
  for (double l : row_loss) total += l;
  const double mean = total / static_cast<double>(P);
  if (!want_grad) return mean;

  // ---- backward
  float* dx = m.dx.data();
  float* dcur = m.dcur.data();
  linear_dx(pool, m.logits.data(), m.wout, dcur, P, E, V, false);
  std::fill(dx, dx + sE, 0.0f);
  rows(P, [&](int64_t t) {
    rmsnorm_row_backward(dcur + t * E, m.x_fin.data() + t * E, model.output_norm(), m.rf[t], dx + t * E, E);
  });
  for (int64_t il = m.L - 1; il >= 0; --il) {
    const LayerWeights& lw = model.layers()[static_cast<size_t>(il)];
    // MLP: x_out = x_mid + W_down swiglu(W_gate h2, W_up h2), h2 = rmsnorm(x_mid).
    float* gate = at(m.gate, il, sF);
    float* up = at(m.up, il, sF);
    linear_dx(pool, dx, m.wdown[static_cast<size_t>(il)], m.dff.data(), S, ff, E, false);
    rows(S, [&](int64_t t) {
      float* dh = m.dff.data() + t * ff;  // becomes dgate
      float* du = m.dff2.data() + t * ff;
      const float* gr = gate + t * ff;
      const float* ur = up + t * ff;
      for (int64_t c = 0; c < ff; ++c) {
        const float sg = sigmoid(gr[c]);
        const float silu = gr[c] * sg;
        du[c] = dh[c] * silu;
        dh[c] = dh[c] * ur[c] * sg * (1.0f + gr[c] * (1.0f - sg));
      }
    });
    linear_dx(pool, m.dff.data(), m.wgate[static_cast<size_t>(il)], dcur, S, E, ff, false);
    linear_dx(pool, m.dff2.data(), m.wup[static_cast<size_t>(il)], dcur, S, E, ff, true);
    const float* xmid = at(m.x_mid, il, sE);
    const float* r2 = at(m.r2, il, S);
    rows(S, [&](int64_t t) { rmsnorm_row_backward(dcur + t * E, xmid + t * E, lw.ffn_norm, r2[t], dx + t * E, E); });
    // Attention: x_mid = x_in + W_o attn(q), q from h1 = rmsnorm(x_in).
    float* dout = m.cur.data();  // [S, o_dim]
    linear_dx(pool, dx, m.wo[static_cast<size_t>(il)], dout, S, o_dim, E, false);
    float* dq = m.dq.data();
    attn_backward(il, at(m.qr, il, sQ), m.W > 0 ? at(m.qw, il, sQ) : nullptr, at(m.o, il, sO),
                  at(m.lse, il, S * H), dout, dq, m.dqw.data());
    // RoPE is orthogonal up to mscale: its transpose is the rotation by the negated angles.
    kv.rope(il).apply(dq, S, H, d, m.neg_pos.data());
    if (m.W > 0) {
      kv.rope(il).apply(m.dqw.data(), S, H, d, m.neg_wpos.data());
      kernels::add_inplace(dq, m.dqw.data(), sQ);
    }
    const float* rq = at(m.rq, il, S * H);
    rows(S, [&](int64_t t) {
      float* q = dq + t * q_dim;
      kernels::scale_inplace(q, m.qscale[static_cast<size_t>(t)], q_dim);
      if (lw.q_norm) {
        const float* qp = at(m.qpre, il, sQ) + t * q_dim;
        for (int64_t h = 0; h < H; ++h) rmsnorm_row_backward_inplace(q + h * d, qp + h * d, lw.q_norm, rq[t * H + h], d);
      }
    });
    const float* h1 = at(m.h1, il, sE);
    linear_dw(pool, dq, h1, m.grad.data() + il * q_dim * E, S, E, q_dim);
    if (il == 0) break;  // nothing below the first layer is trained
    linear_dx(pool, dq, wq(il), dcur, S, E, q_dim, false);
    const float* xin = at(m.x_in, il, sE);
    const float* r1 = at(m.r1, il, S);
    rows(S, [&](int64_t t) { rmsnorm_row_backward(dcur + t * E, xin + t * E, lw.attn_norm, r1[t], dx + t * E, E); });
  }
  return mean;
}

void QueryTrainer::adam_step(double lr) {
  Impl& m = *impl_;
  constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  ++m.adam_t;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(m.adam_t));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(m.adam_t));
  const float step = static_cast<float>(lr / c1);
  const float ic2 = static_cast<float>(1.0 / c2);
  float* w = m.wq.data();
  float* mm = m.adam_m.data();
  float* vv = m.adam_v.data();
  const float* gr = m.grad.data();
  ranges(ctx_.pool(), static_cast<int64_t>(m.wq.size()), 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      mm[i] = static_cast<float>(b1) * mm[i] + static_cast<float>(1 - b1) * gr[i];
      vv[i] = static_cast<float>(b2) * vv[i] + static_cast<float>(1 - b2) * gr[i] * gr[i];
      w[i] -= step * mm[i] / (std::sqrt(vv[i] * ic2) + static_cast<float>(eps));
    }
  });
}

void QueryTrainer::install() {
  Buffer<float> w(impl_->wq.size());
  std::memcpy(w.data(), impl_->wq.data(), sizeof(float) * w.size());
  ctx_.set_query_weights(std::move(w));
}

// ---------------------------------------------------------------- driver

Expected<QtttStats> run_qttt(Context& ctx, const QtttParams& p, uint64_t seed, int64_t n_context) {
  QtttStats st;
  st.steps = p.steps;
  st.span = p.span;
  if (!p.enabled()) return st;
  const double t0 = now_seconds();
  if (n_context < 0) n_context = ctx.n_past();
  st.n_context = n_context;
  LC_TRY(check_qttt_span(p, n_context));
  LC_ASSIGN_OR_RETURN(std::unique_ptr<QueryTrainer> tr, QueryTrainer::create(ctx, n_context));
  std::mt19937_64 rng(seed);
  const uint64_t n_starts = static_cast<uint64_t>(n_context - p.span + 1);
  const double t1 = now_seconds();
  for (int64_t s = 0; s < p.steps; ++s) {
    const int64_t start = static_cast<int64_t>(rng() % n_starts);
    LC_ASSIGN_OR_RETURN(double l, tr->loss(start, p.span, true));
    tr->adam_step(p.lr);
    st.step_loss.push_back(l);
    st.starts.push_back(start);
  }
  st.step_seconds = now_seconds() - t1;
  st.loss_before = st.step_loss.front();
  LC_ASSIGN_OR_RETURN(st.loss_after, tr->loss(st.starts.front(), p.span, false));
  st.extra_bytes = tr->bytes();
  tr->install();
  st.seconds = now_seconds() - t0;
  return st;
}

std::string qttt_summary(const QtttStats& s) {
  if (s.steps == 0) return "qTTT:       off (steps=0)";
  return strprintf("qTTT:       %lld steps x %lld tokens in %.3f s (%.2f s of steps = %.1f tokens/s), loss on the "
                   "first span %.4f -> %.4f, %.2f MiB extra",
                   (long long)s.steps, (long long)s.span, s.seconds, s.step_seconds, s.tokens_per_second(),
                   s.loss_before, s.loss_after, static_cast<double>(s.extra_bytes) / (1024.0 * 1024.0));
}

}  // namespace lc
