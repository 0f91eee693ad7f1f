// LycheeDecode (seed 002, "LycheeDecode: fine-grained hybrid-head attention"): a few retrieval
// heads attend fully and identify the crucial tokens; the other (sparse) heads reuse their
// choice. Block top-k, training-free: the retrieval heads' attention mass per block of
// `block` tokens,
//     w(b) = sum_{r in retrieval heads} sum_{j in b} softmax_j(q_r . k_j / sqrt(d)),
// picks the top budget/block blocks; a sparse head attends those blocks, the initial blocks
// (`sinks`) and its local window (`local`). The paper learns head roles (HardKuma gates);
// here they come from a calibration file (heads=FILE, see lychee.h: the paper's roles, found
// from the model's attention), or, only when asked for with retrieval=N, are the first N query
// heads of each layer (a stand-in that is neither the paper's roles nor its sharing). One of
// the two must be given; the spec says which ran.
//
// Sharing, `share=` (default: `head` with a heads file that leaves some layer without
// retrieval heads, as `calibrate --total N` writes; `layer` otherwise):
// * `layer`: the top blocks by the summed mass of a layer's retrieval heads serve
//   every sparse head of that layer (all KV groups).
// * `head`: the paper's head-level sharing across layers. It refines TidalDecode's and OmniKV's
//   cross-layer sharing of one token set to single heads. Query head h keeps its own choice of
//   blocks from layer to layer. In a layer where h is a retrieval head, it attends fully and
//   chooses anew from its own mass. Where h is a sparse head, it attends the blocks it chose
//   in its last retrieval layer. A head that has not chosen yet in the current forward pass
//   attends fully and chooses, as a retrieval head would: the first layer is dense. A layer
//   whose heads have all chosen and that lists no retrieval heads reads only its chosen
//   blocks, and that is where the speed comes from. Use it with a calibration that picks a
//   few heads for the whole model (`longctx calibrate --total N`).
#include "attention/lychee.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <vector>

#include "attention/methods.h"

