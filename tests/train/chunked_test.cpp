// Chunk-recurrent training (chunked.h) against the whole-window model: the same loss and the
// same gradient of every parameter, in double to 1e-9 and in float to float tolerance, for chunk
// sizes from 1 to the whole sequence, pages that do not line up with chunks, GQA and MHA, tied
// and separate outputs, and ignored targets. Its activation memory does not grow with the
// sequence: only the K/V pool does, by its per-token cost.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "train/chunked.h"
#include "train/rng.h"
#include "train/trainer.h"
#include "train/transformer.h"

namespace lc::train {
namespace {

ModelConfig small_config(bool tied, int64_t n_head_kv, int64_t n_ctx) {
  ModelConfig c;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_head_kv = n_head_kv;
  c.n_ff = 24;
  c.n_vocab = 23;
  c.n_ctx = n_ctx;
  c.rope_base = 100.0f;
  c.tied = tied;
  return c;
}

// Larger than the GPT-2 init so that attention is far from uniform and every path carries
// signal; norm weights away from 1.
template <class T>
void perturb(Transformer<T>& m, uint64_t seed) {
  m.init(seed);
  Rng r(seed + 1);
  for (size_t i = 0; i < m.n_params(); ++i) {
    T& p = m.params()[i];
    p = p == T(1) ? T(1) + static_cast<T>(0.3 * r.normal()) : p * T(12);
  }
}

struct Sequence {
  std::vector<int32_t> tokens, targets;
};

Sequence make_sequence(int64_t n, int64_t vocab, uint64_t seed, bool some_ignored) {
  Rng r(seed);
  Sequence s;
  for (int64_t t = 0; t < n; ++t) s.tokens.push_back(static_cast<int32_t>(r.next() % static_cast<uint64_t>(vocab)));
  for (int64_t t = 0; t < n; ++t) {
    const bool ignore = some_ignored && (t % 3 == 1 || (t >= n / 2 && t < n / 2 + 5));
    s.targets.push_back(ignore ? -1 : static_cast<int32_t>(r.next() % static_cast<uint64_t>(vocab)));
  }
  return s;
}

template <class T>
struct Result {
  double loss = 0;
  int64_t scored = 0;
  std::vector<T> grads;
};

template <class T>
Result<T> whole(Transformer<T>& m, const Sequence& s, T scale, ThreadPool& pool) {
  m.zero_grads();
  Result<T> r;
  r.loss = m.forward(s.tokens.data(), s.targets.data(), static_cast<int64_t>(s.tokens.size()), pool);
  r.scored = m.n_targets();
  m.backward(scale, pool);
  r.grads.assign(m.grads(), m.grads() + m.n_params());
  return r;
}

template <class T>
Result<T> chunked(Transformer<T>& m, const Sequence& s, int64_t chunk, int64_t page, T scale, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  auto cr = ChunkRecurrent<T>::create(m, chunk, n, page);
  EXPECT_TRUE(cr) << cr.error().message;
  if (!cr) return {};
  m.zero_grads();
  Result<T> r;
  r.loss = (*cr)->forward(s.tokens.data(), s.targets.data(), n, pool);
  r.scored = (*cr)->n_targets();
  (*cr)->backward(scale, pool);
  r.grads.assign(m.grads(), m.grads() + m.n_params());
  return r;
}

template <class T>
void expect_same(const Result<T>& want, const Result<T>& got, double rtol, const std::string& what) {
  EXPECT_EQ(got.scored, want.scored) << what;
  EXPECT_NEAR(got.loss, want.loss, rtol * std::fabs(want.loss)) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  double max_abs = 0;
  for (T g : want.grads) max_abs = std::max(max_abs, std::fabs(static_cast<double>(g)));
  ASSERT_GT(max_abs, 1e-3) << what;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got.grads[i]) - static_cast<double>(want.grads[i]));
    worst = std::max(worst, d);
    if (d > rtol * max_abs && ++bad <= 5)
      ADD_FAILURE() << what << ": parameter " << i << " chunked " << got.grads[i] << " whole " << want.grads[i];
  }
  EXPECT_EQ(bad, 0) << what << ": worst difference " << worst << " of max |g| " << max_abs;
}

