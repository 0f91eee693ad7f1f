#include "kv/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <istream>
#include <ostream>

#include "core/binary_io.h"
#include "core/fp16.h"
#include "kernels/kernels.h"

namespace lc {
namespace {

bool kv_type_ok(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0;
}

bool same_table(const RopeTable& a, const RopeTable& b) {
  return a.n_rot == b.n_rot && a.neox == b.neox && a.mscale == b.mscale && a.inv_freq == b.inv_freq;
}

using bin::get;
using bin::put;
using bin::put_vec;
using bin::get_array;

constexpr uint32_t kStateMagic = 0x4b56434cu;  // "LCVK"

}  // namespace

Expected<DType> parse_kv_type(std::string_view name) {
  auto t = dtype_from_name(name);
  if (!t || !kv_type_ok(*t))
    return make_error(fmt::format("kv cache type '{}' is not supported (accepted: f32, f16, bf16, q8_0)",
                                  name));
  return *t;
}

Expected<std::unique_ptr<KvCache>> KvCache::create(const KvCacheConfig& in) {
  KvCacheConfig cfg = in;
  if (cfg.n_layer < 1 || cfg.n_head_kv < 1 || cfg.head_dim < 1 || cfg.head_dim_v < 1)
    return make_error(fmt::format("kv cache shape is invalid: n_layer={} n_head_kv={} head_dim={} "
                                  "head_dim_v={} (all must be >= 1)",
                                  cfg.n_layer, cfg.n_head_kv,
                                  cfg.head_dim, cfg.head_dim_v));
  if (cfg.block_tokens < 1 || cfg.block_tokens > 65536)
    return make_error(fmt::format("--kv-block {} is out of range [1, 65536]", cfg.block_tokens));
  for (auto [t, dim, flag] : {std::tuple{cfg.type_k, cfg.head_dim, "--kv-type-k"},
                              std::tuple{cfg.type_v, cfg.head_dim_v, "--kv-type-v"}}) {
    if (!kv_type_ok(t))
      return make_error(fmt::format("{} {} is not supported (accepted: f32, f16, bf16, q8_0)", flag,
                                    dtype_name(t)));
    if (dim % traits(t).block_size != 0)
      return make_error(fmt::format("{} {} needs a head size that is a multiple of {}, got {}", flag,
                                    dtype_name(t), traits(t).block_size, dim));
  }
  if (cfg.rope.n_rot < 0 || cfg.rope.n_rot > cfg.head_dim || cfg.rope.n_rot % 2 != 0 ||
      static_cast<int64_t>(cfg.rope.inv_freq.size()) < cfg.rope.n_rot / 2)
    return make_error(fmt::format("kv cache: rope table with n_rot={} and {} frequencies does not fit "
                                  "head_dim {}", cfg.rope.n_rot, cfg.rope.inv_freq.size(),
                                  cfg.head_dim));
  if (!cfg.spill_dir.empty()) cfg.policy = KvBudgetPolicy::kSpill;
  if (cfg.policy == KvBudgetPolicy::kSpill && cfg.spill_dir.empty())
    return make_error("kv budget policy 'spill' needs a directory (--kv-spill DIR)");
  auto c = std::unique_ptr<KvCache>(new KvCache(cfg));
  const int64_t B = cfg.block_tokens;
  c->k_row_bytes_ = row_bytes(cfg.type_k, cfg.head_dim);
  c->v_row_bytes_ = row_bytes(cfg.type_v, cfg.head_dim_v);
  c->v_offset_ = (static_cast<size_t>(B) * c->k_row_bytes_ + 63) / 64 * 64;
  const size_t block_bytes = c->v_offset_ + static_cast<size_t>(B) * c->v_row_bytes_;
  if (cfg.pool) {
    if (cfg.pool->block_bytes() != (block_bytes + 63) / 64 * 64)
      return make_error(fmt::format("kv cache: the shared block pool has blocks of {} bytes, this cache needs {}",
                                    cfg.pool->block_bytes(), (block_bytes + 63) / 64 * 64));
    c->pool_ = cfg.pool;
    c->cfg_.budget_bytes = cfg.pool->budget_bytes();
    c->cfg_.policy = cfg.pool->can_spill() ? KvBudgetPolicy::kSpill : cfg.policy == KvBudgetPolicy::kSpill
                                                                          ? KvBudgetPolicy::kError : cfg.policy;
  } else {
    LC_ASSIGN_OR_RETURN(c->pool_, BlockPool::create(block_bytes, cfg.budget_bytes,
                                                    cfg.policy == KvBudgetPolicy::kSpill ? cfg.spill_dir : ""));
  }
  c->heads_.resize(static_cast<size_t>(cfg.n_layer * cfg.n_head_kv));
  c->n_appended_.assign(static_cast<size_t>(cfg.n_layer), 0);
  c->rope_.assign(static_cast<size_t>(cfg.n_layer), cfg.rope);
  c->row_.resize(static_cast<size_t>(std::max(cfg.head_dim, cfg.head_dim_v)));
  return c;
}

KvCache::~KvCache() {
  if (!pool_) return;
  for (Head& hd : heads_)
    for (int32_t b : hd.blocks) pool_->release(b);
}

uint8_t* KvCache::k_row_in(const Head& hd, int64_t i, int64_t n_thin, int64_t thin_blocks) const {
  if (i < n_thin)
    return const_cast<uint8_t*>(pool_->data(hd.blocks[static_cast<size_t>(i / hd.thin_tokens)])) +
           static_cast<size_t>(i % hd.thin_tokens) * hd.thin_k_bytes;
  const int64_t B = cfg_.block_tokens, j = i - n_thin;
  return const_cast<uint8_t*>(pool_->data(hd.blocks[static_cast<size_t>(thin_blocks + j / B)])) +
         static_cast<size_t>(j % B) * k_row_bytes_;
}
uint8_t* KvCache::v_row_in(const Head& hd, int64_t i, int64_t n_thin, int64_t thin_blocks) const {
  if (i < n_thin)
    return const_cast<uint8_t*>(pool_->data(hd.blocks[static_cast<size_t>(i / hd.thin_tokens)])) +
           hd.thin_v_offset + static_cast<size_t>(i % hd.thin_tokens) * v_row_bytes_;
  const int64_t B = cfg_.block_tokens, j = i - n_thin;
  return const_cast<uint8_t*>(pool_->data(hd.blocks[static_cast<size_t>(thin_blocks + j / B)])) + v_offset_ +
         static_cast<size_t>(j % B) * v_row_bytes_;
}
uint8_t* KvCache::k_row(const Head& hd, int64_t i) {
  if (hd.n_thin == 0) {
    const int64_t B = cfg_.block_tokens;
    return pool_->data(hd.blocks[static_cast<size_t>(i / B)]) + static_cast<size_t>(i % B) * k_row_bytes_;
  }
  return k_row_in(hd, i, hd.n_thin, hd.thin_blocks);
}
uint8_t* KvCache::v_row(const Head& hd, int64_t i) {
  if (hd.n_thin == 0) {
    const int64_t B = cfg_.block_tokens;
    return pool_->data(hd.blocks[static_cast<size_t>(i / B)]) + v_offset_ +
           static_cast<size_t>(i % B) * v_row_bytes_;
  }
  return v_row_in(hd, i, hd.n_thin, hd.thin_blocks);
}
const uint8_t* KvCache::k_row(const Head& hd, int64_t i) const {
  return const_cast<KvCache*>(this)->k_row(hd, i);
}
const uint8_t* KvCache::v_row(const Head& hd, int64_t i) const {
  return const_cast<KvCache*>(this)->v_row(hd, i);
}

int64_t KvCache::blocks_for(const Head& hd, int64_t n) const {
  const int64_t B = cfg_.block_tokens;
  if (hd.n_thin == 0) return (n + B - 1) / B;
  if (n <= hd.n_thin) return (n + hd.thin_tokens - 1) / hd.thin_tokens;
  return hd.thin_blocks + (n - hd.n_thin + B - 1) / B;
}

void KvCache::key_row_f32(const Head& hd, int64_t i, float* out) const {
  const int64_t d = cfg_.head_dim;
  if (i >= hd.n_thin) {
    kernels::dequantize_row(cfg_.type_k, k_row(hd, i), out, d);
    return;
  }
  // A thin row holds the kept channels in order (then zero padding); the rest read as zeros.
  const uint8_t* r = k_row(hd, i);
  std::fill(out, out + d, 0.0f);
  const size_t m = hd.kept.size();
  switch (cfg_.type_k) {
    case DType::F32: {
      const float* x = reinterpret_cast<const float*>(r);
      for (size_t c = 0; c < m; ++c) out[hd.kept[c]] = x[c];
      break;
    }
    case DType::F16: {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(r);
      for (size_t c = 0; c < m; ++c) out[hd.kept[c]] = fp16_to_fp32(x[c]);
      break;
    }
    case DType::BF16: {
      const uint16_t* x = reinterpret_cast<const uint16_t*>(r);
      for (size_t c = 0; c < m; ++c) out[hd.kept[c]] = bf16_to_fp32(x[c]);
      break;
    }
    default: {  // q8_0: blocks of a 16-bit scale and 32 codes
      const size_t bb = row_bytes(DType::Q8_0, 32);
      for (size_t c = 0; c < m; ++c) {
        const uint8_t* blk = r + (c / 32) * bb;
        uint16_t dh;
        std::memcpy(&dh, blk, sizeof dh);
        out[hd.kept[c]] = fp16_to_fp32(dh) * static_cast<float>(static_cast<int8_t>(blk[2 + c % 32]));
      }
      break;
    }
  }
}

Status KvCache::write_state(std::ostream& out) const {
  put(out, kStateMagic);
  put<int64_t>(out, cfg_.n_layer);
  put<int64_t>(out, cfg_.n_head_kv);
  put<int64_t>(out, cfg_.head_dim);
  put<int64_t>(out, cfg_.head_dim_v);
  put<int64_t>(out, cfg_.block_tokens);
  put<int32_t>(out, static_cast<int32_t>(cfg_.type_k));
  put<int32_t>(out, static_cast<int32_t>(cfg_.type_v));
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const RopeTable& rt = rope_[static_cast<size_t>(il)];
    put_vec(out, rt.inv_freq);
    put(out, rt.mscale);
    put<int64_t>(out, rt.n_rot);
    put<uint8_t>(out, rt.neox ? 1 : 0);
    put<int64_t>(out, n_appended_[static_cast<size_t>(il)]);
  }
  for (const Head& hd : heads_) {
    put<int64_t>(out, hd.n);
    put_vec(out, hd.pos);
    put_vec(out, hd.idx);
    put_vec(out, hd.seq);
    // Rows without dropped channels are saved with every channel (zeros in the dropped ones).
    std::vector<float> row(hd.n_thin > 0 ? static_cast<size_t>(cfg_.head_dim) : 0);
    std::vector<uint8_t> q(hd.n_thin > 0 ? k_row_bytes_ : 0);
    for (int64_t i = 0; i < hd.n; ++i) {
      const uint8_t* r = k_row(hd, i);
      if (i < hd.n_thin) {
        key_row_f32(hd, i, row.data());
        kernels::quantize_row(cfg_.type_k, row.data(), q.data(), cfg_.head_dim);
        r = q.data();
      }
      out.write(reinterpret_cast<const char*>(r), static_cast<std::streamsize>(k_row_bytes_));
    }
    for (int64_t i = 0; i < hd.n; ++i) out.write(reinterpret_cast<const char*>(v_row(hd, i)), static_cast<std::streamsize>(v_row_bytes_));
  }
  if (!out) return make_error(ErrorCode::kIo, "kv cache: write error while saving the state");
  return ok_status();
}