namespace lc {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float logaddexp(float a, float b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const float m = std::max(a, b);
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

class LycheeBackend final : public ExecBackend {
 public:
  LycheeBackend(const AttnShape& s, int64_t budget, int64_t block, int64_t sinks, int64_t local, int64_t n_ret,
                std::string file, RetrievalHeads heads, int64_t split, bool head_share)
      : ExecBackend(s), budget_(budget), block_(block), init_end_((sinks + block - 1) / block * block),
        sinks_(sinks), local_(local), n_ret_(n_ret), file_(std::move(file)), heads_(std::move(heads)),
        head_share_(head_share), hsel_(static_cast<size_t>(s.n_head)), has_sel_(static_cast<size_t>(s.n_head), 0) {
    split_ = split;
  }

  std::string spec() const override {
    std::string s = fmt::format("lychee:budget={},block={},sinks={},local={}", budget_, block_, sinks_, local_);
    s += file_.empty() ? fmt::format(",retrieval={}", n_ret_) : ",heads=" + file_;
    if (head_share_) s += ",share=head";
    if (split_ != kDefaultSplit) s += fmt::format(",split={}", split_);
    return s;
  }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    attn::ExecCtx ctx;
    LC_TRY(begin_forward(il, n, q, pos, kv, out, ctx));
    const int64_t H = shape_.n_head, g = H / shape_.n_head_kv;
    bool short_ctx = true;
    for (int64_t h = 0; h < shape_.n_head_kv; ++h) short_ctx = short_ctx && kv.n_tokens(il, h) <= budget_;
    // Head-level sharing: selections carry over from the layers below within one forward pass
    // (the model calls layers in order), and a head without one retrieves.
    if (il == 0) std::fill(has_sel_.begin(), has_sel_.end(), 0);
    std::vector<int32_t>& ret = ret_;  // this layer's retrieval heads (reused buffer)
    ret = heads_.heads[static_cast<size_t>(il)];
    if (head_share_) {
      for (int32_t h = 0; h < static_cast<int32_t>(H); ++h)
        if (!has_sel_[static_cast<size_t>(h)] && std::find(ret.begin(), ret.end(), h) == ret.end()) ret.push_back(h);
      std::sort(ret.begin(), ret.end());
    }
    if (short_ctx || (ret.empty() && !head_share_)) {
      run_dense(ctx, pool);
      return ok_status();
    }
    const int64_t N = kv.n_tokens(il, 0);
    for (int64_t h = 1; h < shape_.n_head_kv; ++h)
      if (kv.n_tokens(il, h) != N)
        return make_error("lychee: the KV heads of a layer must hold the same tokens (selection is shared)");
    const int64_t nb = (N + block_ - 1) / block_;
    const int64_t n_r = static_cast<int64_t>(ret.size());
    lse_.assign(static_cast<size_t>(n_r * n * nb), kNegInf);
    // Phase 1: retrieval heads, dense, with the log-mass of every block.
    // Consecutive retrieval heads of one GQA group share an item, so their KV head is read once
    // for all of them (share=head's first layer: every head of every group).
    std::vector<int64_t>& ri_of = ri_of_;
    ri_of.assign(static_cast<size_t>(H), -1);
    for (int64_t ri = 0; ri < n_r; ++ri) ri_of[static_cast<size_t>(ret[static_cast<size_t>(ri)])] = ri;
    std::vector<attn::Item> items;
    for (size_t a = 0; a < ret.size();) {
      size_t b = a + 1;
      while (b < ret.size() && ret[b] == ret[b - 1] + 1 && ret[b] / g == ret[a] / g) ++b;
      const int64_t gi = static_cast<int64_t>(b - a), step = std::max<int64_t>(1, attn::kMaxRows / gi);
      for (int64_t t0 = 0; t0 < n; t0 += step)
        items.push_back(attn::Item{ret[a] / g, t0, std::min(step, n - t0), ret[a], gi});
      a = b;
    }
    const int64_t B = kv.block_tokens();
    // Runs the open item's retrieval rows over keys [s0, s1), spans cut at KV blocks and at
    // selection blocks, and adds each span's log-mass to its selection block.
    auto retrieve = [&](attn::Runner& run, int64_t s0, int64_t s1) {
      float span_lse[attn::kMaxRows];
      for (int64_t first = s0; first < s1;) {
        const int64_t end = std::min({s1, (first / B + 1) * B, (first / block_ + 1) * block_});
        run.run(attn::Span{first, end - first, 0, false, run.all_rows()}, span_lse);
        for (int64_t r = 0; r < run.rows(); ++r) {
          const int64_t ri = ri_of[static_cast<size_t>(run.head_of(r))];
          float& dst = lse_[static_cast<size_t>((ri * n + run.token_of(r)) * nb + first / block_)];
          dst = logaddexp(dst, span_lse[r]);
        }
        first = end;
      }
    };
    // Block masses relative to the row's total log-mass `tot`.
    auto normalise = [&](const attn::Runner& run, int64_t r, float tot) {
      float* row = lse_.data() + (ri_of[static_cast<size_t>(run.head_of(r))] * n + run.token_of(r)) * nb;
      for (int64_t bb = 0; bb < nb; ++bb) row[bb] = row[bb] == kNegInf ? 0.0f : std::exp(row[bb] - tot);
    };
    // A decoded token has one retrieval tile per retrieval head, fewer than the threads: the
    // keys are split into segments of whole selection blocks (split-K), each segment's partial
    // softmax state is merged per tile in order, and a block's mass is written by the one
    // segment that holds it.
    const int64_t seg = std::max(block_, split_ / block_ * block_);
    if (static_cast<int64_t>(items.size()) >= 4 * pool.size() || N <= seg) {
      pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
        attn::Runner& run = attn::thread_runner();
        for (int64_t i = b; i < e; ++i) {
          const attn::Item& it = items[static_cast<size_t>(i)];
          run.begin(ctx, it);
          retrieve(run, 0, run.vis(run.rows() - 1));
          for (int64_t r = 0; r < run.rows(); ++r) normalise(run, r, run.row_lse(r));
          run.finish();
        }
      });
    } else {
      std::vector<int64_t> unit_first(items.size() + 1, 0);
      for (size_t i = 0; i < items.size(); ++i) {
        const int64_t last_vis = N - n + items[i].t0 + items[i].nt;
        unit_first[i + 1] = unit_first[i] + (last_vis + seg - 1) / seg;
      }
      const int64_t n_units = unit_first.back();
      const int64_t stride = attn::kMaxRows * (2 + ctx.dv);
      if (static_cast<int64_t>(partials_.size()) < n_units * stride) partials_.resize(static_cast<size_t>(n_units * stride));
      pool.parallel_for(n_units, [&](int64_t b, int64_t e, int) {
        attn::Runner& run = attn::thread_runner();
        for (int64_t u = b; u < e; ++u) {
          const size_t i = static_cast<size_t>(std::upper_bound(unit_first.begin(), unit_first.end(), u) - unit_first.begin() - 1);
          const attn::Item& it = items[i];
          run.begin(ctx, it);
          const int64_t s0 = (u - unit_first[i]) * seg;
          retrieve(run, s0, std::min(run.vis(run.rows() - 1), s0 + seg));
          run.export_partial(partials_.data() + u * stride);
        }
      }, attn::unit_grain(ctx, n_units));
      pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
        attn::Runner& run = attn::thread_runner();
        for (int64_t i = b; i < e; ++i) {
          const attn::Item& it = items[static_cast<size_t>(i)];
          run.begin(ctx, it);
          float tot[attn::kMaxRows];
          std::fill(tot, tot + run.rows(), kNegInf);
          for (int64_t u = unit_first[static_cast<size_t>(i)]; u < unit_first[static_cast<size_t>(i) + 1]; ++u) {
            const float* p = partials_.data() + u * stride;
            run.merge_partial(p);
            for (int64_t r = 0; r < run.rows(); ++r, p += 2 + ctx.dv)
              if (p[0] != kNegInf) tot[r] = logaddexp(tot[r], p[0] + std::log(p[1]));
          }
          for (int64_t r = 0; r < run.rows(); ++r) normalise(run, r, tot[r]);
          run.finish();
        }
      });
    }
    // Selection per token: the top blocks by the mass of retrieval heads [r0, r1).
    const int64_t k_blocks = std::max<int64_t>(1, budget_ / block_);
    lower_.assign(static_cast<size_t>(n), 0);
    std::vector<float> w(static_cast<size_t>(nb));
    std::vector<int32_t> order;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t vis = N - n + t + 1;
      lower_[static_cast<size_t>(t)] = std::min(std::max(init_end_, (vis - local_) / block_ * block_), vis);
    }
    auto choose = [&](int64_t t, int64_t r0, int64_t r1, std::vector<int32_t>& ch) {
      const int64_t vis = N - n + t + 1;
      const int64_t lb = std::max(init_end_, (vis - local_) / block_ * block_);
      const int64_t b0 = init_end_ / block_, b1 = lb / block_;
      ch.clear();
      if (b1 <= b0) return;
      order.resize(static_cast<size_t>(b1 - b0));
      std::iota(order.begin(), order.end(), static_cast<int32_t>(b0));
      if (vis > budget_ && b1 - b0 > k_blocks) {
        std::fill(w.begin(), w.end(), 0.0f);
        for (int64_t ri = r0; ri < r1; ++ri)
          for (int64_t bb = b0; bb < b1; ++bb) w[static_cast<size_t>(bb)] += lse_[static_cast<size_t>((ri * n + t) * nb + bb)];
        std::partial_sort(order.begin(), order.begin() + k_blocks, order.end(), [&](int32_t a, int32_t c) {
          return w[static_cast<size_t>(a)] > w[static_cast<size_t>(c)] || (w[static_cast<size_t>(a)] == w[static_cast<size_t>(c)] && a < c);
        });
        order.resize(static_cast<size_t>(k_blocks));
      }
      ch = order;
    };
    if (head_share_) {
      // Each retrieval head chooses for itself; the sparse heads keep their earlier choice.
      for (int64_t ri = 0; ri < n_r; ++ri) {
        const size_t h = static_cast<size_t>(ret[static_cast<size_t>(ri)]);
        hsel_[h].resize(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) choose(t, ri, ri + 1, hsel_[h][static_cast<size_t>(t)]);
        has_sel_[h] = 1;
      }
    } else {
      chosen_.assign(static_cast<size_t>(n), {});
      for (int64_t t = 0; t < n; ++t) choose(t, 0, n_r, chosen_[static_cast<size_t>(t)]);
    }
    auto blocks_of = [&](int64_t h, int64_t t) -> const std::vector<int32_t>& {
      return head_share_ ? hsel_[static_cast<size_t>(h)][static_cast<size_t>(t)] : chosen_[static_cast<size_t>(t)];
    };
    // Phase 2: the sparse heads, blocks outer and the rows that chose them inner.
    const std::vector<attn::Item> groups = attn::make_items(ctx);
    pool.parallel_for(static_cast<int64_t>(groups.size()), [&](int64_t b, int64_t e, int) {
      attn::Runner& run = attn::thread_runner();
      thread_local std::vector<uint64_t> mask;
      for (int64_t i = b; i < e; ++i) {
        const attn::Item& it = groups[static_cast<size_t>(i)];
        run.begin(ctx, it);
        uint64_t sparse = 0;
        for (int64_t r = 0; r < run.rows(); ++r)
          if (std::find(ret.begin(), ret.end(), static_cast<int32_t>(run.head_of(r))) == ret.end())
            sparse |= uint64_t{1} << r;
        if (!sparse) continue;
        mask.assign(static_cast<size_t>(nb), 0);
        for (int64_t r = 0; r < run.rows(); ++r)
          if (sparse >> r & 1)
            for (int32_t bb : blocks_of(run.head_of(r), run.token_of(r))) mask[static_cast<size_t>(bb)] |= uint64_t{1} << r;
        run.run_range(0, std::min(init_end_, run.vis(run.rows() - 1)), 0, false, sparse);
        for (int64_t bb = 0; bb < nb; ++bb)
          if (mask[static_cast<size_t>(bb)]) run.run_range(bb * block_, block_, 0, false, mask[static_cast<size_t>(bb)]);
        int64_t lower[attn::kMaxRows];
        for (int64_t tt = 0; tt < it.nt; ++tt) lower[tt] = lower_[static_cast<size_t>(it.t0 + tt)];
        run.run_windows(lower, 0, sparse);
        run.finish(sparse);
      }
    });
    return ok_status();
  }

 private:
  int64_t budget_, block_, init_end_, sinks_, local_, n_ret_;
  std::string file_;
  RetrievalHeads heads_;
  std::vector<float> lse_;                    // [n_ret, n, n_blocks] block masses
  std::vector<std::vector<int32_t>> chosen_;  // [n] chosen blocks (share=layer)
  std::vector<int64_t> lower_;                // [n] local window start
  bool head_share_;
  std::vector<int32_t> ret_;    // scratch: the layer's retrieval heads
  std::vector<int64_t> ri_of_;  // scratch: [n_head] index in ret_, or -1
  std::vector<std::vector<std::vector<int32_t>>> hsel_;  // [n_head][n] each head's blocks (share=head)
  std::vector<char> has_sel_;                            // [n_head] chosen in this forward pass
};

