#include "train/chunked.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <type_traits>

#include "grad/ops.h"
#include "kernels/kernels.h"

namespace lc::train {
namespace {

// Query rows per attention task. Keys go a page at a time.
constexpr int64_t kQBlock = 64;

// x[i] = exp(x[i] - m) for i < n; returns the sum. The float path is the inference engine's
// vectorised exp (about 1 ulp; -inf gives 0).
template <class T>
T exp_sub_sum(T* x, int64_t n, T m) {
  if constexpr (std::is_same_v<T, float>) {
    return n > 0 ? kernels::exp_sub_sum(x, n, m) : 0.0f;
  } else {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += (x[i] = std::exp(x[i] - m));
    return s;
  }
}

// Tasks ith, ith + nth, ...: deterministic for a given thread count, and balances causal
// attention, whose tasks grow with the row index.
template <class F>
void strided_tasks(ThreadPool& pool, int64_t n, const F& fn) {
  const int nth = pool.size();
  pool.run([&](int ith) {
    for (int64_t t = ith; t < n; t += nth) fn(t, ith);
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PagedKv

template <class T>
PagedKv<T>::PagedKv(int64_t n_layer, int64_t kv_dim, int64_t page_tokens)
    : n_layer_(n_layer), kv_dim_(kv_dim), page_(page_tokens), table_(static_cast<size_t>(n_layer)) {}

template <class T>
Status PagedKv<T>::reserve(int64_t n_tokens) {
  const size_t need = static_cast<size_t>(n_layer_ * ((n_tokens + page_ - 1) / page_));
  try {
    storage_.reserve(need);
    free_.reserve(need);
    for (auto& t : table_) t.reserve(need / static_cast<size_t>(n_layer_));
    while (storage_.size() < need) {
      storage_.emplace_back(static_cast<size_t>(2 * page_ * kv_dim_));
      free_.push_back(static_cast<int32_t>(storage_.size() - 1));
    }
  } catch (const std::bad_alloc&) {
    return make_error(fmt::format("out of memory allocating {} K/V pages of {} bytes ({} tokens)", need,
                                  page_bytes(), n_tokens));
  }
  return ok_status();
}

template <class T>
int32_t PagedKv<T>::take_page(bool zero) {
  if (free_.empty()) {
    storage_.emplace_back(static_cast<size_t>(2 * page_ * kv_dim_));  // zeroed by Buffer
    return static_cast<int32_t>(storage_.size() - 1);
  }
  const int32_t p = free_.back();
  free_.pop_back();
  if (zero) std::memset(storage_[static_cast<size_t>(p)].data(), 0, page_bytes());
  return p;
}

template <class T>
void PagedKv<T>::ensure(int64_t n_tokens, bool zero) {
  const size_t pages = static_cast<size_t>((n_tokens + page_ - 1) / page_);
  for (auto& t : table_)
    while (t.size() < pages) t.push_back(take_page(zero));
  n_tok_ = std::max(n_tok_, n_tokens);
}

template <class T>
void PagedKv<T>::release() {
  // In reverse, so that the next sequence takes the pages in the same order.
  for (auto it = table_.rbegin(); it != table_.rend(); ++it) {
    for (auto p = it->rbegin(); p != it->rend(); ++p) free_.push_back(*p);
    it->clear();
  }
  n_tok_ = 0;
}

template <class T>
size_t PagedKv<T>::pages_in_use() const {
  size_t n = 0;
  for (const auto& t : table_) n += t.size();
  return n;
}

// ---------------------------------------------------------------------------------------------
// ChunkRecurrent

template <class T>
ChunkRecurrent<T>::ChunkRecurrent(Transformer<T>& m, int64_t chunk, int64_t page_tokens)
    : m_(m),
      c_(m.config()),
      chunk_(chunk),
      kv_(c_.n_layer, c_.kv_dim(), page_tokens),
      dkv_(c_.n_layer, c_.kv_dim(), page_tokens) {}

template <class T>
Expected<std::unique_ptr<ChunkRecurrent<T>>> ChunkRecurrent<T>::create(Transformer<T>& model, int64_t chunk,
                                                                       int64_t max_tokens, int64_t page_tokens) {
  const ModelConfig& c = model.config();
  if (max_tokens < 1 || max_tokens > c.n_ctx)
    return make_error(fmt::format("sequence length {} must be in [1, n_ctx = {}]", max_tokens,
                                  c.n_ctx));
  if (chunk < 1 || chunk > max_tokens)
    return make_error(fmt::format("chunk {} must be in [1, sequence length = {}]", chunk,
                                  max_tokens));
  if (page_tokens < 1 || page_tokens > (1 << 16))
    return make_error(fmt::format("K/V page of {} tokens is out of range [1, 65536]", page_tokens));
  std::unique_ptr<ChunkRecurrent<T>> r(new ChunkRecurrent<T>(model, chunk, page_tokens));
  r->max_t_ = max_tokens;
  auto off = [&](const std::string& name) {
    const ParamTensor* t = model.find(name);
    LC_CHECK(t != nullptr);
    return t->offset;
  };
  r->tok_embd_ = off("token_embd.weight");
  r->output_norm_ = off("output_norm.weight");
  r->output_ = c.tied ? r->tok_embd_ : off("output.weight");
  r->rope_ = make_train_rope(c);
  r->rope_inv_ = grad::inverse_rope(r->rope_);
  const size_t C = static_cast<size_t>(chunk), L = static_cast<size_t>(c.n_layer);
  const size_t E = static_cast<size_t>(c.n_embd), F = static_cast<size_t>(c.n_ff),
               qd = static_cast<size_t>(c.q_dim()), kd = static_cast<size_t>(c.kv_dim()),
               H = static_cast<size_t>(c.n_head), V = static_cast<size_t>(c.n_vocab);
  try {
    r->tokens_.assign(static_cast<size_t>(max_tokens), 0);
    r->targets_.assign(static_cast<size_t>(max_tokens), 0);
    r->pos_.assign(C, 0);
    r->resid_.resize((L + 1) * C * E);
    r->mid_.resize(L * C * E);
    r->ln1_.resize(L * C * E);
    r->ln2_.resize(L * C * E);
    r->rstd1_.resize(L * C);
    r->rstd2_.resize(L * C);
    r->q_.resize(L * C * qd);
    r->att_.resize(L * C * qd);
    r->att_lse_.resize(L * H * C);
    r->k_.resize(C * kd);
    r->v_.resize(C * kd);
    r->gate_.resize(L * C * F);
    r->up_.resize(L * C * F);
    r->h_.resize(L * C * F);
    r->lnf_.resize(C * E);
    r->rstdf_.resize(C);
    r->logits_.resize(C * V);
    r->lse_.resize(C);
    r->losses_.resize(C);
    r->dresid_.resize(C * E);
    r->dln_.resize(C * E);
    r->tmp_.resize(C * E);
    r->datt_.resize(C * qd);
    r->dq_.resize(C * qd);
    r->dh_.resize(C * F);
    r->dgate_.resize(C * F);
    r->dup_.resize(C * F);
    r->dsum_.resize(H * C);
  } catch (const std::bad_alloc&) {
    return make_error(fmt::format("out of memory allocating the activations of a {}-token chunk", chunk));
  }
  return r;
}

template <class T>
Status ChunkRecurrent<T>::reserve(int64_t n_tokens) {
  LC_TRY(kv_.reserve(n_tokens));
  return dkv_.reserve(n_tokens);
}

template <class T>
void ChunkRecurrent<T>::allocate_scratch(int n_threads) {
  if (n_threads <= scratch_threads_) return;
  const size_t n = static_cast<size_t>(n_threads), P = static_cast<size_t>(kv_.page_tokens()),
               Q = static_cast<size_t>(kQBlock), hd = static_cast<size_t>(c_.head_dim());
  tile_s_.resize(n * Q * P);
  tile_d_.resize(n * Q * P);
  tile_o_.resize(n * Q * hd);
  tile_m_.resize(n * Q);
  tile_l_.resize(n * Q);
  tile_dq_.resize(n * static_cast<size_t>(chunk_ * c_.q_dim()));
  scratch_threads_ = n_threads;
}

template <class T>
size_t ChunkRecurrent<T>::activation_bytes() const {
  const Buffer<T>* all[] = {&resid_,  &mid_,    &ln1_,    &ln2_,    &rstd1_,  &rstd2_, &q_,     &att_,
                            &att_lse_, &k_,      &v_,      &gate_,   &up_,     &h_,     &lnf_,   &rstdf_,
                            &logits_,  &lse_,    &losses_, &dresid_, &dln_,    &tmp_,   &datt_,  &dq_,
                            &dh_,      &dgate_,  &dup_,    &dsum_,   &tile_s_, &tile_d_, &tile_o_, &tile_m_,
                            &tile_l_,  &tile_dq_};
  size_t n = 0;
  for (const auto* b : all) n += b->size();
  return n * sizeof(T) + pos_.size() * sizeof(int32_t);
}

template <class T>
size_t ChunkRecurrent<T>::pool_bytes_per_token() const {
  return static_cast<size_t>(4 * c_.n_layer * c_.kv_dim()) * sizeof(T);
}

// Attention of the chunk's queries [s, s + cn) over pooled keys [0, s + cn), causal. Each task is
// one head and kQBlock query rows; it walks the pages of keys it can see with an online softmax
// (running max m and sum l per row, the output rescaled when m grows), so no row of
// probabilities longer than a page exists. lse[h, t] = m + log l is kept for the backward pass.
template <class T>
void ChunkRecurrent<T>::attention_forward(int64_t il, int64_t s, int64_t cn, const T* q, T* out, T* lse,
                                          ThreadPool& pool) {
  const int64_t H = c_.n_head, hd = c_.head_dim(), group = c_.n_head / c_.n_head_kv;
  const int64_t qs = H * hd, kd = c_.kv_dim(), P = kv_.page_tokens(), C = chunk_;
  const int64_t nqb = (cn + kQBlock - 1) / kQBlock;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  strided_tasks(pool, H * nqb, [&](int64_t task, int ith) {
    const int64_t h = task % H, kh = h / group;
    const int64_t t0 = (task / H) * kQBlock, t1 = std::min(cn, t0 + kQBlock), bq = t1 - t0;
    T* S = tile_s_.data() + static_cast<size_t>(ith) * kQBlock * P;
    T* O = tile_o_.data() + static_cast<size_t>(ith) * kQBlock * hd;
    T* mx = tile_m_.data() + static_cast<size_t>(ith) * kQBlock;
    T* sum = tile_l_.data() + static_cast<size_t>(ith) * kQBlock;
    std::fill(mx, mx + bq, -INFINITY);
    std::fill(sum, sum + bq, T(0));
    std::fill(O, O + bq * hd, T(0));
    const int64_t end = s + t1;  // keys [0, end) are visible to some row of the block
    for (int64_t p = 0, j0 = 0; j0 < end; ++p, j0 += P) {
      const int64_t bk = std::min(P, end - j0);
      grad::gemm<T>(false, true, bq, bk, hd, scale, q + t0 * qs + h * hd, qs, kv_.keys(il, p) + kh * hd, kd, T(0), S, P);
      for (int64_t r = 0; r < bq; ++r) {
        T* row = S + r * P;
        const int64_t nv = std::clamp<int64_t>(s + t0 + r - j0 + 1, 0, bk);  // keys j <= position
        if (nv == 0) {
          std::fill(row, row + bk, T(0));
          continue;
        }
        T m = row[0];
        for (int64_t j = 1; j < nv; ++j) m = std::max(m, row[j]);
        const T m_new = std::max(mx[r], m);
        const T corr = std::exp(mx[r] - m_new);  // 0 on the first page (mx = -inf)
        const T add = exp_sub_sum<T>(row, nv, m_new);
        std::fill(row + nv, row + bk, T(0));
        sum[r] = sum[r] * corr + add;
        if (corr != T(1))
          for (int64_t d = 0; d < hd; ++d) O[r * hd + d] *= corr;
        mx[r] = m_new;
      }
      grad::gemm<T>(false, false, bq, hd, bk, T(1), S, P, kv_.values(il, p) + kh * hd, kd, T(1), O, hd);
    }
    for (int64_t r = 0; r < bq; ++r) {
      const T inv = T(1) / sum[r];
      T* o = out + (t0 + r) * qs + h * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = O[r * hd + d] * inv;
      lse[h * C + t0 + r] = mx[r] + std::log(sum[r]);
    }
  });
}

// The backward pass of attention_forward, recomputing P = exp(scale q k - lse) page by page.
// With D = rowsum(dO * O): dP = dO V^T, dS = P (dP - D), dQ = scale dS K, dK += scale dS^T Q,
// dV += P^T dO. dq [cn, n_head, hd] is overwritten; dK/dV are added into the gradient pool for
// every key [0, s + cn) the chunk saw. One pass over tasks of (KV head, page), each summing over
// its group's query heads and the chunk's query blocks, so that each row of dK/dV has one
// writer; dQ, which every page adds to, goes to one accumulator per thread, summed at the end
// (in thread order: deterministic for a given thread count).
template <class T>
void ChunkRecurrent<T>::attention_backward(int64_t il, int64_t s, int64_t cn, const T* q, const T* out,
                                           const T* lse, const T* dout, T* dq, ThreadPool& pool) {
  const int64_t H = c_.n_head, Hkv = c_.n_head_kv, hd = c_.head_dim(), group = H / Hkv;
  const int64_t qs = H * hd, kd = c_.kv_dim(), P = kv_.page_tokens(), C = chunk_, e = s + cn;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  const int nth = pool.size();
  T* D = dsum_.data();
  grad::parallel_rows(pool, cn, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const T* o = out + t * qs + h * hd;
        const T* g = dout + t * qs + h * hd;
        T acc = 0;
        for (int64_t d = 0; d < hd; ++d) acc += o[d] * g[d];
        D[h * C + t] = acc;
      }
  });
  std::memset(tile_dq_.data(), 0, static_cast<size_t>(nth) * static_cast<size_t>(C * qs) * sizeof(T));
  const int64_t npages = (e + P - 1) / P;
  strided_tasks(pool, Hkv * npages, [&](int64_t task, int ith) {
    const int64_t kh = task % Hkv, p = task / Hkv, j0 = p * P, bk = std::min(P, e - j0);
    T* Pt = tile_s_.data() + static_cast<size_t>(ith) * kQBlock * P;
    T* dSt = tile_d_.data() + static_cast<size_t>(ith) * kQBlock * P;
    T* dQ = tile_dq_.data() + static_cast<size_t>(ith) * static_cast<size_t>(C * qs);
    const T* K = kv_.keys(il, p) + kh * hd;
    const T* Vp = kv_.values(il, p) + kh * hd;
    T* dK = dkv_.keys(il, p) + kh * hd;
    T* dV = dkv_.values(il, p) + kh * hd;
    const int64_t first = std::max<int64_t>(0, j0 - s) / kQBlock * kQBlock;  // rows before never see the page
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h)
      for (int64_t t0 = first; t0 < cn; t0 += kQBlock) {
        const int64_t bq = std::min(kQBlock, cn - t0);
        // P and dS of rows [t0, t0 + bq) against the page's keys j0 + [0, bk), zero where masked.
        grad::gemm<T>(false, true, bq, bk, hd, scale, q + t0 * qs + h * hd, qs, K, kd, T(0), Pt, P);
        grad::gemm<T>(false, true, bq, bk, hd, T(1), dout + t0 * qs + h * hd, qs, Vp, kd, T(0), dSt, P);
        for (int64_t r = 0; r < bq; ++r) {
          T* pr = Pt + r * P;
          T* dr = dSt + r * P;
          const int64_t nv = std::clamp<int64_t>(s + t0 + r - j0 + 1, 0, bk);
          exp_sub_sum<T>(pr, nv, lse[h * C + t0 + r]);
          const T dsum = D[h * C + t0 + r];
          for (int64_t j = 0; j < nv; ++j) dr[j] = pr[j] * (dr[j] - dsum);
          std::fill(pr + nv, pr + bk, T(0));
          std::fill(dr + nv, dr + bk, T(0));
        }
        grad::gemm<T>(true, false, bk, hd, bq, scale, dSt, P, q + t0 * qs + h * hd, qs, T(1), dK, kd);
        grad::gemm<T>(true, false, bk, hd, bq, T(1), Pt, P, dout + t0 * qs + h * hd, qs, T(1), dV, kd);
        grad::gemm<T>(false, false, bq, hd, bk, scale, dSt, P, K, kd, T(1), dQ + t0 * qs + h * hd, qs);
      }
  });
  grad::parallel_rows(pool, cn * qs, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T acc = tile_dq_[static_cast<size_t>(i)];
      for (int th = 1; th < nth; ++th) acc += tile_dq_[static_cast<size_t>(th) * static_cast<size_t>(C * qs) + i];
      dq[i] = acc;
    }
  });
}