Status KvCache::read_state(std::istream& in) {
  clear();
  auto bad = [&](const char* what) {
    clear();
    return make_error(ErrorCode::kBadFile, fmt::format("kv cache state: {}", what));
  };
  uint32_t magic = 0;
  int64_t n_layer = 0, n_head_kv = 0, d = 0, dv = 0, B = 0;
  int32_t tk = 0, tv = 0;
  if (!get(in, magic) || magic != kStateMagic) return bad("not a saved KV cache (bad magic)");
  if (!get(in, n_layer) || !get(in, n_head_kv) || !get(in, d) || !get(in, dv) || !get(in, B) || !get(in, tk) ||
      !get(in, tv))
    return bad("truncated header");
  if (n_layer != cfg_.n_layer || n_head_kv != cfg_.n_head_kv || d != cfg_.head_dim || dv != cfg_.head_dim_v)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("kv cache state: saved for {} layers x {} KV heads x head_dim {}/{}, but this "
                                  "model has {} x {} x {}/{}", n_layer, n_head_kv,
                                  d, dv, cfg_.n_layer, cfg_.n_head_kv,
                                  cfg_.head_dim, cfg_.head_dim_v));
  if (B != cfg_.block_tokens || tk != static_cast<int32_t>(cfg_.type_k) || tv != static_cast<int32_t>(cfg_.type_v))
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("kv cache state: saved with --kv-block {} and K/V types {}/{}; this cache has "
                                  "--kv-block {}, {}/{} (give the same settings)", B,
                                  dtype_traits(static_cast<uint32_t>(tk)) ? dtype_traits(static_cast<uint32_t>(tk))->name : "?",
                                  dtype_traits(static_cast<uint32_t>(tv)) ? dtype_traits(static_cast<uint32_t>(tv))->name : "?",
                                  cfg_.block_tokens, dtype_name(cfg_.type_k), dtype_name(cfg_.type_v)));
  std::vector<int64_t> appended(static_cast<size_t>(n_layer));
  std::vector<RopeTable> ropes(static_cast<size_t>(n_layer));
  for (int64_t il = 0; il < n_layer; ++il) {
    RopeTable& rt = ropes[static_cast<size_t>(il)];
    uint8_t neox = 0;
    if (!get_array(in, rt.inv_freq, static_cast<uint64_t>(d)) || !get(in, rt.mscale) || !get(in, rt.n_rot) ||
        !get(in, neox) || !get(in, appended[static_cast<size_t>(il)]))
      return bad("truncated rope tables");
    rt.neox = neox != 0;
    if (rt.n_rot != cfg_.rope.n_rot || static_cast<int64_t>(rt.inv_freq.size()) < rt.n_rot / 2 ||
        appended[static_cast<size_t>(il)] < 0 || appended[static_cast<size_t>(il)] > INT32_MAX)
      return bad("rope table or token count does not fit this cache");
  }
  for (int64_t il = 0; il < n_layer; ++il) {
    n_appended_[static_cast<size_t>(il)] = appended[static_cast<size_t>(il)];
    rope_[static_cast<size_t>(il)] = ropes[static_cast<size_t>(il)];
  }
  for (int64_t il = 0; il < n_layer; ++il) {
    const int64_t n_app = appended[static_cast<size_t>(il)];
    for (int64_t h = 0; h < n_head_kv; ++h) {
      Head& hd = head(il, h);
      int64_t n = 0;
      if (!get(in, n) || n < 0 || n > n_app) return bad("truncated head or token count out of range");
      if (!get_array(in, hd.pos, static_cast<uint64_t>(n)) || !get_array(in, hd.idx, static_cast<uint64_t>(n)) ||
          !get_array(in, hd.seq, static_cast<uint64_t>(n)) || static_cast<int64_t>(hd.pos.size()) != n ||
          static_cast<int64_t>(hd.idx.size()) != n || static_cast<int64_t>(hd.seq.size()) != n)
        return bad("truncated token metadata");
      for (int64_t i = 0; i < n; ++i)
        if (hd.idx[static_cast<size_t>(i)] < 0 || hd.idx[static_cast<size_t>(i)] >= n_app ||
            (i > 0 && hd.idx[static_cast<size_t>(i)] <= hd.idx[static_cast<size_t>(i - 1)]))
          return bad("token indices are not ascending within the tokens appended");
      const int64_t n_blocks = (n + B - 1) / B;
      if (Status st = ensure_room(il, n_blocks); !st) {
        clear();
        return st.error();
      }
      for (int64_t b = 0; b < n_blocks; ++b) {
        auto id = pool_->allocate();
        if (!id) {
          clear();
          return id.error();
        }
        hd.blocks.push_back(*id);
      }
      hd.n = n;
      for (int64_t i = 0; i < n; ++i)
        if (!in.read(reinterpret_cast<char*>(k_row(hd, i)), static_cast<std::streamsize>(k_row_bytes_)))
          return bad("truncated key rows");
      for (int64_t i = 0; i < n; ++i)
        if (!in.read(reinterpret_cast<char*>(v_row(hd, i)), static_cast<std::streamsize>(v_row_bytes_)))
          return bad("truncated value rows");
      ++hd.epoch;
      hd.low_water = 0;
    }
  }
  return ok_status();
}

