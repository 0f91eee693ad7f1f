// KVzip (Kim et al., arXiv 2505.23416; kvpress kvpress/presses/kvzip_press.py) in the model's
// Context, on the golden GQA model (4 layers, 8 query heads over 2 KV heads). The oracle here
// rebuilds the reconstruction inputs from the reference (its prompt texts, encoded with the
// model's tokenizer; chunking; the previous chunk's last 8 tokens), runs them through an
// unpressed context of the same model, records their queries and keys, and recomputes kvpress's
// scores and selection in double: for chunk [s, e), the causal softmax of every reconstruction
// query over the first min(4, s) context keys, the chunk's keys and the reconstruction tokens'
// own keys; max over the group and the queries; the floor(ratio x N) lowest of all layers' and
// heads' scores go.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kv/press_kvzip.h"
#include "model/context.h"
#include "model/model.h"
#include "model/press_runner.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";
constexpr int64_t kL = 4, kH = 8, kHkv = 2;

std::vector<int32_t> prompt_ids(const char* which) {
  std::ifstream in(kGolden + "cases/llama_gqa_f32/case.json");
  const auto cj = nlohmann::json::parse(in);
  return cj["prompts"][which]["ids"].get<std::vector<int32_t>>();
}

std::unique_ptr<Model> load_model() {
  auto m = Model::load(kGolden + "models/llama_gqa_f32.gguf");
  EXPECT_TRUE(m.has_value());
  return m ? std::move(*m) : nullptr;
}

std::unique_ptr<Context> make_ctx(const Model& m, const std::string& press, int n_threads = 1, int64_t n_ctx = 1024) {
  ContextParams cp{n_ctx, 64, n_threads};
  cp.kv_press = press;
  auto c = Context::create(m, cp);
  EXPECT_TRUE(c.has_value()) << press << ": " << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

using Kept = std::vector<std::vector<std::vector<int32_t>>>;  // [layer][KV head] sequence indices

Kept kept_of(const Context& c) {
  Kept k(kL, std::vector<std::vector<int32_t>>(kHkv));
  for (int64_t il = 0; il < kL; ++il)
    for (int64_t h = 0; h < kHkv; ++h) {
      const int32_t* s = c.kv().seq_index(il, h);
      k[static_cast<size_t>(il)][static_cast<size_t>(h)].assign(s, s + c.kv().n_tokens(il, h));
    }
  return k;
}

// Records the queries (pre-RoPE) and the stored keys of the tokens run through a context.
struct Recorder final : ForwardHooks {
  std::vector<std::vector<float>> q;               // [layer] rows of n_head * head_dim
  std::vector<std::vector<std::vector<float>>> k;  // [layer][KV head] rows of head_dim, post-RoPE
  std::vector<int32_t> pos;
  Recorder() : q(kL), k(kL, std::vector<std::vector<float>>(kHkv)) {}
  void on_queries(int64_t il, const float* qq, const int32_t* p, int64_t n) override {
    q[static_cast<size_t>(il)].insert(q[static_cast<size_t>(il)].end(), qq, qq + n * kH * 16);
    if (il == 0) pos.insert(pos.end(), p, p + n);
  }
  void on_attention(Context& ctx, int64_t il, const float*, const int32_t*, int64_t n) override {
    for (int64_t h = 0; h < kHkv; ++h) {
      const int64_t nh = ctx.kv().n_tokens(il, h);
      auto& dst = k[static_cast<size_t>(il)][static_cast<size_t>(h)];
      const size_t at = dst.size();
      dst.resize(at + static_cast<size_t>(n * 16));
      ctx.kv().read_keys(il, h, nh - n, n, dst.data() + at);
    }
  }
};

// The reference's kept sets and the reconstruction tokens run (as *n_tokens, *n_passes).
Kept kvzip_oracle(const Model& m, const std::vector<int32_t>& ctx_ids, int64_t chunk_size, double ratio,
                  int64_t* n_tokens, int64_t* n_passes) {
  const Tokenizer& tok = m.tokenizer();
  const auto first = tok.encode("\n\nRepeat the previous context exactly.", false, false);
  const auto next = tok.encode("\n\nRepeat the part of the previous context exactly, starting with", false, false);
  const auto suffix = tok.encode("\n", false, false);
  const int64_t n = static_cast<int64_t>(ctx_ids.size()), d = 16, g = kH / kHkv;
  auto ref = make_ctx(m, "");
  EXPECT_TRUE(ref->decode(ctx_ids, Logits::kNone).is_ok());
  // kvpress _chunk_fn
  std::vector<std::pair<int64_t, int64_t>> chunks;
  if (n <= chunk_size) {
    chunks.push_back({0, n});
  } else {
    for (int64_t s = 0; s < n; s += chunk_size) chunks.push_back({s, std::min(n, s + chunk_size)});
  }
  *n_passes = static_cast<int64_t>(chunks.size());
  *n_tokens = 0;
  std::vector<double> score(static_cast<size_t>(kL * kHkv * n), 0.0);
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto [s, e] = chunks[c];
    std::vector<int32_t> ids = c == 0 ? first : next;
    if (c > 0) {
      const int64_t ps = chunks[c - 1].first, pe = chunks[c - 1].second;
      ids.insert(ids.end(), ctx_ids.begin() + std::max(ps, pe - 8), ctx_ids.begin() + pe);
    }
    ids.insert(ids.end(), suffix.begin(), suffix.end());
    ids.insert(ids.end(), ctx_ids.begin() + s, ctx_ids.begin() + e);
    *n_tokens += static_cast<int64_t>(ids.size());
    Recorder rec;
    ref->attach_hooks(&rec);
    EXPECT_TRUE(ref->evaluate_scratch(ids).is_ok());
    ref->detach_hooks(&rec);
    const int64_t q = static_cast<int64_t>(ids.size()), sink = std::min<int64_t>(4, s);
    for (int64_t il = 0; il < kL; ++il) {
      std::vector<float> qr = rec.q[static_cast<size_t>(il)];
      ref->kv().rope(il).apply(qr.data(), q, kH, d, rec.pos.data());
      for (int64_t h = 0; h < kHkv; ++h) {
        std::vector<float> K(static_cast<size_t>((sink + (e - s)) * d));
        if (sink > 0) ref->kv().read_keys(il, h, 0, sink, K.data());
        ref->kv().read_keys(il, h, s, e - s, K.data() + sink * d);
        const auto& R = rec.k[static_cast<size_t>(il)][static_cast<size_t>(h)];
        K.insert(K.end(), R.begin(), R.end());
        for (int64_t hq = h * g; hq < (h + 1) * g; ++hq)
          for (int64_t t = 0; t < q; ++t) {
            const int64_t nk = sink + (e - s) + t + 1;
            std::vector<double> a(static_cast<size_t>(nk));
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < nk; ++j) {
              double dot = 0;
              for (int64_t x = 0; x < d; ++x)
                dot += static_cast<double>(qr[static_cast<size_t>((t * kH + hq) * d + x)]) * K[static_cast<size_t>(j * d + x)];
              a[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(d));
              mx = std::max(mx, a[static_cast<size_t>(j)]);
            }
            for (double& x : a) sum += (x = std::exp(x - mx));
            for (int64_t j = s; j < e; ++j) {
              double& sc = score[static_cast<size_t>((il * kHkv + h) * n + j)];
              sc = std::max(sc, a[static_cast<size_t>(sink + j - s)] / sum);
            }
          }
      }
    }
  }
  const int64_t N = kL * kHkv * n, pruned = static_cast<int64_t>(std::floor(ratio * static_cast<double>(N) + 1e-9));
  std::vector<int64_t> order(static_cast<size_t>(N));
  for (int64_t f = 0; f < N; ++f) order[static_cast<size_t>(f)] = f;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)]; });
  order.resize(static_cast<size_t>(N - pruned));
  Kept k(kL, std::vector<std::vector<int32_t>>(kHkv));
  for (int64_t f : order)
    k[static_cast<size_t>(f / (kHkv * n))][static_cast<size_t>((f / n) % kHkv)].push_back(static_cast<int32_t>(f % n));
  for (auto& l : k)
    for (auto& h : l) std::sort(h.begin(), h.end());
  return k;
}

