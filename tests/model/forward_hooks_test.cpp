// The forward hooks (model/forward_hooks.h): what a hook sees, and what the Context guarantees
// around SpecKV's scratch evaluation and a change of attention backend.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/context.h"
#include "model/model.h"
#include "model/query_window.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

std::vector<int32_t> prompt_ids() {
  std::ifstream in(kGolden + "cases/llama_gqa_f32/case.json");
  const auto cj = nlohmann::json::parse(in);
  return cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();  // 256 tokens
}

std::unique_ptr<Model> load_model() {
  auto m = Model::load(kGolden + "models/llama_gqa_f32.gguf");
  EXPECT_TRUE(m.has_value());
  return m ? std::move(*m) : nullptr;
}

std::unique_ptr<Context> make_ctx(const Model& m, int64_t n_batch, const std::string& attn = "",
                                  int64_t kv_budget = 0) {
  ContextParams cp{512, n_batch, 1};
  cp.attn = attn;
  cp.kv_budget = kv_budget;
  auto c = Context::create(m, cp);
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

// Layer 0's query of a token, from the weights in double: W_q . rmsnorm(embedding) (the test
// model is f32, has no q bias or q norm, and no logit scaling).
std::vector<double> layer0_query(const Model& m, int32_t tok) {
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_embd, Q = hp.n_head * hp.head_dim;
  const float* e = reinterpret_cast<const float*>(m.tok_embd().row(tok));
  double ss = 0;
  for (int64_t i = 0; i < E; ++i) ss += static_cast<double>(e[i]) * e[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(E) + hp.rms_eps);
  const LayerWeights& L = m.layers()[0];
  std::vector<double> x(static_cast<size_t>(E)), q(static_cast<size_t>(Q), 0.0);
  for (int64_t i = 0; i < E; ++i) x[static_cast<size_t>(i)] = e[i] * inv * L.attn_norm[i];
  for (int64_t r = 0; r < Q; ++r) {
    const float* w = reinterpret_cast<const float*>(L.wq.row(r));
    for (int64_t i = 0; i < E; ++i) q[static_cast<size_t>(r)] += w[i] * x[static_cast<size_t>(i)];
  }
  return q;
}

// A recorder holds the queries of the last W tokens, oldest first, with their positions,
// whatever the chunking of the prompt.
TEST(ForwardHooks, QueryWindowHoldsTheLastQueriesWhateverTheChunking) {
  auto m = load_model();
  ASSERT_TRUE(m);
  const HParams& hp = m->hparams();
  ASSERT_EQ(hp.logn_orig, 0);
  const auto ids = prompt_ids();
  const int64_t P = static_cast<int64_t>(ids.size()), W = 20, row = hp.n_head * hp.head_dim;
  for (int64_t n_batch : {1, 7, 64, 512}) {
    auto c = make_ctx(*m, n_batch);
    QueryRecorder rec(hp.n_layer, row, W);
    c->attach_hooks(&rec);
    ASSERT_TRUE(c->decode(ids, Logits::kLast).is_ok());
    const QueryWindow& w = rec.window();
    ASSERT_EQ(w.size(), W) << n_batch;
    for (int64_t t = 0; t < W; ++t) {
      const int64_t tok = P - W + t;
      EXPECT_EQ(w.positions(W)[t], tok) << n_batch;
      const auto ref = layer0_query(*m, ids[static_cast<size_t>(tok)]);
      for (int64_t i = 0; i < row; ++i)
        ASSERT_NEAR(w.queries(0, W)[t * row + i], ref[static_cast<size_t>(i)], 1e-4 * (1 + std::fabs(ref[static_cast<size_t>(i)])))
            << n_batch << " " << t << " " << i;
    }
    // A truncate restarts the window; a detached hook sees nothing more.
    c->truncate(100);
    EXPECT_EQ(w.size(), 0);
    c->detach_hooks(&rec);
    ASSERT_TRUE(c->decode(std::span<const int32_t>(ids.data() + 100, 10), Logits::kLast).is_ok());
    EXPECT_EQ(w.size(), 0);
  }
}

// evaluate_scratch runs tokens through the model for the hooks and leaves the sequence as it
// was: the next token's logits are those of a context that never saw them.
TEST(ForwardHooks, ScratchTokensLeaveTheCacheAsItWas) {
  auto m = load_model();
  ASSERT_TRUE(m);
  const HParams& hp = m->hparams();
  const auto ids = prompt_ids();
  const std::span<const int32_t> prompt(ids.data(), 200), scratch(ids.data() + 200, 30);
  auto c = make_ctx(*m, 64);
  auto plain = make_ctx(*m, 64);
  QueryRecorder rec(hp.n_layer, hp.n_head * hp.head_dim, 40);
  c->attach_hooks(&rec);
  ASSERT_TRUE(c->decode(prompt, Logits::kLast).is_ok());
  ASSERT_TRUE(plain->decode(prompt, Logits::kLast).is_ok());
  ASSERT_TRUE(c->evaluate_scratch(scratch).is_ok());
  EXPECT_EQ(c->n_past(), 200);
  EXPECT_EQ(c->tokens().size(), 200u);
  for (int64_t il = 0; il < hp.n_layer; ++il) EXPECT_EQ(c->kv().n_appended(il), 200);
  // The hooks saw the scratch tokens' queries, at the positions after the prompt.
  EXPECT_EQ(rec.window().size(), 40);
  EXPECT_EQ(rec.window().positions(40)[39], 229);
  const int32_t next = ids[230];
  ASSERT_TRUE(c->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
  ASSERT_TRUE(plain->decode(std::span<const int32_t>(&next, 1), Logits::kLast).is_ok());
  for (int64_t v = 0; v < hp.n_vocab; ++v) ASSERT_EQ(c->logits(0)[v], plain->logits(0)[v]) << v;
  // Tokens beyond the context: an error, the sequence unchanged.
  std::vector<int32_t> big(400, ids[0]);
  EXPECT_FALSE(c->evaluate_scratch(big).is_ok());
  EXPECT_EQ(c->n_past(), 201);
}

// A backend that evicts installs an evictor in the cache; replacing it with one that does not
// must take the evictor away too (it would call into the destroyed backend). Over the budget,
// the dense backend then fails with a clear error.
TEST(ForwardHooks, ReplacedBackendTakesItsEvictorAway) {
  auto m = load_model();
  ASSERT_TRUE(m);
  const auto ids = prompt_ids();
  // 4 layers x 2 KV heads x 16 dims x (k + v) x 4 bytes = 1 KiB a token; blocks of 64 tokens.
  auto c = make_ctx(*m, 64, "streaming:sinks=4,window=60", 64 * 1024 * 2);
  ASSERT_TRUE(c->decode(std::span<const int32_t>(ids.data(), 128), Logits::kLast).is_ok());
  ASSERT_TRUE(c->set_attention("dense").is_ok());
  Status st = c->decode(std::span<const int32_t>(ids.data() + 128, 128), Logits::kLast);
  EXPECT_FALSE(st.is_ok());
}

}  // namespace
}  // namespace lc
