// Context parallelism over real MPI processes: this program runs under `mpirun -np N` (ctest
// starts it with 2 and with 4 ranks), every rank running every test. The oracles are llama.cpp's
// logits and greedy tokens (tests/data/golden) and a one-process run of the same model, which
// every rank computes by itself; never the distributed run's own earlier output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/context_parallel.h"
#include "model/context.h"
#include "model/model.h"
#include "tasks/tasks.h"
#include "tokenizer/tokenizer.h"

namespace lc::dist {
namespace {

Comm* g_comm = nullptr;
const std::string kGolden = std::string(LONGCTX_TEST_DATA) + "/golden/";

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  in.seekg(0, std::ios::end);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

int32_t argmax(const float* x, int64_t n) { return static_cast<int32_t>(std::max_element(x, x + n) - x); }

ContextParams params(int64_t n_batch, const std::string& attn = "") {
  ContextParams p;
  p.n_ctx = 0;
  p.n_batch = n_batch;
  p.n_threads = 1;  // ranks share the machine's cores
  p.attn = attn;
  return p;
}

struct Distributed {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<ContextParallel> cp;
};

Distributed make_distributed(const Model& m, const std::string& mode, int64_t n_batch, const std::string& attn = "") {
  Distributed d;
  auto ctx = Context::create(m, params(n_batch, attn));
  EXPECT_TRUE(ctx.has_value()) << (ctx ? "" : ctx.error().message);
  d.ctx = std::move(*ctx);
  auto p = parse_cp(mode);
  EXPECT_TRUE(p.has_value()) << (p ? "" : p.error().message);
  auto cp = ContextParallel::create(*g_comm, *p, *d.ctx);
  EXPECT_TRUE(cp.has_value()) << (cp ? "" : cp.error().message);
  d.cp = std::move(*cp);
  return d;
}

// Greedy tokens after a prompt; the context is cleared first.
std::vector<int32_t> greedy(Context& ctx, const std::vector<int32_t>& prompt, int64_t n) {
  ctx.clear();
  std::vector<int32_t> out;
  Status st = ctx.decode(prompt, Logits::kLast);
  EXPECT_TRUE(st.is_ok()) << st.message();
  const int64_t V = ctx.model().hparams().n_vocab;
  for (int64_t i = 0; i < n && st; ++i) {
    out.push_back(argmax(ctx.logits(0), V));
    st = ctx.decode(std::span<const int32_t>(&out.back(), 1), Logits::kLast);
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  return out;
}

// This rank's tokens of an n-token ring prompt under a split, written from the split's
// definition: contiguous, the r-th of N runs; zigzag, pieces r and 2N - 1 - r of 2N.
std::vector<int64_t> ring_shard(int64_t n, bool zigzag) {
  const int64_t N = g_comm->size(), r = g_comm->rank();
  std::vector<int64_t> ids;
  auto piece = [&](int64_t j, int64_t pieces) {
    for (int64_t i = n * j / pieces; i < n * (j + 1) / pieces; ++i) ids.push_back(i);
  };
  if (zigzag) {
    piece(r, 2 * N);
    piece(2 * N - 1 - r, 2 * N);
  } else {
    piece(r, N);
  }
  return ids;
}

class RingGolden : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

// Ring prefill of llama.cpp's 256-token prompt P3, under each split: the last token's logits
// match llama.cpp's (the golden F32 tolerance) and the one-process run's; then greedy decoding
// after P1 gives llama.cpp's 64 tokens.
TEST_P(RingGolden, LogitsAndGreedyTokensMatchLlamaCppAndOneProcess) {
  const std::string name = std::get<0>(GetParam()), mode = std::get<1>(GetParam());
  const bool zigzag = mode.find("contiguous") == std::string::npos;
  auto model = Model::load(kGolden + "models/" + name + ".gguf");
  ASSERT_TRUE(model.has_value()) << model.error().message;
  const auto cj = read_json(kGolden + "cases/" + name + "/case.json");
  const auto p3 = cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();
  const int64_t V = (*model)->hparams().n_vocab;
  Distributed d = make_distributed(**model, mode, 512);
  ASSERT_TRUE(d.ctx->decode(p3, Logits::kLast).is_ok());
  const auto ref = read_f32(kGolden + "cases/" + name + "/logits_p3.f32");
  ASSERT_EQ(ref.size(), p3.size() * static_cast<size_t>(V));
  EXPECT_LE(max_abs_diff(d.ctx->logits(0), ref.data() + (p3.size() - 1) * V, V), 1e-3) << name;
  auto one = Context::create(**model, params(512));
  ASSERT_TRUE(one.has_value());
  ASSERT_TRUE((*one)->decode(p3, Logits::kLast).is_ok());
  EXPECT_LE(max_abs_diff(d.ctx->logits(0), (*one)->logits(0), V), 1e-4) << name;
  // This rank's cache holds its shard only, in the order it evaluated it.
  const auto shard = ring_shard(static_cast<int64_t>(p3.size()), zigzag);
  const CpStats& cs = d.cp->stats();
  EXPECT_EQ(cs.shard_tokens(), static_cast<int64_t>(shard.size()));
  ASSERT_EQ(d.ctx->kv().n_tokens(0, 0), static_cast<int64_t>(shard.size()));
  std::vector<int32_t> want_tokens;
  for (int64_t i : shard) want_tokens.push_back(p3[static_cast<size_t>(i)]);
  EXPECT_EQ(d.ctx->tokens(), want_tokens);

  const auto p1 = cj["prompts"]["p1"]["ids"].get<std::vector<int32_t>>();
  const auto gold = cj["greedy"]["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(greedy(*d.ctx, p1, static_cast<int64_t>(gold.size())), gold) << name;
  // Generated tokens are stored by the last rank only.
  const int64_t stored = g_comm->rank() == g_comm->size() - 1 ? static_cast<int64_t>(gold.size()) : 0;
  EXPECT_EQ(d.ctx->kv().n_tokens(0, 0), static_cast<int64_t>(ring_shard(static_cast<int64_t>(p1.size()), zigzag).size()) + stored);
}

INSTANTIATE_TEST_SUITE_P(Models, RingGolden,
                         ::testing::Combine(::testing::Values("llama_gqa_f32", "qwen2_bias_f32", "qwen3_qknorm_f32"),
                                            ::testing::Values("ring", "ring:split=contiguous")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) +
                                  (std::string(std::get<1>(info.param)) == "ring" ? "_zigzag" : "_contiguous");
                         });

const std::string kProjectModel = std::string(LONGCTX_MODELS) + "/longctx-2l.gguf";

// A long prompt for the project's model: text of its own curriculum's kind, tokenised.
std::vector<int32_t> project_prompt(const Model& m, int64_t length, uint64_t seed, std::vector<std::string>* answers) {
  tasks::PromptRenderer r(m.tokenizer(), detect_chat_template(m.file(), m.tokenizer()));
  tasks::SampleSpec spec;
  spec.task = "niah_single_1";
  spec.length = length;
  spec.depth = 50;
  spec.seed = seed;
  auto s = tasks::make_sample(r, spec);
  EXPECT_TRUE(s.has_value()) << (s ? "" : s.error().message);
  if (answers) *answers = s->answers;
  return s->tokens;
}

// The project's model runs with its default attention (fixed distance) and logn scaling: ring
// attention is exact there too, at a length where most keys are far.
TEST(RingProjectModel, EqualsOneProcessAtTwoThousandTokens) {
  auto model = Model::load(kProjectModel);
  ASSERT_TRUE(model.has_value()) << model.error().message;
  const auto prompt = project_prompt(**model, 2048, 7, nullptr);
  const int64_t V = (*model)->hparams().n_vocab;
  Distributed d = make_distributed(**model, "ring", 2048);
  auto one = Context::create(**model, params(512));
  ASSERT_TRUE(one.has_value());
  const auto a = greedy(*d.ctx, prompt, 12);
  const auto b = greedy(**one, prompt, 12);
  EXPECT_EQ(a, b);
  EXPECT_LE(max_abs_diff(d.ctx->logits(0), (*one)->logits(0), V), 1e-3);
  EXPECT_NE(d.ctx->attention().spec().find("fixed"), std::string::npos) << d.ctx->attention().spec();
}

// llama.cpp's 256-token prompt P3 on the GQA golden model, and what one process makes of it: 8
// greedy tokens and the logits after the last.
struct OneProcessP3 {
  std::unique_ptr<Model> model;
  std::vector<int32_t> p3, want;
  std::vector<float> logits;
  int64_t V = 0;
};

OneProcessP3 one_process_p3() {
  OneProcessP3 r;
  auto model = Model::load(kGolden + "models/llama_gqa_f32.gguf");
  EXPECT_TRUE(model.has_value());
  if (!model) return r;
  r.model = std::move(*model);
  const auto cj = read_json(kGolden + "cases/llama_gqa_f32/case.json");
  r.p3 = cj["prompts"]["p3"]["ids"].get<std::vector<int32_t>>();
  r.V = r.model->hparams().n_vocab;
  auto one = Context::create(*r.model, params(512));
  EXPECT_TRUE(one.has_value());
  if (!one) return r;
  r.want = greedy(**one, r.p3, 8);
  r.logits.assign((*one)->logits(0), (*one)->logits(0) + r.V);
  return r;
}

// Star Attention whose anchor is every token before a rank's block reads exactly what one process
// reads: its logits are the one-process logits (a check of the phases, the positions, the anchor's
// removal and the merge). With the paper's anchor (the first block) it is an approximation from
// 3 ranks on.
TEST(Star, WholePrefixAnchorIsExactAndFirstBlockAnchorIsNot) {
  const OneProcessP3 o = one_process_p3();
  ASSERT_TRUE(o.model && !o.logits.empty());
  {
    Distributed d = make_distributed(*o.model, "star:anchor=100000", 64);
    d.cp->set_query_tokens(16);
    EXPECT_EQ(greedy(*d.ctx, o.p3, 8), o.want);
    EXPECT_LE(max_abs_diff(d.ctx->logits(0), o.logits.data(), o.V), 1e-3);
    // The anchor left every cache but the first: each holds its block (the last rank also the
    // query and the generated tokens).
    const CpStats& cs = d.cp->stats();
    const int64_t extra = g_comm->rank() == g_comm->size() - 1 ? 16 + 8 : 0;
    EXPECT_EQ(d.ctx->kv().n_tokens(0, 0), cs.shard_end - cs.shard_first + extra);
  }
  {
    Distributed d = make_distributed(*o.model, "star", 64);
    d.cp->set_query_tokens(16);
    greedy(*d.ctx, o.p3, 8);
    const double diff = max_abs_diff(d.ctx->logits(0), o.logits.data(), o.V);
    if (g_comm->size() == 2)
      EXPECT_LE(diff, 1e-3);  // rank 1's anchor, the first block, is all that precedes its block
    else
      EXPECT_GT(diff, 1e-3);
  }
}

// Star Attention with the paper's block size (block=B tokens, several blocks per rank: 6 blocks
// of 40 of P3's 240 context tokens give 3 per rank on 2 ranks, 1 or 2 on 4). Each block is
// evaluated after its anchor with the rank's earlier blocks set aside. With whole-prefix
// anchors every block reads exactly what one process reads, so the logits and greedy tokens are
// the one-process ones (an earlier block left visible, or not brought back for the query, would
// change them). With the first block as the anchor it is an approximation. Either way each
// rank's cache holds its own blocks only, and its attended pairs are, per block,
// T (T + 1) / 2 with T = anchor + block tokens, from the definition.
TEST(Star, SeveralBlocksPerRankAreEachEvaluatedAloneAfterTheAnchor) {
  const OneProcessP3 o = one_process_p3();
  ASSERT_TRUE(o.model && !o.logits.empty());
  const int64_t N = g_comm->size(), r = g_comm->rank(), D = 240, B = 40, nb = 6;
  const int64_t j0 = nb * r / N, j1 = nb * (r + 1) / N;
  for (const std::string mode : {"star:anchor=100000,block=40", "star:anchor=100000,blocks=6", "star:block=40",
                                 "star:blocks=6"}) {
    const bool whole = mode.find("anchor") != std::string::npos;
    Distributed d = make_distributed(*o.model, mode, 64);
    d.cp->set_query_tokens(16);
    const auto got = greedy(*d.ctx, o.p3, 8);
    const double diff = max_abs_diff(d.ctx->logits(0), o.logits.data(), o.V);
    if (whole) {
      EXPECT_EQ(got, o.want) << mode;
      EXPECT_LE(diff, 1e-3) << mode;
    } else {
      EXPECT_GT(diff, 1e-3) << mode;
    }
    const CpStats& cs = d.cp->stats();
    EXPECT_EQ(cs.shard_first, j0 * B);
    EXPECT_EQ(cs.shard_end, std::min(j1 * B, D));
    EXPECT_EQ(cs.star_blocks, j1 - j0);
    int64_t pairs = 0;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t anchor = j == 0 ? 0 : whole ? j * B : B;
      const int64_t T = anchor + std::min(B, D - j * B);
      pairs += T * (T + 1) / 2;
    }
    EXPECT_EQ(cs.prefill_pairs, pairs);
    const int64_t extra = r == N - 1 ? 16 + 8 : 0;
    EXPECT_EQ(d.ctx->kv().n_tokens(0, 0), cs.shard_end - cs.shard_first + extra);
  }
  // Fewer blocks than ranks is an error that says so.
  Distributed d = make_distributed(*o.model, g_comm->size() == 2 ? "star:block=1000" : "star:blocks=3", 64);
  d.cp->set_query_tokens(16);
  const Status st = d.ctx->decode(o.p3, Logits::kLast);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("fewer than the"), std::string::npos) << st.message();
}

// Star Attention on the project's model finds a needle in a 16K-token prompt (16 times its
// training window), each rank holding a quarter or half of the context.
TEST(Star, FindsTheNeedleAtSixteenThousandTokens) {
  auto model = Model::load(kProjectModel);
  ASSERT_TRUE(model.has_value());
  std::vector<std::string> answers;
  const auto prompt = project_prompt(**model, 16384, 11, &answers);
  ASSERT_FALSE(answers.empty());
  // One block per rank, and the paper's configuration of blocks of a quarter of the context
  // (several per rank on 2 ranks).
  for (const char* mode : {"star", "star:block=4088"}) {
    Distributed d = make_distributed(**model, mode, 512);
    d.cp->set_query_tokens(32);  // the question and the answer prefix
    const auto out = greedy(*d.ctx, prompt, 12);
    const std::string text = (*model)->tokenizer().decode(out);
    EXPECT_NE(text.find(answers[0]), std::string::npos)
        << mode << ": answer '" << answers[0] << "', got '" << text << "'";
  }
}

// Quest on every rank's shard (tests/attention/detached_test.cpp checks the per-shard choice
// against the paper's rule in double). Here, through the model and MPI: with pages of one token
// and a budget over every shard, Quest reads every key, so the ring run equals the one-process
// dense run; with a small budget each rank reads a few pages of its shard, the decoded logits
// leave the dense ones, and every rank still holds the same logits and tokens.
TEST(RingQuest, EveryPageEqualsDenseAndFewPagesAreSparse) {
  const OneProcessP3 o = one_process_p3();
  ASSERT_TRUE(o.model && !o.logits.empty());
  for (const char* spec : {"quest:budget=100000,page=1,dense_layers=0", "quest_fast:budget=100000,page=1,dense_layers=0"}) {
    Distributed d = make_distributed(*o.model, "ring", 256, spec);
    EXPECT_EQ(greedy(*d.ctx, o.p3, 8), o.want) << spec;
    EXPECT_LE(max_abs_diff(d.ctx->logits(0), o.logits.data(), o.V), 1e-3) << spec;
  }
  Distributed d = make_distributed(*o.model, "ring", 256, "quest:budget=16,page=4,dense_layers=0");
  const auto got = greedy(*d.ctx, o.p3, 8);
  EXPECT_GT(max_abs_diff(d.ctx->logits(0), o.logits.data(), o.V), 1e-3) << "a budget of 4 pages per shard must read less";
  // Every rank decoded the same tokens from the same logits (rank 0's, broadcast).
  std::vector<float> logits0(d.ctx->logits(0), d.ctx->logits(0) + o.V);
  ASSERT_TRUE(g_comm->bcast(logits0.data(), logits0.size() * sizeof(float), 0).is_ok());
  EXPECT_EQ(max_abs_diff(d.ctx->logits(0), logits0.data(), o.V), 0.0);
  std::vector<int32_t> tokens0 = got;
  ASSERT_TRUE(g_comm->bcast(tokens0.data(), tokens0.size() * sizeof(int32_t), 0).is_ok());
  EXPECT_EQ(got, tokens0);
}

// The ranks' shares of the ring prefill's attention, gathered: every causal (query, key) pair of
// the prompt is attended by exactly one rank under either split (n (n + 1) / 2 in all). With
// contiguous shards the last rank does the most (2N - 1 times the first's); zigzag gives every
// rank the same share when the pieces are equal.
TEST(RingSplit, ZigzagGivesEveryRankTheSameAttentionWork) {
  const OneProcessP3 o = one_process_p3();
  ASSERT_TRUE(o.model && !o.logits.empty());
  const int64_t n = static_cast<int64_t>(o.p3.size()), N = g_comm->size();
  ASSERT_EQ(n % (2 * N), 0) << "equal pieces";
  for (const char* mode : {"ring", "ring:split=contiguous"}) {
    Distributed d = make_distributed(*o.model, mode, 512);
    EXPECT_EQ(greedy(*d.ctx, o.p3, 8), o.want) << mode;
    EXPECT_LE(max_abs_diff(d.ctx->logits(0), o.logits.data(), o.V), 1e-3) << mode;
    const int64_t mine = d.cp->stats().prefill_pairs;
    std::vector<int64_t> all(static_cast<size_t>(N));
    ASSERT_TRUE(g_comm->allgather(&mine, sizeof(mine), all.data()).is_ok());
    int64_t sum = 0;
    for (int64_t p : all) sum += p;
    EXPECT_EQ(sum, n * (n + 1) / 2) << mode;
    const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
    if (std::string(mode) == "ring") {
      EXPECT_EQ(*lo, *hi) << mode;
    } else {
      const int64_t s = n / N;  // rank r: its own s (s + 1) / 2 and r blocks of s x s
      EXPECT_EQ(all.front(), s * (s + 1) / 2);
      EXPECT_EQ(all.back(), s * (s + 1) / 2 + (N - 1) * s * s);
    }
  }
}

TEST(Errors, ClearMessages) {
  auto model = Model::load(kGolden + "models/llama_gqa_f32.gguf");
  ASSERT_TRUE(model.has_value());
  {
    Distributed d = make_distributed(**model, "ring", 64);
    const std::vector<int32_t> one_token{1};
    const Status st = d.ctx->decode(one_token, Logits::kLast);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("fewer than the"), std::string::npos) << st.message();
    // zigzag needs two tokens per rank; contiguous one.
    const std::vector<int32_t> few(static_cast<size_t>(2 * g_comm->size() - 1), 1);
    const Status st2 = d.ctx->decode(few, Logits::kLast);
    ASSERT_FALSE(st2.is_ok());
    EXPECT_NE(st2.message().find("zigzag"), std::string::npos) << st2.message();
    Distributed c = make_distributed(**model, "ring:split=contiguous", 64);
    EXPECT_TRUE(c.ctx->decode(few, Logits::kLast).is_ok());
  }
  {
    auto ctx = Context::create(**model, params(64, "dssa"));
    ASSERT_TRUE(ctx.has_value());
    auto cp = ContextParallel::create(*g_comm, *parse_cp("ring"), **ctx);
    ASSERT_FALSE(cp.has_value());
    EXPECT_NE(cp.error().message.find("use dense, fixed, quest or quest_fast"), std::string::npos)
        << cp.error().message;
  }
  {
    ContextParams p = params(64);
    p.kv_press = "knorm:ratio=0.5";
    auto ctx = Context::create(**model, p);
    ASSERT_TRUE(ctx.has_value()) << ctx.error().message;
    auto cp = ContextParallel::create(*g_comm, *parse_cp("star"), **ctx);
    ASSERT_FALSE(cp.has_value());
    EXPECT_NE(cp.error().message.find("press"), std::string::npos) << cp.error().message;
  }
  EXPECT_FALSE(parse_cp("tree").has_value());
  EXPECT_FALSE(parse_cp("ring:anchor=4").has_value());
  EXPECT_NE(parse_cp("ring:split=striped").error().message.find("zigzag or contiguous"), std::string::npos);
  EXPECT_FALSE(parse_cp("star:split=zigzag").has_value());
  EXPECT_NE(parse_cp("star:anchor=x").error().message.find("anchor"), std::string::npos);
  EXPECT_NE(parse_cp("star:block=-1").error().message.find("block"), std::string::npos);
  EXPECT_EQ(parse_cp("star:block=4096")->spec(), "star:block=4096");
  EXPECT_EQ(parse_cp("star:block=4096,anchor=8")->spec(), "star:anchor=8,block=4096");
  EXPECT_EQ(parse_cp("star:blocks=4")->spec(), "star:blocks=4");
  EXPECT_NE(parse_cp("star:block=8,blocks=4").error().message.find("not both"), std::string::npos);
}

}  // namespace
}  // namespace lc::dist

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = lc::dist::Comm::init(&argc, &argv, 300);
  if (!comm) {
    std::fprintf(stderr, "%s\n", comm.error().message.c_str());
    return 1;
  }
  lc::dist::g_comm = comm->get();
  // Every rank runs every test (they communicate); rank 0 prints, the others report failures only.
  if ((*comm)->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  auto failed = (*comm)->sum(rc != 0 ? 1.0 : 0.0);
  if (!failed) (*comm)->abort(failed.error().message);
  if (*failed > 0 && (*comm)->rank() == 0) std::fprintf(stderr, "test_dist: %.0f rank(s) failed\n", *failed);
  return *failed > 0 ? 1 : 0;
}
