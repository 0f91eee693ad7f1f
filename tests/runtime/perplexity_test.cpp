// Perplexity against llama.cpp's perplexity tool on stories260K (golden README, "Perplexity").
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/context.h"
#include "model/model.h"
#include "runtime/measure.h"

namespace lc {
namespace {

const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

TEST(Perplexity, MatchesLlamaCpp) {
  auto model = Model::load(kGolden + "models/stories260K.gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  std::ifstream in(kGolden + "prompts/ppl_text.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::ifstream jf(kGolden + "perplexity/stories260K_ppl.json");
  const auto gj = nlohmann::json::parse(jf);
  const auto ids = (*model)->tokenizer().encode(ss.str(), true, false);
  EXPECT_EQ(ids, gj["ids"].get<std::vector<int32_t>>());

  auto ctx = Context::create(**model, {128, 128, 2});
  ASSERT_TRUE(ctx.has_value());
  auto r = perplexity(**ctx, ids, 128);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto& main = gj["recomputed_from_llama_logits"]["main"];
  EXPECT_EQ(r->n_chunks, 16);
  EXPECT_EQ(r->n_scored, main["count"].get<int64_t>());
  EXPECT_NEAR(r->ppl, main["ppl"].get<double>(), 1e-4 * main["ppl"].get<double>());
  const auto chunk_ppl = main["chunk_ppl"].get<std::vector<double>>();
  ASSERT_EQ(r->chunk_ppl.size(), chunk_ppl.size());
  for (size_t i = 0; i < chunk_ppl.size(); ++i) EXPECT_NEAR(r->chunk_ppl[i], chunk_ppl[i], 1e-4 * chunk_ppl[i]);

  std::ifstream nf(kGolden + "perplexity/stories260K_ppl_nll.f64", std::ios::binary);
  std::vector<double> nll(1008);
  nf.read(reinterpret_cast<char*>(nll.data()), 1008 * 8);
  ASSERT_EQ(r->nll.size(), nll.size());
  double max_d = 0;
  for (size_t i = 0; i < nll.size(); ++i) max_d = std::max(max_d, std::fabs(r->nll[i] - nll[i]));
  EXPECT_LE(max_d, 1e-3);
}

TEST(Perplexity, TooShortTextIsAnError) {
  auto model = Model::load(kGolden + "models/stories260K.gguf");
  ASSERT_TRUE(model.has_value());
  auto ctx = Context::create(**model, {128, 128, 1});
  ASSERT_TRUE(ctx.has_value());
  std::vector<int32_t> ids(200, 5);
  auto r = perplexity(**ctx, ids, 128);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("need at least 2 * 128"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace lc