int64_t KvCache::tokens_that_fit() const {
  if (cfg_.budget_bytes == 0 || cfg_.policy == KvBudgetPolicy::kSpill) return -1;
  const int64_t blocks = cfg_.budget_bytes / static_cast<int64_t>(pool_->block_bytes());
  return blocks / (cfg_.n_layer * cfg_.n_head_kv) * cfg_.block_tokens;
}

Status KvCache::ensure_room(int64_t il, int64_t needed) {
  if (needed == 0 || cfg_.budget_bytes == 0 || cfg_.policy == KvBudgetPolicy::kSpill) return ok_status();
  if (pool_->ram_blocks_available() >= needed) return ok_status();
  if (cfg_.policy == KvBudgetPolicy::kEvict && evictor_) {
    LC_TRY(evictor_(*this, il, needed - pool_->ram_blocks_available()));
    if (pool_->ram_blocks_available() >= needed) return ok_status();
  }
  int64_t held = 0;
  for (const auto& hd : heads_) held = std::max(held, hd.n);
  if (cfg_.budget_is_default)
    return make_error(ErrorCode::kContextFull, fmt::format(
        "the KV cache has reached the memory it may take ({} bytes, 3/4 of the memory available when it was "
        "made, the bound of a growing context -c 0): {} tokens are cached. Give --kv-budget and --kv-spill DIR "
        "to spill to disk, use an evicting attention method (e.g. --attn streaming), or a smaller KV type "
        "(--kv-type-k/-v f16, q8_0)",
        cfg_.budget_bytes, held));
  return make_error(ErrorCode::kContextFull, fmt::format(
      "KV cache budget reached (--kv-budget {} bytes): {} tokens fit per KV head "
      "({} blocks of {} tokens, {} bytes each, shared by {} layers x {} KV heads); "
      "{} tokens are cached. Raise --kv-budget, set --kv-spill DIR, or use an evicting "
      "attention method (e.g. --attn streaming)",
      cfg_.budget_bytes, tokens_that_fit(),
      cfg_.budget_bytes / static_cast<int64_t>(pool_->block_bytes()),
      cfg_.block_tokens, pool_->block_bytes(), cfg_.n_layer,
      cfg_.n_head_kv, held));
}

Status KvCache::append(int64_t il, int64_t n, const float* k, const float* v, const int32_t* pos,
                       int32_t seq_id) {
  if (il < 0 || il >= cfg_.n_layer)
    return make_error(fmt::format("kv append: layer {} out of range [0, {})", il,
                                  cfg_.n_layer));
  if (n <= 0) return ok_status();
  const int64_t H = cfg_.n_head_kv, d = cfg_.head_dim, dv = cfg_.head_dim_v;
  if (cfg_.rope_provider) {
    int32_t max_pos = 0;
    for (int64_t t = 0; t < n; ++t) max_pos = std::max(max_pos, pos[t]);
    RopeTable t = cfg_.rope_provider(std::max(static_cast<int64_t>(max_pos) + 1, rope_length_hint_));
    if (!same_table(t, rope_[static_cast<size_t>(il)])) {
      if (t.n_rot != rope_[static_cast<size_t>(il)].n_rot ||
          static_cast<int64_t>(t.inv_freq.size()) < t.n_rot / 2)
        return make_error("kv append: the rope provider changed the number of rotated dimensions");
      if (cfg_.rope_rerotate) {
        set_rope(il, t);
      } else {
        for (int64_t h = 0; h < H; ++h) mixed_rope_ = mixed_rope_ || head(il, h).n > 0;
        rope_[static_cast<size_t>(il)] = std::move(t);
      }
    }
  }
  // A last block shared with another cache (a truncation left it partly filled) is copied
  // before rows go into it.
  for (int64_t h = 0; h < H; ++h) LC_TRY(own_last(head(il, h)));
  int64_t needed = 0;
  for (int64_t h = 0; h < H; ++h) {
    const Head& hd = head(il, h);
    needed += blocks_for(hd, hd.n + n) - static_cast<int64_t>(hd.blocks.size());
  }
  LC_TRY(ensure_room(il, needed));
  // Allocate every block first so that a failure (disk full while spilling) leaves the
  // cache as it was.
  auto taken = take_blocks(needed);  // per append call, not per token
  if (!taken) return make_error(taken.error().message + fmt::format(" (appending {} tokens to layer {})", n, il));
  std::vector<int32_t> fresh = std::move(*taken);
  const size_t kn = static_cast<size_t>(n * H * d);
  if (krot_.size() < kn) krot_.resize(kn);
  std::memcpy(krot_.data(), k, kn * sizeof(float));
  const RopeTable& rt = rope_[static_cast<size_t>(il)];
  if (rt.n_rot > 0) rt.apply(krot_.data(), n, H, d, pos);
  size_t next_fresh = 0;
  for (int64_t h = 0; h < H; ++h) {
    Head& hd = head(il, h);
    for (int64_t t = 0; t < n; ++t) {
      if (blocks_for(hd, hd.n + 1) > static_cast<int64_t>(hd.blocks.size())) hd.blocks.push_back(fresh[next_fresh++]);
      kernels::quantize_row(cfg_.type_k, krot_.data() + (t * H + h) * d, k_row(hd, hd.n), d);
      kernels::quantize_row(cfg_.type_v, v + (t * H + h) * dv, v_row(hd, hd.n), dv);
      hd.pos.push_back(pos[t]);
      hd.idx.push_back(static_cast<int32_t>(n_appended_[static_cast<size_t>(il)] + t));
      hd.seq.push_back(seq_id);
      ++hd.n;
    }
  }
  LC_CHECK(next_fresh == fresh.size());
  n_appended_[static_cast<size_t>(il)] += n;
  return ok_status();
}