// Double: chunked == whole to 1e-9 of the largest gradient, for every chunk size that matters.
void check_double(bool tied, int64_t n_head_kv, bool some_ignored, int n_threads) {
  const int64_t n = 70;  // 2 query blocks (64 + 6) when the chunk is the whole sequence
  ThreadPool pool(n_threads);
  auto mm = Transformer<double>::create(small_config(tied, n_head_kv, n), n);
  ASSERT_TRUE(mm) << mm.error().message;
  Transformer<double>& m = **mm;
  perturb(m, 11);
  const Sequence s = make_sequence(n, m.config().n_vocab, 5, some_ignored);
  const double scale = 1.0 / 70;
  const Result<double> want = whole(m, s, scale, pool);
  ASSERT_GT(want.scored, 0);
  // chunk 1 (every token its own chunk), 7 (a non-divisor of 70), 32, 40 and 66 (chunks across
  // page and query-block boundaries), 70 (one chunk); pages of 5 (not aligned to chunks) and 64.
  for (int64_t chunk : {1, 7, 32, 40, 66, 70})
    for (int64_t page : {5, 64}) {
      const std::string what = "chunk " + std::to_string(chunk) + " page " + std::to_string(page);
      expect_same(want, chunked(m, s, chunk, page, scale, pool), 1e-9, what);
    }
}

TEST(ChunkRecurrent, DoubleTiedGqaEqualsWhole) { check_double(true, 2, false, 2); }
TEST(ChunkRecurrent, DoubleSeparateMhaEqualsWhole) { check_double(false, 4, false, 3); }
TEST(ChunkRecurrent, DoubleIgnoredTargetsEqualsWhole) { check_double(true, 1, true, 2); }
TEST(ChunkRecurrent, DoubleSeparateGqaIgnoredTargetsOneThread) { check_double(false, 2, true, 1); }

// Float (sgemm, the inference kernels' exp): chunked == whole within float rounding.
TEST(ChunkRecurrent, FloatEqualsWhole) {
  const int64_t n = 100;
  ThreadPool pool(2);
  for (bool tied : {true, false}) {
    ModelConfig c = small_config(tied, tied ? 2 : 4, n);
    c.n_embd = 32;
    c.n_ff = 64;
    auto mm = Transformer<float>::create(c, n);
    ASSERT_TRUE(mm) << mm.error().message;
    Transformer<float>& m = **mm;
    m.init(3);
    const Sequence s = make_sequence(n, c.n_vocab, 9, !tied);
    const Result<float> want = whole(m, s, 1.0f / n, pool);
    for (int64_t chunk : {1, 16, 37, 100}) {
      const std::string what = std::string(tied ? "tied" : "separate") + " chunk " + std::to_string(chunk);
      expect_same(want, chunked(m, s, chunk, 16, 1.0f / n, pool), 2e-4, what);
    }
  }
}

// Sequences shorter than the longest, one after another through one instance: the pool is
// reused, the results still equal the whole model's.
TEST(ChunkRecurrent, ReusedForSeveralLengths) {
  ThreadPool pool(2);
  const int64_t max_n = 50;
  auto mm = Transformer<double>::create(small_config(true, 2, max_n), max_n);
  ASSERT_TRUE(mm);
  Transformer<double>& m = **mm;
  perturb(m, 21);
  auto cr = ChunkRecurrent<double>::create(m, 9, max_n, 8);
  ASSERT_TRUE(cr) << cr.error().message;
  for (int64_t n : {50, 13, 1, 50, 31}) {
    const Sequence s = make_sequence(n, m.config().n_vocab, static_cast<uint64_t>(n), true);
    Sequence t = s;
    if (n == 1) t.targets[0] = 3;  // a lone ignored target would score nothing
    const Result<double> want = whole(m, t, 0.5, pool);
    m.zero_grads();
    Result<double> got;
    got.loss = (*cr)->forward(t.tokens.data(), t.targets.data(), n, pool);
    got.scored = (*cr)->n_targets();
    (*cr)->backward(0.5, pool);
    got.grads.assign(m.grads(), m.grads() + m.n_params());
    expect_same(want, got, 1e-9, "n " + std::to_string(n));
    EXPECT_EQ((*cr)->kv().n_tokens(), n);
  }
  // Pages for 50 tokens, 2 layers, values and gradients: allocated once, then reused.
  EXPECT_EQ((*cr)->kv().pages_allocated(), 2u * 7);
  EXPECT_EQ((*cr)->dkv().pages_allocated(), 2u * 7);
}

