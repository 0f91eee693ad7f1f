#include "train/transformer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <new>

#include "grad/ops.h"
#include "train/block.h"
#include "train/rng.h"

namespace lc::train {

RopeTable make_train_rope(const ModelConfig& c) {
  LlamaCppRopeParams p;
  p.n_rot = c.head_dim();
  p.neox = false;  // llama GGUFs rotate adjacent pairs
  p.base = c.rope_base;
  return make_llama_cpp_rope(p);
}

template <class T>
Expected<std::unique_ptr<Transformer<T>>> Transformer<T>::create(const ModelConfig& in, int64_t max_tokens) {
  ModelConfig given = in;
  if (given.n_ctx == 0) given.n_ctx = max_tokens;
  LC_ASSIGN_OR_RETURN(ModelConfig c, resolve_config(given));
  if (max_tokens < 1 || max_tokens > c.n_ctx)
    return make_error(fmt::format("sequence length {} must be in [1, n_ctx = {}]", max_tokens,
                                  c.n_ctx));
  std::unique_ptr<Transformer<T>> m(new Transformer<T>());
  m->c_ = c;
  m->max_t_ = max_tokens;
  m->layout();
  try {
    m->allocate();
  } catch (const std::bad_alloc&) {
    return make_error(fmt::format("out of memory allocating a model of {} for sequences of {} tokens",
                                  describe(c), max_tokens));
  }
  m->rope_ = make_train_rope(c);
  m->rope_inv_ = grad::inverse_rope(m->rope_);
  for (int64_t t = 0; t < max_tokens; ++t) m->pos_[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  return m;
}

template <class T>
void Transformer<T>::layout() {
  const int64_t E = c_.n_embd, V = c_.n_vocab, F = c_.n_ff, qd = c_.q_dim(), kd = c_.kv_dim();
  size_t off = 0;
  auto add = [&](std::string name, std::vector<int64_t> ne, bool decay) {
    size_t n = 1;
    for (int64_t d : ne) n *= static_cast<size_t>(d);
    tensors_.push_back({std::move(name), std::move(ne), off, n, decay});
    const size_t at = off;
    off += n;
    return at;
  };
  tok_embd_ = add("token_embd.weight", {E, V}, true);
  output_norm_ = add("output_norm.weight", {E}, false);
  output_ = c_.tied ? tok_embd_ : add("output.weight", {E, V}, true);
  for (int64_t il = 0; il < c_.n_layer; ++il) {
    auto nm = [&](const char* s) { return fmt::format("blk.{}.{}", il, s); };
    BlockOffsets L;
    L.attn_norm = add(nm("attn_norm.weight"), {E}, false);
    L.wq = add(nm("attn_q.weight"), {E, qd}, true);
    L.wk = add(nm("attn_k.weight"), {E, kd}, true);
    L.wv = add(nm("attn_v.weight"), {E, kd}, true);
    L.wo = add(nm("attn_output.weight"), {qd, E}, true);
    L.ffn_norm = add(nm("ffn_norm.weight"), {E}, false);
    L.w_gate = add(nm("ffn_gate.weight"), {E, F}, true);
    L.w_up = add(nm("ffn_up.weight"), {E, F}, true);
    L.w_down = add(nm("ffn_down.weight"), {F, E}, true);
    layers_.push_back(L);
  }
  params_.resize(off);
  grads_.resize(off);
}

template <class T>
void Transformer<T>::allocate() {
  const size_t Tn = static_cast<size_t>(max_t_), Ln = static_cast<size_t>(c_.n_layer);
  const size_t E = static_cast<size_t>(c_.n_embd), F = static_cast<size_t>(c_.n_ff),
               qd = static_cast<size_t>(c_.q_dim()), kd = static_cast<size_t>(c_.kv_dim()),
               H = static_cast<size_t>(c_.n_head), V = static_cast<size_t>(c_.n_vocab);
  pos_.assign(Tn, 0);
  tokens_.assign(Tn, 0);
  targets_.assign(Tn, 0);
  resid_.resize((Ln + 1) * Tn * E);
  mid_.resize(Ln * Tn * E);
  ln1_.resize(Ln * Tn * E);
  ln2_.resize(Ln * Tn * E);
  rstd1_.resize(Ln * Tn);
  rstd2_.resize(Ln * Tn);
  q_.resize(Ln * Tn * qd);
  att_.resize(Ln * Tn * qd);
  k_.resize(Ln * Tn * kd);
  v_.resize(Ln * Tn * kd);
  probs_.resize(Ln * H * Tn * Tn);
  gate_.resize(Ln * Tn * F);
  up_.resize(Ln * Tn * F);
  h_.resize(Ln * Tn * F);
  lnf_.resize(Tn * E);
  rstdf_.resize(Tn);
  logits_.resize(Tn * V);
  lse_.resize(Tn);
  losses_.resize(Tn);
  dresid_.resize(Tn * E);
  dln_.resize(Tn * E);
  tmp_.resize(Tn * E);
  datt_.resize(Tn * qd);
  dq_.resize(Tn * qd);
  dk_.resize(Tn * kd);
  dv_.resize(Tn * kd);
  dh_.resize(Tn * F);
  dgate_.resize(Tn * F);
  dup_.resize(Tn * F);
  dscores_.resize(H * Tn * Tn);
}

template <class T>
size_t Transformer<T>::activation_bytes() const {
  const Buffer<T>* all[] = {&resid_, &mid_, &ln1_, &ln2_, &rstd1_, &rstd2_, &q_, &att_, &k_, &v_,
                            &probs_, &gate_, &up_, &h_, &lnf_, &rstdf_, &logits_, &lse_, &losses_,
                            &dresid_, &dln_, &tmp_, &datt_, &dq_, &dk_, &dv_, &dh_, &dgate_, &dup_,
                            &dscores_};
  size_t n = 0;
  for (const auto* b : all) n += b->size();
  return n * sizeof(T);
}

template <class T>
const ParamTensor* Transformer<T>::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

template <class T>
void Transformer<T>::init(uint64_t seed, double std) {
  Rng rng(seed);
  const double std0 = std, std_resid = std / std::sqrt(2.0 * static_cast<double>(c_.n_layer));
  for (const auto& t : tensors_) {
    T* p = params_.data() + t.offset;
    if (t.ne.size() == 1) {
      for (size_t i = 0; i < t.size; ++i) p[i] = T(1);
      continue;
    }
    const bool resid = t.name.find("attn_output") != std::string::npos ||
                       t.name.find("ffn_down") != std::string::npos;
    const double sd = resid ? std_resid : std0;
    for (size_t i = 0; i < t.size; ++i) p[i] = static_cast<T>(rng.normal() * sd);
  }
}

template <class T>
void Transformer<T>::zero_grads() {
  std::memset(grads_.data(), 0, grads_.size() * sizeof(T));
}

template <class T>
BlockActs<T> Transformer<T>::acts(int64_t il) {
  const int64_t E = c_.n_embd, F = c_.n_ff, qd = c_.q_dim(), kd = c_.kv_dim(), Tn = max_t_;
  return BlockActs<T>{resid_.data() + il * Tn * E, ln1_.data() + il * Tn * E, rstd1_.data() + il * Tn,
                      q_.data() + il * Tn * qd,    k_.data() + il * Tn * kd,  v_.data() + il * Tn * kd,
                      att_.data() + il * Tn * qd,  mid_.data() + il * Tn * E, ln2_.data() + il * Tn * E,
                      rstd2_.data() + il * Tn,     gate_.data() + il * Tn * F, up_.data() + il * Tn * F,
                      h_.data() + il * Tn * F,     resid_.data() + (il + 1) * Tn * E};
}

template <class T>
grad::AttnDims Transformer<T>::attn_dims(int64_t n) const {
  grad::AttnDims d{n, c_.n_head, c_.n_head_kv, c_.head_dim()};
  d.fixed_distance = c_.fixed_distance;
  d.pos = pos_.data();
  d.rope = &rope_;
  d.rope_inv = &rope_inv_;
  return d;
}

template <class T>
double Transformer<T>::forward(const int32_t* tokens, const int32_t* targets, int64_t n, ThreadPool& pool) {
  LC_CHECK(n >= 1 && n <= max_t_);
  const int64_t E = c_.n_embd, V = c_.n_vocab, H = c_.n_head, Tn = max_t_;
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
  const T* W = params_.data();
  T* x0 = resid_.data();
  for (int64_t t = 0; t < n; ++t)
    std::memcpy(x0 + t * E, W + tok_embd_ + static_cast<size_t>(tokens[t]) * E, static_cast<size_t>(E) * sizeof(T));

  const grad::AttnDims ad = attn_dims(n);
  for (int64_t il = 0; il < c_.n_layer; ++il) {
    const BlockActs<T> a = acts(il);
    block_forward<T>(c_, W, layers_[static_cast<size_t>(il)], a, n, pos_.data(), rope_, tmp_.data(), pool,
                     [&] { grad::attention_forward<T>(ad, a.q, a.k, a.v, a.att, probs_.data() + il * H * Tn * Tn, pool); });
  }
  const T* xf = resid_.data() + c_.n_layer * Tn * E;
  grad::rmsnorm_forward<T>(xf, W + output_norm_, lnf_.data(), rstdf_.data(), n, E, c_.rms_eps, pool);
  grad::linear_forward<T>(lnf_.data(), W + output_, logits_.data(), n, E, V, pool);
  if (!targets) return 0.0;
  const double sum = grad::cross_entropy_forward<T>(logits_.data(), targets_.data(), lse_.data(), losses_.data(), n, V, pool);
  return n_targets_ > 0 ? sum / static_cast<double>(n_targets_) : 0.0;
}

template <class T>
void Transformer<T>::backward(T loss_scale, ThreadPool& pool) {
  LC_CHECK(have_targets_ && n_ > 0);
  have_targets_ = false;  // logits become gradients below: a second backward needs a new forward
  const int64_t n = n_, E = c_.n_embd, V = c_.n_vocab, H = c_.n_head, Tn = max_t_;
  const T* W = params_.data();
  T* G = grads_.data();
  T* dresid = dresid_.data();
  T* dln = dln_.data();

  grad::cross_entropy_backward<T>(logits_.data(), targets_.data(), lse_.data(), n, V, loss_scale, pool);
  grad::linear_backward<T>(logits_.data(), lnf_.data(), W + output_, dln, G + output_, n, E, V, false, pool);
  std::memset(dresid, 0, static_cast<size_t>(n * E) * sizeof(T));
  grad::rmsnorm_backward<T>(dln, resid_.data() + c_.n_layer * Tn * E, W + output_norm_, rstdf_.data(), dresid,
                      G + output_norm_, n, E, pool);

  const grad::AttnDims ad = attn_dims(n);
  const BlockGradScratch<T> sc{dln, datt_.data(), dh_.data(), dgate_.data(), dup_.data()};
  for (int64_t il = c_.n_layer - 1; il >= 0; --il) {
    const BlockOffsets& L = layers_[static_cast<size_t>(il)];
    const BlockActs<T> a = acts(il);
    block_backward_to_att<T>(c_, W, G, L, a, n, dresid, sc, pool);
    grad::attention_backward<T>(ad, a.q, a.k, a.v, probs_.data() + il * H * Tn * Tn, datt_.data(), dq_.data(),
                          dk_.data(), dv_.data(), dscores_.data(), pool);
    block_backward_from_qkv<T>(c_, W, G, L, a, n, dq_.data(), dk_.data(), dv_.data(), pos_.data(), rope_inv_,
                               dresid, sc, pool);
  }
  // Embedding rows: a token may repeat, so split over features, not tokens.
  grad::parallel_rows(pool, E, [&](int64_t j0, int64_t j1) {
    for (int64_t t = 0; t < n; ++t) {
      T* g = G + tok_embd_ + static_cast<size_t>(tokens_[static_cast<size_t>(t)]) * E;
      for (int64_t j = j0; j < j1; ++j) g[j] += dresid[t * E + j];
    }
  });
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace lc::train