Status KvCache::own_block(Head& hd, size_t b) {
  const int32_t old = hd.blocks[b];
  if (pool_->refs(old) <= 1) return ok_status();
  auto id = pool_->allocate();
  if (!id) return make_error(id.error().message + " (copying a KV block shared with another sequence)");
  std::memcpy(pool_->data(*id), pool_->data(old), pool_->block_bytes());
  pool_->release(old);
  hd.blocks[b] = *id;
  return ok_status();
}

Expected<std::vector<int32_t>> KvCache::take_blocks(int64_t n) {
  std::vector<int32_t> fresh;
  fresh.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto id = pool_->allocate();
    if (!id) {
      for (int32_t f : fresh) pool_->release(f);
      return id.error();
    }
    fresh.push_back(*id);
  }
  return fresh;
}

Status KvCache::own_blocks(Head& hd) {
  for (size_t b = 0; b < hd.blocks.size(); ++b) LC_TRY(own_block(hd, b));
  return ok_status();
}

Status KvCache::own_last(Head& hd) {
  if (hd.blocks.empty() || blocks_for(hd, hd.n + 1) > static_cast<int64_t>(hd.blocks.size())) return ok_status();
  return own_block(hd, hd.blocks.size() - 1);
}

Expected<int64_t> KvCache::adopt_prefix(const KvCache& src, int64_t n_seq) {
  if (src.pool_ != pool_)
    return make_error(ErrorCode::kInvalidArgument, "kv adopt_prefix: the caches do not share a block pool");
  const KvCacheConfig& a = cfg_;
  const KvCacheConfig& b = src.cfg_;
  if (a.n_layer != b.n_layer || a.n_head_kv != b.n_head_kv || a.head_dim != b.head_dim ||
      a.head_dim_v != b.head_dim_v || a.block_tokens != b.block_tokens || a.type_k != b.type_k ||
      a.type_v != b.type_v)
    return make_error(ErrorCode::kInvalidArgument, "kv adopt_prefix: the caches differ in shape, block size or types");
  if (a.rope_provider || b.rope_provider)
    return make_error(ErrorCode::kUnsupported, "kv adopt_prefix: a dynamic rope re-rotates keys in place");
  for (int64_t il = 0; il < a.n_layer; ++il)
    if (n_appended_[static_cast<size_t>(il)] != 0)
      return make_error(ErrorCode::kInvalidArgument, "kv adopt_prefix: this cache is not empty");
  const int64_t B = a.block_tokens;
  int64_t take = std::max<int64_t>(n_seq, 0) / B * B;
  for (int64_t il = 0; il < a.n_layer; ++il) take = std::min(take, src.n_appended(il) / B * B);
  if (take == 0) return int64_t{0};
  for (const Head& h : src.heads_) {
    if (h.n_thin > 0)
      return make_error(ErrorCode::kUnsupported,
                        "kv adopt_prefix: the source stores keys without dropped channels (think), in blocks laid out "
                        "differently");
    if (h.n < take || h.idx[static_cast<size_t>(take - 1)] != take - 1)  // ascending and unique: 0..take-1
      return make_error(ErrorCode::kUnsupported,
                        "kv adopt_prefix: the source no longer holds every token of the prefix (a method evicted some)");
  }
  for (int64_t il = 0; il < a.n_layer; ++il)
    if (!same_table(src.rope_[static_cast<size_t>(il)], rope_[static_cast<size_t>(il)]))
      return make_error(ErrorCode::kInvalidArgument, "kv adopt_prefix: the caches rotate keys with different tables");
  for (size_t i = 0; i < heads_.size(); ++i) {
    const Head& from = src.heads_[i];
    Head& to = heads_[i];
    for (int64_t bi = 0; bi < take / B; ++bi) {
      pool_->add_ref(from.blocks[static_cast<size_t>(bi)]);
      to.blocks.push_back(from.blocks[static_cast<size_t>(bi)]);
    }
    to.pos.assign(from.pos.begin(), from.pos.begin() + take);
    to.idx.assign(from.idx.begin(), from.idx.begin() + take);
    to.seq.assign(from.seq.begin(), from.seq.begin() + take);
    to.n = take;
    ++to.epoch;
  }
  for (auto& n : n_appended_) n = take;
  return take;
}

void KvCache::free_tail_blocks(Head& hd) {
  const int64_t keep = blocks_for(hd, hd.n);
  while (static_cast<int64_t>(hd.blocks.size()) > keep) {
    pool_->release(hd.blocks.back());
    hd.blocks.pop_back();
  }
}

Status KvCache::retain(int64_t il, int64_t h, std::span<const int32_t> keep) {
  if (il < 0 || il >= cfg_.n_layer || h < 0 || h >= cfg_.n_head_kv)
    return make_error(fmt::format("kv retain: layer {} head {} out of range", il, h));
  Head& hd = head(il, h);
  for (size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || keep[i] >= hd.n || (i > 0 && keep[i] <= keep[i - 1]))
      return make_error(fmt::format("kv retain: keep indices of layer {} head {} must be ascending, "
                                    "unique and in [0, {}); index {} is {}",
                                    il, h, hd.n, i, keep[i]));
  }
  const int64_t m = static_cast<int64_t>(keep.size());
  if (m == hd.n) return ok_status();
  LC_TRY(own_blocks(hd));
  // Thin rows (drop_key_channels) stay thin; the ordinary region then starts after the blocks
  // the kept thin rows take. Rows only move down (in thin, then ordinary, order), so a row is
  // never written before it is read.
  const int64_t nt = hd.n_thin, tb = hd.thin_blocks;
  const int64_t nt2 = nt == 0 ? 0 : std::lower_bound(keep.begin(), keep.end(), static_cast<int32_t>(nt)) - keep.begin();
  const int64_t tb2 = nt2 == 0 ? 0 : (nt2 + hd.thin_tokens - 1) / hd.thin_tokens;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t src = keep[static_cast<size_t>(i)];
    if (src == i && nt == 0) continue;
    const bool thin = src < nt;
    uint8_t* kd = k_row_in(hd, i, nt2, tb2);
    const uint8_t* ks = k_row_in(hd, src, nt, tb);
    if (kd != ks) {
      // src > i or a region that moved: the rows never overlap.
      std::memcpy(kd, ks, thin ? hd.thin_k_bytes : k_row_bytes_);
      std::memcpy(v_row_in(hd, i, nt2, tb2), v_row_in(hd, src, nt, tb), v_row_bytes_);
    }
    hd.pos[static_cast<size_t>(i)] = hd.pos[static_cast<size_t>(src)];
    hd.idx[static_cast<size_t>(i)] = hd.idx[static_cast<size_t>(src)];
    hd.seq[static_cast<size_t>(i)] = hd.seq[static_cast<size_t>(src)];
  }
  hd.n_thin = nt2;
  hd.thin_blocks = tb2;
  hd.n = m;
  hd.pos.resize(static_cast<size_t>(m));
  hd.idx.resize(static_cast<size_t>(m));
  hd.seq.resize(static_cast<size_t>(m));
  free_tail_blocks(hd);
  ++hd.epoch;
  return ok_status();
}