class Calibrator final : public LycheeCalibrator {
 public:
  Calibrator(const AttnShape& s, int64_t far) : LycheeCalibrator(s) {
    stats_.n_layer = s.n_layer;
    stats_.n_head = s.n_head;
    stats_.far = far;
    stats_.far_mass.assign(static_cast<size_t>(s.n_layer * s.n_head), 0.0);
    stats_.n_rows.assign(static_cast<size_t>(s.n_layer * s.n_head), 0);
  }
  std::string spec() const override { return fmt::format("lychee-calibrate:far={}", stats_.far); }
  const LycheeHeadStats& stats() const override { return stats_; }

  Status forward(int64_t il, int64_t n, const float* q, const int32_t* pos, KvCache& kv, float* out,
                 ThreadPool& pool) override {
    LC_TRY(check_call(il, n, kv));
    attn::ExecCtx ctx;
    ctx.kv = &kv;
    ctx.il = il;
    ctx.n = n;
    ctx.n_head = shape_.n_head;
    ctx.n_head_kv = shape_.n_head_kv;
    ctx.group = shape_.n_head / shape_.n_head_kv;
    ctx.d = shape_.head_dim;
    ctx.dv = shape_.head_dim_v;
    ctx.out = out;
    const size_t need = static_cast<size_t>(n * shape_.n_head * shape_.head_dim);
    if (qbuf_.size() < need) qbuf_.resize(need);
    qpos_.assign(pos, pos + n);
    attn::prepare_queries(q, n, shape_.n_head, shape_.head_dim, kv.rope(il), qpos_.data(), shape_.scale, qbuf_.data());
    ctx.var[0] = attn::QueryVariant{qbuf_.data(), qpos_.data()};
    far_.assign(static_cast<size_t>(n * shape_.n_head), -1.0);
    const std::vector<attn::Item> items = attn::make_items(ctx, 0, 1);  // one token: one far boundary
    pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t b, int64_t e, int) {
      attn::Runner& run = attn::thread_runner();
      float span[attn::kMaxRows], acc[attn::kMaxRows];
      for (int64_t i = b; i < e; ++i) {
        run.begin(ctx, items[static_cast<size_t>(i)]);
        const int64_t vis = run.vis(0), fe = std::max<int64_t>(0, vis - stats_.far);
        const int64_t B = kv.block_tokens();
        std::fill(acc, acc + run.rows(), kNegInf);
        for (int64_t first = 0; first < fe;) {
          const int64_t end = std::min(fe, (first / B + 1) * B);
          run.run(attn::Span{first, end - first, 0, false, run.all_rows()}, span);
          for (int64_t r = 0; r < run.rows(); ++r) acc[r] = logaddexp(acc[r], span[r]);
          first = end;
        }
        run.run_range(fe, vis - fe, 0, false, run.all_rows());
        for (int64_t r = 0; r < run.rows(); ++r)
          if (fe > 0)
            far_[static_cast<size_t>(run.token_of(r) * shape_.n_head + run.head_of(r))] = std::exp(acc[r] - run.row_lse(r));
        run.finish();
      }
    });
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < shape_.n_head; ++h) {
        const double f = far_[static_cast<size_t>(t * shape_.n_head + h)];
        if (f < 0) continue;
        stats_.far_mass[static_cast<size_t>(il * shape_.n_head + h)] += f;
        ++stats_.n_rows[static_cast<size_t>(il * shape_.n_head + h)];
      }
    return ok_status();
  }

 private:
  LycheeHeadStats stats_;
  Buffer<float> qbuf_;
  std::vector<int32_t> qpos_;
  std::vector<double> far_;  // [n, n_head]
};

}  // namespace