int64_t total(const Kept& k) {
  int64_t t = 0;
  for (const auto& l : k)
    for (const auto& h : l) t += static_cast<int64_t>(h.size());
  return t;
}

// The whole path: the context is decoded (query-agnostic part), the reconstruction passes run
// and leave the cache, the kept sets are the reference's, chunked and unchunked alike.
TEST(Kvzip, KeptSetsEqualTheReferenceInTheModel) {
  auto m = load_model();
  ASSERT_TRUE(m);
  const auto ids = prompt_ids("p3");  // 256 tokens
  const int64_t P = 256;
  for (int64_t chunk : {int64_t{64}, int64_t{2048}}) {
    const std::string spec = "kvzip:ratio=0.5,chunk_size=" + std::to_string(chunk);
    auto c = make_ctx(*m, spec);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->decode_context(ids).is_ok());
    // The reconstruction tokens are gone: the sequence, its end and every head's indices.
    EXPECT_EQ(c->n_past(), P);
    EXPECT_EQ(c->tokens(), ids);
    for (int64_t il = 0; il < kL; ++il) {
      EXPECT_EQ(c->kv().n_appended(il), P);
      for (int64_t h = 0; h < kHkv; ++h)
        if (c->kv().n_tokens(il, h) > 0) {
          EXPECT_LT(c->kv().seq_index(il, h)[c->kv().n_tokens(il, h) - 1], P);
        }
    }
    int64_t n_tokens = 0, n_passes = 0;
    const Kept want = kvzip_oracle(*m, ids, chunk, 0.5, &n_tokens, &n_passes);
    const Kept got = kept_of(*c);
    EXPECT_EQ(got, want) << spec;
    EXPECT_EQ(total(got), kL * kHkv * P / 2) << spec;  // the budget, over all layers and heads
    EXPECT_EQ(c->press_runner()->reconstruction_passes(), n_passes) << spec;
    EXPECT_EQ(c->press_runner()->reconstruction_tokens(), n_tokens) << spec;
    EXPECT_EQ(n_passes, chunk == 64 ? 4 : 1);
    bool uneven = false;  // head-wise and layer-wise budgets from one ranking
    for (const auto& l : got)
      for (const auto& h : l) uneven |= static_cast<int64_t>(h.size()) != P / 2;
    EXPECT_TRUE(uneven) << spec;
    // The question is appended whole after the compressed context.
    const std::vector<int32_t> question = {5, 17, 29, 41};
    ASSERT_TRUE(c->decode(question, Logits::kLast).is_ok());
    EXPECT_EQ(total(kept_of(*c)), total(got) + kL * kHkv * 4);
    for (int64_t v = 0; v < 512; ++v) ASSERT_TRUE(std::isfinite(c->logits(0)[v]));
  }
}