void KvCache::truncate(int64_t n_seq) {
  if (n_seq < 0) n_seq = 0;
  if (n_seq == 0) mixed_rope_ = false;
  for (auto& hd : heads_) {
    const auto it = std::lower_bound(hd.idx.begin(), hd.idx.end(), static_cast<int32_t>(std::min<int64_t>(n_seq, INT32_MAX)));
    const int64_t m = it - hd.idx.begin();
    if (m == hd.n) continue;
    if (m < hd.n_thin) {
      hd.n_thin = m;
      hd.thin_blocks = (m + hd.thin_tokens - 1) / hd.thin_tokens;
    }
    hd.n = m;
    hd.pos.resize(static_cast<size_t>(m));
    hd.idx.resize(static_cast<size_t>(m));
    hd.seq.resize(static_cast<size_t>(m));
    free_tail_blocks(hd);
    hd.low_water = std::min(hd.low_water, m);
  }
  for (auto& a : n_appended_) a = std::min(a, n_seq);
}

template <class Fn>
void KvCache::rewrite_keys(Head& hd, int64_t first, int64_t count, Fn&& fn) {
  float* row = row_.data();
  for (int64_t i = first; i < first + count; ++i) {
    uint8_t* r = k_row(hd, i);
    kernels::dequantize_row(cfg_.type_k, r, row, cfg_.head_dim);
    fn(row, i);
    kernels::quantize_row(cfg_.type_k, row, r, cfg_.head_dim);
  }
}

int64_t KvFragment::n_tokens() const {
  int64_t n = 0;
  for (const Head& h : heads) n += h.n();
  return n;
}

size_t KvFragment::bytes() const {
  size_t b = 0;
  for (const Head& h : heads)
    b += h.k.size() + h.v.size() + (h.pos.size() + h.idx.size() + h.seq.size()) * sizeof(int32_t);
  return b;
}

void KvFragment::drop_from(int64_t n_seq) {
  for (Head& h : heads) {
    const size_t m = static_cast<size_t>(
        std::lower_bound(h.idx.begin(), h.idx.end(), static_cast<int32_t>(std::clamp<int64_t>(n_seq, 0, INT32_MAX))) -
        h.idx.begin());
    if (m == h.idx.size()) continue;
    const size_t kb = h.idx.empty() ? 0 : h.k.size() / h.idx.size();
    const size_t vb = h.idx.empty() ? 0 : h.v.size() / h.idx.size();
    h.pos.resize(m);
    h.idx.resize(m);
    h.seq.resize(m);
    h.k.resize(m * kb);
    h.v.resize(m * vb);
  }
  count = std::clamp<int64_t>(n_seq - first_seq, 0, count);
}

Expected<KvFragment> KvCache::extract(int64_t first_seq, int64_t count) {
  if (count < 1 || first_seq < 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("kv extract: the range [{}, {}) is empty or negative", first_seq, first_seq + count));
  for (int64_t il = 0; il < cfg_.n_layer; ++il)
    if (first_seq + count > n_appended_[static_cast<size_t>(il)])
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("kv extract: the range [{}, {}) goes past the {} tokens appended to layer {}",
                                    first_seq, first_seq + count, n_appended_[static_cast<size_t>(il)], il));
  KvFragment f;
  f.n_layer = cfg_.n_layer;
  f.n_head_kv = cfg_.n_head_kv;
  f.head_dim = cfg_.head_dim;
  f.head_dim_v = cfg_.head_dim_v;
  f.block_tokens = cfg_.block_tokens;
  f.type_k = cfg_.type_k;
  f.type_v = cfg_.type_v;
  f.first_seq = first_seq;
  f.count = count;
  f.rope = rope_;
  for (Head& hd : heads_) LC_TRY(own_blocks(hd));  // rows move: shared blocks are copied first
  for (Head& hd : heads_) LC_TRY(unthin(hd, "hiding a fragment"));  // rows move between layouts
  f.heads.resize(heads_.size());
  const int32_t lo_idx = static_cast<int32_t>(first_seq), hi_idx = static_cast<int32_t>(first_seq + count);
  for (size_t hi = 0; hi < heads_.size(); ++hi) {
    Head& hd = heads_[hi];
    KvFragment::Head& fh = f.heads[hi];
    const int64_t a = std::lower_bound(hd.idx.begin(), hd.idx.end(), lo_idx) - hd.idx.begin();
    const int64_t b = std::lower_bound(hd.idx.begin(), hd.idx.end(), hi_idx) - hd.idx.begin();
    const int64_t m = b - a;
    if (m == 0) continue;
    fh.pos.assign(hd.pos.begin() + a, hd.pos.begin() + b);
    fh.idx.assign(hd.idx.begin() + a, hd.idx.begin() + b);
    fh.seq.assign(hd.seq.begin() + a, hd.seq.begin() + b);
    fh.k.resize(static_cast<size_t>(m) * k_row_bytes_);
    fh.v.resize(static_cast<size_t>(m) * v_row_bytes_);
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(fh.k.data() + static_cast<size_t>(i) * k_row_bytes_, k_row(hd, a + i), k_row_bytes_);
      std::memcpy(fh.v.data() + static_cast<size_t>(i) * v_row_bytes_, v_row(hd, a + i), v_row_bytes_);
    }
    // Close the gap: rows after the range move down by m (source always above destination).
    for (int64_t i = b; i < hd.n; ++i) {
      std::memcpy(k_row(hd, i - m), k_row(hd, i), k_row_bytes_);
      std::memcpy(v_row(hd, i - m), v_row(hd, i), v_row_bytes_);
    }
    hd.pos.erase(hd.pos.begin() + a, hd.pos.begin() + b);
    hd.idx.erase(hd.idx.begin() + a, hd.idx.begin() + b);
    hd.seq.erase(hd.seq.begin() + a, hd.seq.begin() + b);
    hd.n -= m;
    free_tail_blocks(hd);
    ++hd.epoch;  // tokens left the middle: summaries over them are stale
  }
  return f;
}