Expected<std::unique_ptr<LycheeCalibrator>> make_lychee_calibrator(const AttnShape& shape, int64_t far) {
  if (far < 1) return make_error(fmt::format("lychee calibration: far distance {} must be >= 1", far));
  return std::unique_ptr<LycheeCalibrator>(new Calibrator(shape, far));
}

RetrievalHeads pick_retrieval_heads(const LycheeHeadStats& s, int64_t per_layer) {
  RetrievalHeads r;
  r.n_layer = s.n_layer;
  r.n_head = s.n_head;
  r.heads.resize(static_cast<size_t>(s.n_layer));
  const int64_t k = std::clamp<int64_t>(per_layer, 0, s.n_head);
  for (int64_t il = 0; il < s.n_layer; ++il) {
    std::vector<int32_t> order(static_cast<size_t>(s.n_head));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s.mean(il, a) > s.mean(il, b); });
    order.resize(static_cast<size_t>(k));
    std::sort(order.begin(), order.end());
    r.heads[static_cast<size_t>(il)] = order;
  }
  return r;
}

RetrievalHeads pick_retrieval_heads_total(const LycheeHeadStats& s, int64_t total) {
  RetrievalHeads r;
  r.n_layer = s.n_layer;
  r.n_head = s.n_head;
  r.heads.resize(static_cast<size_t>(s.n_layer));
  std::vector<int64_t> order(static_cast<size_t>(s.n_layer * s.n_head));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return s.mean(a / s.n_head, a % s.n_head) > s.mean(b / s.n_head, b % s.n_head);
  });
  order.resize(static_cast<size_t>(std::clamp<int64_t>(total, 0, s.n_layer * s.n_head)));
  std::sort(order.begin(), order.end());
  for (int64_t i : order) r.heads[static_cast<size_t>(i / s.n_head)].push_back(static_cast<int32_t>(i % s.n_head));
  return r;
}