template <class T>
BlockActs<T> ChunkRecurrent<T>::acts(int64_t il) {
  const int64_t E = c_.n_embd, F = c_.n_ff, qd = c_.q_dim(), C = chunk_;
  // K and V of the chunk are staged in one buffer shared by the layers: the pool keeps them.
  return BlockActs<T>{resid_.data() + il * C * E, ln1_.data() + il * C * E, rstd1_.data() + il * C,
                      q_.data() + il * C * qd,    k_.data(),                v_.data(),
                      att_.data() + il * C * qd,  mid_.data() + il * C * E, ln2_.data() + il * C * E,
                      rstd2_.data() + il * C,     gate_.data() + il * C * F, up_.data() + il * C * F,
                      h_.data() + il * C * F,     resid_.data() + (il + 1) * C * E};
}

template <class T>
double ChunkRecurrent<T>::chunk_forward(int64_t s, int64_t cn, ThreadPool& pool) {
  const int64_t E = c_.n_embd, V = c_.n_vocab, kd = c_.kv_dim(), H = c_.n_head, C = chunk_;
  const T* W = m_.params();
  for (int64_t t = 0; t < cn; ++t) pos_[static_cast<size_t>(t)] = static_cast<int32_t>(s + t);
  T* x0 = resid_.data();
  for (int64_t t = 0; t < cn; ++t)
    std::memcpy(x0 + t * E, W + tok_embd_ + static_cast<size_t>(tokens_[static_cast<size_t>(s + t)]) * E,
                static_cast<size_t>(E) * sizeof(T));
  for (int64_t il = 0; il < c_.n_layer; ++il) {
    const BlockActs<T> a = acts(il);
    block_forward<T>(c_, W, m_.block(il), a, cn, pos_.data(), rope_, tmp_.data(), pool, [&] {
      // Into the pool: later chunks attend to these rows. (The backward pass's recomputation
      // writes the same values again.)
      for (int64_t t = 0; t < cn; ++t) {
        std::memcpy(kv_.key_row(il, s + t), a.k + t * kd, static_cast<size_t>(kd) * sizeof(T));
        std::memcpy(kv_.value_row(il, s + t), a.v + t * kd, static_cast<size_t>(kd) * sizeof(T));
      }
      attention_forward(il, s, cn, a.q, a.att, att_lse_.data() + il * H * C, pool);
    });
  }
  const T* xf = resid_.data() + c_.n_layer * C * E;
  grad::rmsnorm_forward<T>(xf, W + output_norm_, lnf_.data(), rstdf_.data(), cn, E, c_.rms_eps, pool);
  grad::linear_forward<T>(lnf_.data(), W + output_, logits_.data(), cn, E, V, pool);
  if (!have_targets_) return 0.0;
  return grad::cross_entropy_forward<T>(logits_.data(), targets_.data() + s, lse_.data(), losses_.data(), cn, V, pool);
}