Status KvCache::insert(const KvFragment& f) {
  if (f.n_layer != cfg_.n_layer || f.n_head_kv != cfg_.n_head_kv || f.head_dim != cfg_.head_dim ||
      f.head_dim_v != cfg_.head_dim_v)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("kv insert: the fragment was taken from a cache of {} layers x {} KV heads x "
                                  "head_dim {}/{}, but this cache has {} x {} x {}/{}",
                                  f.n_layer, f.n_head_kv, f.head_dim, f.head_dim_v, cfg_.n_layer, cfg_.n_head_kv,
                                  cfg_.head_dim, cfg_.head_dim_v));
  if (f.block_tokens != cfg_.block_tokens || f.type_k != cfg_.type_k || f.type_v != cfg_.type_v)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("kv insert: the fragment was taken with --kv-block {} and K/V types {}/{}; this "
                                  "cache has --kv-block {}, {}/{}",
                                  f.block_tokens, dtype_name(f.type_k), dtype_name(f.type_v), cfg_.block_tokens,
                                  dtype_name(cfg_.type_k), dtype_name(cfg_.type_v)));
  if (f.heads.size() != heads_.size() || f.rope.size() != rope_.size())
    return make_error(ErrorCode::kInvalidArgument, "kv insert: the fragment is malformed (head or layer count)");
  const int64_t B = cfg_.block_tokens;
  for (int64_t il = 0; il < cfg_.n_layer; ++il)
    for (int64_t h = 0; h < cfg_.n_head_kv; ++h)
      if (f.head(il, h).n() > 0) LC_TRY(unthin(head(il, h), "restoring a fragment"));
  int64_t needed = 0;
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    for (int64_t h = 0; h < cfg_.n_head_kv; ++h) {
      const KvFragment::Head& fh = f.head(il, h);
      const Head& hd = head(il, h);
      const int64_t m = fh.n();
      if (static_cast<int64_t>(fh.pos.size()) != m || static_cast<int64_t>(fh.seq.size()) != m ||
          fh.k.size() != static_cast<size_t>(m) * k_row_bytes_ || fh.v.size() != static_cast<size_t>(m) * v_row_bytes_)
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("kv insert: the fragment is malformed (layer {} head {}: sizes)", il, h));
      for (int64_t i = 0; i < m; ++i) {
        const int32_t s = fh.idx[static_cast<size_t>(i)];
        if (s < 0 || (i > 0 && s <= fh.idx[static_cast<size_t>(i - 1)]))
          return make_error(ErrorCode::kInvalidArgument,
                            fmt::format("kv insert: the fragment is malformed (layer {} head {}: sequence indices "
                                        "not ascending)", il, h));
        if (s >= n_appended_[static_cast<size_t>(il)])
          return make_error(ErrorCode::kInvalidArgument,
                            fmt::format("kv insert: the fragment holds sequence index {}, but layer {} has only {} "
                                        "tokens appended (the sequence was truncated since it was extracted)",
                                        s, il, n_appended_[static_cast<size_t>(il)]));
        if (std::binary_search(hd.idx.begin(), hd.idx.end(), s))
          return make_error(ErrorCode::kInvalidArgument,
                            fmt::format("kv insert: sequence index {} is already held by layer {} head {} (the "
                                        "fragment was inserted already, or overlaps tokens the cache holds)",
                                        s, il, h));
      }
      if (m > 0) needed += (hd.n + m + B - 1) / B - static_cast<int64_t>(hd.blocks.size());
    }
  }
  if (needed > 0 && cfg_.budget_bytes != 0 && cfg_.policy != KvBudgetPolicy::kSpill &&
      pool_->ram_blocks_available() < needed)
    return make_error(ErrorCode::kContextFull,
                      fmt::format("kv insert: the fragment needs {} more blocks of {} bytes but the KV budget "
                                  "(--kv-budget {} bytes) has room for {}",
                                  needed, pool_->block_bytes(), cfg_.budget_bytes, pool_->ram_blocks_available()));
  for (Head& hd : heads_) LC_TRY(own_blocks(hd));  // rows move: shared blocks are copied first
  auto taken = take_blocks(needed);
  if (!taken) return make_error(ErrorCode::kContextFull, "kv insert: " + taken.error().message);
  std::vector<int32_t> fresh = std::move(*taken);
  size_t next_fresh = 0;
  for (int64_t il = 0; il < cfg_.n_layer; ++il) {
    const RopeTable& from = f.rope[static_cast<size_t>(il)];
    const RopeTable& to = rope_[static_cast<size_t>(il)];
    const bool rerotate = !same_table(from, to);
    for (int64_t h = 0; h < cfg_.n_head_kv; ++h) {
      const KvFragment::Head& fh = f.head(il, h);
      const int64_t m = fh.n();
      if (m == 0) continue;
      Head& hd = head(il, h);
      const int64_t n = hd.n, total = n + m;
      while (static_cast<int64_t>(hd.blocks.size()) * B < total) hd.blocks.push_back(fresh[next_fresh++]);
      std::vector<int32_t> pos(static_cast<size_t>(total)), idx(static_cast<size_t>(total)),
          seq(static_cast<size_t>(total));
      std::vector<uint8_t> from_frag(static_cast<size_t>(total), 0);
      // Merge from the back: the write slot w is never below the next unread held row i.
      int64_t i = n - 1, j = m - 1;
      for (int64_t w = total - 1; w >= 0; --w) {
        const bool take_frag = j >= 0 && (i < 0 || fh.idx[static_cast<size_t>(j)] > hd.idx[static_cast<size_t>(i)]);
        const size_t ws = static_cast<size_t>(w);
        if (take_frag) {
          const size_t js = static_cast<size_t>(j);
          std::memcpy(k_row(hd, w), fh.k.data() + js * k_row_bytes_, k_row_bytes_);
          std::memcpy(v_row(hd, w), fh.v.data() + js * v_row_bytes_, v_row_bytes_);
          pos[ws] = fh.pos[js];
          idx[ws] = fh.idx[js];
          seq[ws] = fh.seq[js];
          from_frag[ws] = 1;
          --j;
        } else {
          const size_t is = static_cast<size_t>(i);
          if (w != i) {
            std::memcpy(k_row(hd, w), k_row(hd, i), k_row_bytes_);
            std::memcpy(v_row(hd, w), v_row(hd, i), v_row_bytes_);
          }
          pos[ws] = hd.pos[is];
          idx[ws] = hd.idx[is];
          seq[ws] = hd.seq[is];
          --i;
        }
      }
      hd.pos = std::move(pos);
      hd.idx = std::move(idx);
      hd.seq = std::move(seq);
      hd.n = total;
      if (rerotate) {
        // The layer's rope table changed since extraction: bring the fragment's keys from its
        // table to the current one (as set_rope() does for held keys).
        for (int64_t w = 0; w < total; ++w) {
          if (!from_frag[static_cast<size_t>(w)]) continue;
          rewrite_keys(hd, w, 1, [&](float* row, int64_t r) {
            const int32_t p = hd.pos[static_cast<size_t>(r)], neg = -p;
            kernels::rope_apply(row, 1, 1, cfg_.head_dim, from.n_rot, &neg, from.inv_freq.data(),
                                1.0f / from.mscale, from.neox);
            kernels::rope_apply(row, 1, 1, cfg_.head_dim, to.n_rot, &p, to.inv_freq.data(), to.mscale, to.neox);
          });
        }
      }
      ++hd.epoch;  // tokens joined the middle: summaries are stale
    }
  }
  LC_CHECK(next_fresh == fresh.size());
  return ok_status();
}

Status KvCache::shift_positions(int64_t il, int64_t h, int64_t first, int64_t count, int32_t delta) {
  if (il < 0 || il >= cfg_.n_layer || h < 0 || h >= cfg_.n_head_kv)
    return make_error(fmt::format("kv shift: layer {} head {} out of range", il, h));
  Head& hd = head(il, h);
  if (first < 0 || count < 0 || first + count > hd.n)
    return make_error(fmt::format("kv shift: tokens [{}, {}) are outside the {} of layer {} head {}",
                                  first, first + count, hd.n,
                                  il, h));
  if (delta == 0 || count == 0) return ok_status();
  if (mixed_rope_)
    return make_error(ErrorCode::kUnsupported,
                      "kv shift: the cached keys were rotated with different tables (dynamic-ntk:cache=append), "
                      "so they cannot be moved with one; use dynamic-ntk:cache=rerotate");
  LC_TRY(own_blocks(hd));
  LC_TRY(unthin(hd, "moving keys (a K-shift)"));  // the rotation mixes dropped and kept channels
  const RopeTable& rt = rope_[static_cast<size_t>(il)];
  rewrite_keys(hd, first, count, [&](float* row, int64_t i) {
    // R(p + delta) = R(delta) R(p); mscale 1: the stored key already carries it once.
    if (rt.n_rot > 0)
      kernels::rope_apply(row, 1, 1, cfg_.head_dim, rt.n_rot, &delta, rt.inv_freq.data(), 1.0f, rt.neox);
    hd.pos[static_cast<size_t>(i)] += delta;
  });
  ++hd.epoch;
  return ok_status();
}