// One pass holds the whole context when it fits a chunk (chunk_size=0, or at least n): the
// same kept sets; smaller chunks score with other softmaxes and prompts (kvpress's chunking is
// part of its definition), so the kept sets differ.
TEST(Kvzip, ChunkingAsTheReferenceDefinesIt) {
  auto m = load_model();
  ASSERT_TRUE(m);
  const auto ids = prompt_ids("p3");
  Kept k0, kn, k64;
  for (auto [spec, out] : {std::pair<const char*, Kept*>{"kvzip:ratio=0.6,chunk_size=0", &k0},
                           {"kvzip:ratio=0.6,chunk_size=256", &kn},
                           {"kvzip:ratio=0.6,chunk_size=64", &k64}}) {
    auto c = make_ctx(*m, spec);
    ASSERT_TRUE(c->decode_context(ids).is_ok());
    *out = kept_of(*c);
    EXPECT_EQ(c->press_runner()->reconstruction_passes(), std::string(spec).find("64") != std::string::npos ? 4 : 1);
  }
  EXPECT_EQ(k0, kn);
  EXPECT_NE(k0, k64);
  EXPECT_EQ(total(k0), total(k64));
}

// Same input, same output: the kept sets and the logits after the question, also with more
// threads (the scores' max does not depend on the order the threads take the rows in).
TEST(Kvzip, Deterministic) {
  auto m = load_model();
  ASSERT_TRUE(m);
  const auto ids = prompt_ids("p2");
  const std::vector<int32_t> question = {7, 8, 9};
  std::vector<Kept> kept;
  std::vector<std::vector<float>> logits;
  for (int threads : {1, 1, 3}) {
    auto c = make_ctx(*m, "kvzip:ratio=0.7,chunk_size=50", threads);
    ASSERT_TRUE(c->decode_context(ids).is_ok());
    kept.push_back(kept_of(*c));
    ASSERT_TRUE(c->decode(question, Logits::kLast).is_ok());
    logits.emplace_back(c->logits(0), c->logits(0) + 512);
  }
  EXPECT_EQ(kept[0], kept[1]);
  EXPECT_EQ(kept[0], kept[2]);
  EXPECT_EQ(logits[0], logits[1]);
}

// Ratio 0 runs no reconstruction and leaves the cache whole; memory really goes at ratio 0.75;
// a reconstruction that does not fit the context is an error that says so.
TEST(Kvzip, IdentityMemoryAndErrors) {
  auto m = load_model();
  ASSERT_TRUE(m);
  const auto ids = prompt_ids("p3");
  auto id = make_ctx(*m, "kvzip:ratio=0");
  auto base = make_ctx(*m, "");
  ASSERT_TRUE(id->decode(ids, Logits::kLast).is_ok());
  ASSERT_TRUE(base->decode(ids, Logits::kLast).is_ok());
  EXPECT_EQ(id->press_runner()->reconstruction_passes(), 0);
  EXPECT_EQ(total(kept_of(*id)), kL * kHkv * 256);
  for (int64_t v = 0; v < 512; ++v) ASSERT_EQ(id->logits(0)[v], base->logits(0)[v]);
  auto c = make_ctx(*m, "kvzip:ratio=0.75");
  ASSERT_TRUE(c->decode_context(ids).is_ok());
  EXPECT_EQ(total(kept_of(*c)), kL * kHkv * 64);
  EXPECT_LT(c->kv().memory().in_use_bytes, base->kv().memory().in_use_bytes);
  auto small = make_ctx(*m, "kvzip:ratio=0.5", 1, 260);
  const Status st = small->decode_context(ids);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("reconstruction pass"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--ctx-size"), std::string::npos) << st.message();
  EXPECT_EQ(st.code(), ErrorCode::kContextFull);
  // A streaming backend evicts the cache's tokens: refused when the context is made.
  ContextParams cp{1024, 64, 1};
  cp.kv_press = "kvzip";
  cp.attn = "streaming";
  auto bad = Context::create(*m, cp);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("kvzip"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace lc