template <class T>
double ChunkRecurrent<T>::forward(const int32_t* tokens, const int32_t* targets, int64_t n, ThreadPool& pool) {
  LC_CHECK(n >= 1 && n <= max_t_);
  const int64_t V = c_.n_vocab;
  allocate_scratch(pool.size());
  n_ = n;
  have_targets_ = targets != nullptr;
  n_targets_ = 0;
  for (int64_t t = 0; t < n; ++t) {
    LC_CHECK(tokens[t] >= 0 && tokens[t] < V);
    tokens_[static_cast<size_t>(t)] = tokens[t];
    if (targets) {
      LC_CHECK(targets[t] >= -1 && targets[t] < V);
      targets_[static_cast<size_t>(t)] = targets[t];
      n_targets_ += targets[t] >= 0;
    }
  }
  kv_.release();
  double sum = 0;
  for (int64_t s = 0; s < n; s += chunk_) {
    const int64_t cn = std::min(chunk_, n - s);
    kv_.ensure(s + cn, false);  // the pool grows with the sequence
    sum += chunk_forward(s, cn, pool);
  }
  return n_targets_ > 0 ? sum / static_cast<double>(n_targets_) : 0.0;
}

template <class T>
void ChunkRecurrent<T>::chunk_backward(int64_t s, int64_t cn, T loss_scale, ThreadPool& pool) {
  const int64_t E = c_.n_embd, V = c_.n_vocab, kd = c_.kv_dim(), H = c_.n_head, C = chunk_;
  chunk_forward(s, cn, pool);  // recompute this chunk's activations
  const T* W = m_.params();
  T* G = m_.grads();
  T* dresid = dresid_.data();
  T* dln = dln_.data();

  grad::cross_entropy_backward<T>(logits_.data(), targets_.data() + s, lse_.data(), cn, V, loss_scale, pool);
  grad::linear_backward<T>(logits_.data(), lnf_.data(), W + output_, dln, G + output_, cn, E, V, false, pool);
  std::memset(dresid, 0, static_cast<size_t>(cn * E) * sizeof(T));
  grad::rmsnorm_backward<T>(dln, resid_.data() + c_.n_layer * C * E, W + output_norm_, rstdf_.data(), dresid,
                      G + output_norm_, cn, E, pool);

  const BlockGradScratch<T> sc{dln, datt_.data(), dh_.data(), dgate_.data(), dup_.data()};
  for (int64_t il = c_.n_layer - 1; il >= 0; --il) {
    const BlockOffsets& L = m_.block(il);
    const BlockActs<T> a = acts(il);
    block_backward_to_att<T>(c_, W, G, L, a, cn, dresid, sc, pool);
    attention_backward(il, s, cn, a.q, a.att, att_lse_.data() + il * H * C, datt_.data(), dq_.data(), pool);
    // The later chunks have added their share to rows [s, s + cn) already: dK, dV are complete.
    T* dk = k_.data();
    T* dv = v_.data();
    for (int64_t t = 0; t < cn; ++t) {
      std::memcpy(dk + t * kd, dkv_.key_row(il, s + t), static_cast<size_t>(kd) * sizeof(T));
      std::memcpy(dv + t * kd, dkv_.value_row(il, s + t), static_cast<size_t>(kd) * sizeof(T));
    }
    block_backward_from_qkv<T>(c_, W, G, L, a, cn, dq_.data(), dk, dv, pos_.data(), rope_inv_, dresid, sc, pool);
  }
  // Embedding rows: a token may repeat, so split over features, not tokens.
  grad::parallel_rows(pool, E, [&](int64_t j0, int64_t j1) {
    for (int64_t t = 0; t < cn; ++t) {
      T* g = G + tok_embd_ + static_cast<size_t>(tokens_[static_cast<size_t>(s + t)]) * E;
      for (int64_t j = j0; j < j1; ++j) g[j] += dresid[t * E + j];
    }
  });
}

template <class T>
void ChunkRecurrent<T>::backward(T loss_scale, ThreadPool& pool) {
  LC_CHECK(have_targets_ && n_ > 0 && kv_.n_tokens() == n_);
  allocate_scratch(pool.size());
  dkv_.release();
  dkv_.ensure(n_, true);  // the last chunk's attention adds into every row at once
  const int64_t last = (n_ - 1) / chunk_ * chunk_;
  for (int64_t s = last; s >= 0; s -= chunk_) chunk_backward(s, std::min(chunk_, n_ - s), loss_scale, pool);
  have_targets_ = false;  // a second backward needs a new forward
}

template class PagedKv<float>;
template class PagedKv<double>;
template class ChunkRecurrent<float>;
template class ChunkRecurrent<double>;

}  // namespace lc::train