Status KvCache::zero_key_channels(int64_t il, int64_t h, std::span<const int32_t> channels) {
  if (il < 0 || il >= cfg_.n_layer || h < 0 || h >= cfg_.n_head_kv)
    return make_error(fmt::format("kv zero_key_channels: layer {} head {} out of range", il, h));
  for (int32_t ch : channels)
    if (ch < 0 || ch >= cfg_.head_dim)
      return make_error(fmt::format("kv zero_key_channels: channel {} outside the head's {} key channels", ch,
                                    cfg_.head_dim));
  Head& hd = head(il, h);
  if (channels.empty() || hd.n == 0) return ok_status();
  LC_TRY(own_blocks(hd));  // a block shared with another cache is copied first
  LC_TRY(unthin(hd, "zeroing key channels"));
  rewrite_keys(hd, 0, hd.n, [&](float* row, int64_t) {
    for (int32_t ch : channels) row[ch] = 0.0f;
  });
  ++hd.epoch;  // page summaries (min/max keys) are stale
  return ok_status();
}

Expected<int64_t> KvCache::drop_key_channels(int64_t il, int64_t h, std::span<const int32_t> channels) {
  if (il < 0 || il >= cfg_.n_layer || h < 0 || h >= cfg_.n_head_kv)
    return make_error(fmt::format("kv drop_key_channels: layer {} head {} out of range", il, h));
  const int64_t d = cfg_.head_dim;
  std::vector<uint8_t> dropped(static_cast<size_t>(d), 0);
  for (int32_t ch : channels) {
    if (ch < 0 || ch >= d)
      return make_error(fmt::format("kv drop_key_channels: channel {} outside the head's {} key channels", ch, d));
    dropped[static_cast<size_t>(ch)] = 1;
  }
  Head& hd = head(il, h);
  if (channels.empty() || hd.n == 0) return int64_t{0};
  std::vector<int32_t> kept;
  for (int64_t e = 0; e < d; ++e)
    if (!dropped[static_cast<size_t>(e)]) kept.push_back(static_cast<int32_t>(e));
  // The thin layout: key rows of the kept channels (padded to the key type's block), then the
  // value rows, as many tokens as one block of the pool holds.
  const int64_t bs = traits(cfg_.type_k).block_size;
  const int64_t d2 = std::max<int64_t>(bs, (static_cast<int64_t>(kept.size()) + bs - 1) / bs * bs);
  const size_t tk = row_bytes(cfg_.type_k, d2), bb = pool_->block_bytes();
  int64_t tt = static_cast<int64_t>(bb / (tk + v_row_bytes_));
  while (tt > 0 && (static_cast<size_t>(tt) * tk + 63) / 64 * 64 + static_cast<size_t>(tt) * v_row_bytes_ > bb) --tt;
  bool shared = false;
  for (int32_t b : hd.blocks) shared = shared || pool_->refs(b) > 1;
  const int64_t T = (hd.n + tt - 1) / std::max<int64_t>(tt, 1);
  const bool no_room = cfg_.budget_bytes != 0 && cfg_.policy != KvBudgetPolicy::kSpill &&
                       pool_->ram_blocks_available() < T;
  if (tt <= cfg_.block_tokens || T >= static_cast<int64_t>(hd.blocks.size()) || cfg_.rope_provider || shared ||
      no_room || hd.n_thin > 0) {
    // No block to gain, or the keys cannot be stored thin now: the channels are zeroed in place.
    LC_TRY(zero_key_channels(il, h, channels));
    return int64_t{0};
  }
  auto taken = take_blocks(T);
  if (!taken) return make_error(ErrorCode::kContextFull, "kv drop_key_channels: " + taken.error().message);
  const std::vector<int32_t> fresh = std::move(*taken);
  Head thin;
  thin.blocks = fresh;
  thin.n_thin = hd.n;
  thin.thin_blocks = T;
  thin.thin_tokens = tt;
  thin.thin_k_bytes = tk;
  thin.thin_v_offset = (static_cast<size_t>(tt) * tk + 63) / 64 * 64;
  thin.kept = kept;
  std::vector<float> row(static_cast<size_t>(d)), part(static_cast<size_t>(d2), 0.0f);
  for (int64_t i = 0; i < hd.n; ++i) {
    kernels::dequantize_row(cfg_.type_k, k_row(hd, i), row.data(), d);
    for (size_t c = 0; c < kept.size(); ++c) part[c] = row[static_cast<size_t>(kept[c])];
    kernels::quantize_row(cfg_.type_k, part.data(), k_row_in(thin, i, thin.n_thin, T), d2);
    std::memcpy(v_row_in(thin, i, thin.n_thin, T), v_row(hd, i), v_row_bytes_);
  }
  const int64_t given = static_cast<int64_t>(hd.blocks.size()) - T;
  for (int32_t b : hd.blocks) pool_->release(b);
  hd.blocks = std::move(thin.blocks);
  hd.n_thin = thin.n_thin;
  hd.thin_blocks = T;
  hd.thin_tokens = tt;
  hd.thin_k_bytes = tk;
  hd.thin_k_dim = d2;
  hd.thin_v_offset = thin.thin_v_offset;
  hd.kept = std::move(kept);
  ++hd.epoch;
  return given;
}

Status KvCache::unthin(Head& hd, const char* why) {
  if (hd.n_thin == 0) return ok_status();
  const int64_t B = cfg_.block_tokens, n = hd.n, need = (n + B - 1) / B;
  if (cfg_.budget_bytes != 0 && cfg_.policy != KvBudgetPolicy::kSpill && pool_->ram_blocks_available() < need)
    return make_error(ErrorCode::kContextFull,
                      fmt::format("kv: {} needs the keys stored without their dropped channels (think) stored with "
                                  "every channel again: {} blocks of {} bytes, but the KV budget (--kv-budget {} "
                                  "bytes) has room for {}",
                                  why, need, pool_->block_bytes(), cfg_.budget_bytes, pool_->ram_blocks_available()));
  auto taken = take_blocks(need);
  if (!taken) return make_error(ErrorCode::kContextFull, fmt::format("kv: {}: {}", why, taken.error().message));
  std::vector<int32_t> fresh = std::move(*taken);
  Head full;
  full.blocks = std::move(fresh);
  std::vector<float> row(static_cast<size_t>(cfg_.head_dim));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* kd = k_row_in(full, i, 0, 0);
    if (i < hd.n_thin) {
      key_row_f32(hd, i, row.data());
      kernels::quantize_row(cfg_.type_k, row.data(), kd, cfg_.head_dim);
    } else {
      std::memcpy(kd, k_row(hd, i), k_row_bytes_);
    }
    std::memcpy(v_row_in(full, i, 0, 0), v_row(hd, i), v_row_bytes_);
  }
  for (int32_t b : hd.blocks) pool_->release(b);
  hd.blocks = std::move(full.blocks);
  hd.n_thin = hd.thin_blocks = hd.thin_tokens = 0;
  hd.thin_k_bytes = hd.thin_v_offset = 0;
  hd.thin_k_dim = 0;
  hd.kept.clear();
  ++hd.epoch;
  return ok_status();
}

void KvCache::set_rope(int64_t il, const RopeTable& table) {
  RopeTable& old = rope_[static_cast<size_t>(il)];
  for (int64_t h = 0; h < cfg_.n_head_kv; ++h) {
    Head& hd = head(il, h);
    if (hd.n == 0) continue;
    // Caches with a rope provider never share blocks (adopt_prefix refuses them).
    for (int32_t b : hd.blocks) LC_CHECK(pool_->refs(b) == 1);
    // drop_key_channels refuses a cache with a rope provider, so no head here is thin.
    LC_CHECK(hd.n_thin == 0);
    rewrite_keys(hd, 0, hd.n, [&](float* row, int64_t i) {
      const int32_t p = hd.pos[static_cast<size_t>(i)], neg = -p;
      // Undo the old rotation (and its mscale), then rotate with the new table.
      kernels::rope_apply(row, 1, 1, cfg_.head_dim, old.n_rot, &neg, old.inv_freq.data(),
                          1.0f / old.mscale, old.neox);
      kernels::rope_apply(row, 1, 1, cfg_.head_dim, table.n_rot, &p, table.inv_freq.data(),
                          table.mscale, table.neox);
    });
    ++hd.epoch;
  }
  old = table;
}