Status save_retrieval_heads(const std::string& path, const RetrievalHeads& h) {
  std::ofstream f(path);
  if (!f) return make_error(fmt::format("cannot write retrieval heads to '{}'", path));
  f << "longctx-retrieval-heads 1\n" << "n_layer " << h.n_layer << " n_head " << h.n_head << "\n";
  for (int64_t il = 0; il < h.n_layer; ++il) {
    f << "layer " << il << ":";
    for (int32_t x : h.heads[static_cast<size_t>(il)]) f << " " << x;
    f << "\n";
  }
  if (!f) return make_error(fmt::format("error writing retrieval heads to '{}'", path));
  return ok_status();
}

Expected<RetrievalHeads> load_retrieval_heads(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error(fmt::format("cannot read retrieval heads file '{}'", path));
  auto bad = [&](const std::string& why) {
    return make_error(fmt::format("retrieval heads file '{}': {} (expected 'longctx-retrieval-heads 1', "
                                  "'n_layer L n_head H', then 'layer i: h h ...' per layer)", path, why));
  };
  std::string magic, w1, w2;
  int version = 0;
  RetrievalHeads r;
  if (!(f >> magic >> version) || magic != "longctx-retrieval-heads" || version != 1) return bad("bad header");
  if (!(f >> w1 >> r.n_layer >> w2 >> r.n_head) || w1 != "n_layer" || w2 != "n_head" || r.n_layer < 1 ||
      r.n_layer > 100000 || r.n_head < 1 || r.n_head > 100000)
    return bad("bad shape line");
  r.heads.resize(static_cast<size_t>(r.n_layer));
  std::string line;
  std::getline(f, line);
  for (int64_t il = 0; il < r.n_layer; ++il) {
    if (!std::getline(f, line)) return bad(fmt::format("missing layer {}", il));
    std::istringstream ls(line);
    std::string word, idx;
    if (!(ls >> word >> idx) || word != "layer" || idx != std::to_string(il) + ":")
      return bad(fmt::format("line for layer {} is '{}'", il, line));
    int64_t h;
    while (ls >> h) {
      if (h < 0 || h >= r.n_head) return bad(fmt::format("head {} of layer {} out of range", h, il));
      r.heads[static_cast<size_t>(il)].push_back(static_cast<int32_t>(h));
    }
    if (!ls.eof()) return bad(fmt::format("line for layer {} has a non-number", il));
    auto& v = r.heads[static_cast<size_t>(il)];
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  return r;
}

Expected<BackendPtr> make_lychee(MethodSpec& spec, const AttnShape& s) {
  int64_t budget = 2048, block = 64, sinks = 64, local = 256, n_ret = 1;
  std::string file;
  LC_TRY(spec.get_int("budget", &budget, 1, int64_t{1} << 30,
                      "tokens a sparse head attends besides sinks and local: the top budget/block blocks by the "
                      "retrieval heads' attention; a query that sees no more attends densely"));
  LC_TRY(spec.get_int("block", &block, 1, 65536, "tokens per block, the unit of selection"));
  LC_TRY(spec.get_int("sinks", &sinks, 0, int64_t{1} << 30,
                      "first tokens a sparse head always attends (rounded up to whole blocks), tokens"));
  LC_TRY(spec.get_int("local", &local, 1, int64_t{1} << 30,
                      "most recent tokens a sparse head always attends (extended down to a block boundary), tokens"));
  LC_TRY(spec.get_int("retrieval", &n_ret, 0, s.n_head,
                      "without heads= (and then required): the first N query heads of every layer are its retrieval "
                      "heads, not the paper's roles; N <= "
                      "n_head (the range listed is a 4-head model's)"));
  LC_TRY(spec.get_string("heads", &file,
                         "retrieval-heads file written by `longctx calibrate` (the paper's roles; without it, "
                         "retrieval= must be given)"));
  int64_t split = ExecBackend::kDefaultSplit;
  LC_TRY(spec.get_int("split", &split, 1, int64_t{1} << 30, ExecBackend::kSplitHelp));
  std::string share;  // default: from the heads file (below)
  LC_TRY(spec.get_string("share", &share,
                         "layer: a layer's retrieval heads choose the blocks of all its sparse heads; head: a head "
                         "keeps the blocks it chose in its last retrieval layer (default: head with a heads file "
                         "that leaves a layer without retrieval heads, else layer)"));
  if (!share.empty() && share != "layer" && share != "head")
    return make_error(fmt::format("attention method 'lychee': share={}, expected 'layer' or 'head'", share));
  LC_TRY(spec.finish());
  if (file.empty() && !spec.given().count("retrieval"))
    return make_error("attention method 'lychee': needs heads=FILE, the retrieval heads `longctx calibrate` finds "
                      "from the model's attention (the paper's head roles), or retrieval=N to make the first N "
                      "query heads of every layer retrieve (not the paper's roles)");
  RetrievalHeads heads;
  if (!file.empty()) {
    LC_ASSIGN_OR_RETURN(heads, load_retrieval_heads(file));
    if (heads.n_layer != s.n_layer || heads.n_head != s.n_head)
      return make_error(fmt::format("attention method 'lychee': heads file '{}' is for {} layers x {} heads, "
                                    "the model has {} x {}", file, heads.n_layer,
                                    heads.n_head, s.n_layer, s.n_head));
  } else {
    heads.n_layer = s.n_layer;
    heads.n_head = s.n_head;
    heads.heads.resize(static_cast<size_t>(s.n_layer));
    for (auto& v : heads.heads)
      for (int32_t h = 0; h < n_ret; ++h) v.push_back(h);
  }
  // A file that leaves some layer without retrieval heads (`calibrate --total N`) is made for
  // head-level sharing: with share=layer such a layer would attend densely.
  if (share.empty()) {
    const bool some_layer_without =
        std::any_of(heads.heads.begin(), heads.heads.end(), [](const auto& v) { return v.empty(); });
    share = !file.empty() && some_layer_without ? "head" : "layer";
  }
  return BackendPtr(new LycheeBackend(s, budget, block, sinks, local, n_ret, file, std::move(heads), split,
                                      share == "head"));
}

}  // namespace lc