// What grows with the sequence is the K/V pool and its gradient, by 4 * n_layer * kv_dim *
// sizeof(T) bytes a token; the chunk's activations do not grow. The whole-window model's do,
// quadratically ([n_head, T, T] probabilities).
TEST(ChunkRecurrent, MemoryGrowsOnlyByThePool) {
  ThreadPool pool(2);
  ModelConfig c = small_config(true, 2, 1024);
  c.n_embd = 32;  // head_dim 8, kv_dim 16
  const int64_t chunk = 32, page = 16;
  std::vector<size_t> act, pool_bytes;
  for (int64_t n : {64, 256, 1024}) {
    auto mm = Transformer<float>::create(c, chunk);
    ASSERT_TRUE(mm);
    (*mm)->init(1);
    auto cr = ChunkRecurrent<float>::create(**mm, chunk, n, page);
    ASSERT_TRUE(cr);
    const Sequence s = make_sequence(n, c.n_vocab, 2, false);
    (*mm)->zero_grads();
    (*cr)->forward(s.tokens.data(), s.targets.data(), n, pool);
    (*cr)->backward(1.0f / static_cast<float>(n), pool);
    act.push_back((*cr)->activation_bytes());
    pool_bytes.push_back((*cr)->pool_bytes());
    const size_t per_token = (*cr)->pool_bytes_per_token();
    EXPECT_EQ(per_token, 4u * 2 * 16 * sizeof(float));
    EXPECT_EQ((*cr)->pool_bytes(), static_cast<size_t>(n) * per_token) << "n " << n;  // n is a multiple of the page
    // Another step at the same length allocates nothing.
    (*cr)->forward(s.tokens.data(), s.targets.data(), n, pool);
    (*cr)->backward(1.0f / static_cast<float>(n), pool);
    EXPECT_EQ((*cr)->pool_bytes(), static_cast<size_t>(n) * per_token);
  }
  EXPECT_EQ(act[0], act[1]);
  EXPECT_EQ(act[1], act[2]);
  auto w64 = Transformer<float>::create(c, 64), w1024 = Transformer<float>::create(c, 1024);
  ASSERT_TRUE(w64 && w1024);
  EXPECT_GT((*w1024)->activation_bytes(), 50 * (*w64)->activation_bytes());  // 16x tokens, ~T^2 bytes
  EXPECT_LT(act[2] + pool_bytes[2], (*w1024)->activation_bytes() / 10);
}

TEST(ChunkRecurrent, BadArguments) {
  auto mm = Transformer<double>::create(small_config(true, 2, 16), 16);
  ASSERT_TRUE(mm);
  EXPECT_FALSE(ChunkRecurrent<double>::create(**mm, 0, 16));
  EXPECT_FALSE(ChunkRecurrent<double>::create(**mm, 17, 16));
  EXPECT_FALSE(ChunkRecurrent<double>::create(**mm, 4, 17));  // beyond n_ctx
  EXPECT_FALSE(ChunkRecurrent<double>::create(**mm, 4, 16, 0));
  EXPECT_TRUE(ChunkRecurrent<double>::create(**mm, 16, 16));
}

// The trainer with --chunk: the same first steps as the whole-window trainer (float rounding
// apart), no whole-window activations, and errors that name the option.
class ChunkedTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("lc_chunked_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    text_ = (dir_ / "data.txt").string();
    std::ofstream f(text_);
    for (int i = 0; i < 40; ++i) f << "Once upon a time there was a little cat. The cat liked to play in the sun. ";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  TrainOptions tiny() const {
    TrainOptions o;
    o.vocab_path = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";
    o.data_path = text_;
    o.model.n_layer = 2;
    o.model.n_embd = 32;
    o.model.n_head = 4;
    o.model.n_head_kv = 2;
    o.model.n_ff = 64;
    o.seq_len = 48;
    o.batch = 2;
    o.optim.lr = 1e-2f;
    o.optim.warmup = 2;
    o.optim.steps = 10;
    o.seed = 7;
    o.n_threads = 2;
    o.verbose = false;
    return o;
  }
  std::filesystem::path dir_;
  std::string text_;
};

TEST_F(ChunkedTrainerTest, SameStepsAsWholeWindow) {
  auto a = Trainer::create(tiny());
  ASSERT_TRUE(a) << a.error().message;
  TrainOptions o = tiny();
  o.chunk = 20;  // not a divisor of 48
  auto b = Trainer::create(o);
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ((*b)->model().max_tokens(), 1);  // no whole-window activations
  for (int i = 0; i < 3; ++i) {
    const StepRecord ra = (*a)->step(), rb = (*b)->step();
    EXPECT_NEAR(rb.loss, ra.loss, 1e-4 * ra.loss) << "step " << i;
    EXPECT_NEAR(rb.grad_norm, ra.grad_norm, 2e-3 * ra.grad_norm) << "step " << i;
  }
}

TEST_F(ChunkedTrainerTest, BadChunkNamesTheOption) {
  for (int64_t chunk : {-1, 49}) {
    TrainOptions o = tiny();
    o.chunk = chunk;
    auto tr = Trainer::create(o);
    ASSERT_FALSE(tr);
    EXPECT_NE(tr.error().message.find("--chunk"), std::string::npos) << tr.error().message;
  }
}

}  // namespace
}  // namespace lc::train