const float* KvCache::keys_f32(int64_t il, int64_t h, int64_t first, int64_t count, float* scratch) const {
  const Head& hd = head(il, h);
  if (hd.n_thin > 0) {  // thin rows, and ordinary ones that need not start a block here
    read_keys(il, h, first, count, scratch);
    return scratch;
  }
  const uint8_t* r = k_row(hd, first);
  if (cfg_.type_k == DType::F32) return reinterpret_cast<const float*>(r);
  for (int64_t i = 0; i < count; ++i)
    kernels::dequantize_row(cfg_.type_k, r + static_cast<size_t>(i) * k_row_bytes_, scratch + i * cfg_.head_dim,
                            cfg_.head_dim);
  return scratch;
}

const float* KvCache::values_f32(int64_t il, int64_t h, int64_t first, int64_t count, float* scratch) const {
  const Head& hd = head(il, h);
  if (hd.n_thin > 0) {  // value rows of a thin head's blocks need not be contiguous over `count`
    read_values(il, h, first, count, scratch);
    return scratch;
  }
  const uint8_t* r = v_row(hd, first);
  if (cfg_.type_v == DType::F32) return reinterpret_cast<const float*>(r);
  for (int64_t i = 0; i < count; ++i)
    kernels::dequantize_row(cfg_.type_v, r + static_cast<size_t>(i) * v_row_bytes_,
                            scratch + i * cfg_.head_dim_v, cfg_.head_dim_v);
  return scratch;
}

const uint16_t* KvCache::keys_f16(int64_t il, int64_t h, int64_t first) const {
  if (cfg_.type_k != DType::F16 || head(il, h).n_thin > 0) return nullptr;
  return reinterpret_cast<const uint16_t*>(k_row(head(il, h), first));
}

const uint16_t* KvCache::values_f16(int64_t il, int64_t h, int64_t first) const {
  if (cfg_.type_v != DType::F16 || head(il, h).n_thin > 0) return nullptr;
  return reinterpret_cast<const uint16_t*>(v_row(head(il, h), first));
}

void KvCache::prefetch(int64_t il, int64_t h, int64_t first, int64_t count) const {
  const Head& hd = head(il, h);
  if (hd.n_thin > 0) return;  // a hint only; thin heads are read row by row
  const char* k = reinterpret_cast<const char*>(k_row(hd, first));
  const char* v = reinterpret_cast<const char*>(v_row(hd, first));
  for (size_t o = 0; o < static_cast<size_t>(count) * k_row_bytes_; o += 64) __builtin_prefetch(k + o);
  for (size_t o = 0; o < static_cast<size_t>(count) * v_row_bytes_; o += 64) __builtin_prefetch(v + o);
}

KvCache::StoredRows KvCache::stored_rows(int64_t il, int64_t h, int64_t first, int64_t max_count) const {
  const Head& hd = head(il, h);
  StoredRows r;
  if (first < hd.n_thin) {
    const int64_t end = std::min({(first / hd.thin_tokens + 1) * hd.thin_tokens, hd.n_thin, first + max_count});
    r.count = end - first;
    r.thin = true;
    r.k_dim = hd.thin_k_dim;
  } else {
    const int64_t B = cfg_.block_tokens;
    r.count = std::min(max_count, B - (first - hd.n_thin) % B);
    r.k_dim = cfg_.head_dim;
  }
  r.k = k_row(hd, first);
  r.v = v_row(hd, first);
  return r;
}

void KvCache::read_keys(int64_t il, int64_t h, int64_t first, int64_t count, float* out) const {
  const Head& hd = head(il, h);
  for (int64_t i = 0; i < count; ++i) key_row_f32(hd, first + i, out + i * cfg_.head_dim);
}

void KvCache::read_values(int64_t il, int64_t h, int64_t first, int64_t count, float* out) const {
  const Head& hd = head(il, h);
  for (int64_t i = 0; i < count; ++i)
    kernels::dequantize_row(cfg_.type_v, v_row(hd, first + i), out + i * cfg_.head_dim_v, cfg_.head_dim_v);
}

KvMemory KvCache::memory() const {
  KvMemory m;
  m.resident_bytes = pool_->ram_bytes();
  m.in_use_bytes = static_cast<size_t>(pool_->n_used()) * pool_->block_bytes();
  m.spilled_bytes = pool_->spilled_bytes();
  for (const auto& hd : heads_)
    m.metadata_bytes += (hd.pos.capacity() + hd.idx.capacity() + hd.seq.capacity() + hd.blocks.capacity()) *
                        sizeof(int32_t);
  m.bytes_per_token = static_cast<size_t>(cfg_.n_layer * cfg_.n_head_kv) * (k_row_bytes_ + v_row_bytes_);
  m.blocks_in_use = pool_->n_used();
  m.blocks_spilled = pool_->n_spilled();
  m.blocks_free = pool_->ram_slots_free();
  if (cfg_.pool) {
    int64_t held = 0, spilled = 0;
    for (const auto& hd : heads_)
      for (int32_t b : hd.blocks) {
        ++held;
        spilled += pool_->spilled(b);
      }
    const size_t bb = pool_->block_bytes();
    m.in_use_bytes = static_cast<size_t>(held) * bb;
    m.spilled_bytes = static_cast<size_t>(spilled) * bb;
    m.resident_bytes = static_cast<size_t>(held - spilled) * bb;
    m.blocks_in_use = held;
    m.blocks_spilled = spilled;
  }
  for (const auto& hd : heads_)
    for (int32_t b : hd.blocks) m.blocks_shared += pool_->refs(b) > 1;
  return m;
}

void KvCache::poison_unused() {
  const int64_t B = cfg_.block_tokens;
  for (auto& hd : heads_) {
    if (!hd.blocks.empty() && pool_->refs(hd.blocks.back()) > 1) continue;  // another cache's rows
    if (hd.n_thin > 0) {
      // The thin region's last block past its tokens, then the ordinary blocks past the tokens.
      for (int64_t i = hd.n_thin; i < hd.thin_blocks * hd.thin_tokens; ++i) {
        std::memset(k_row_in(hd, i, INT64_MAX, 0), 0xFF, hd.thin_k_bytes);
        std::memset(v_row_in(hd, i, INT64_MAX, 0), 0xFF, v_row_bytes_);
      }
      const int64_t cap = hd.n_thin + (static_cast<int64_t>(hd.blocks.size()) - hd.thin_blocks) * B;
      for (int64_t i = std::max(hd.n, hd.n_thin); i < cap; ++i) {
        std::memset(k_row(hd, i), 0xFF, k_row_bytes_);
        std::memset(v_row(hd, i), 0xFF, v_row_bytes_);
      }
      continue;
    }
    for (int64_t i = hd.n; i < static_cast<int64_t>(hd.blocks.size()) * B; ++i) {
      std::memset(k_row(hd, i), 0xFF, k_row_bytes_);
      std::memset(v_row(hd, i), 0xFF, v_row_bytes_);
    }
  }
  pool_->poison_free();
}

}  // namespace lc
