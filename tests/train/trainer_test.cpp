// The training loop end to end on the tiny stories260K vocabulary: the loss falls on a fixed
// seed, a resumed checkpoint continues bit for bit, the exported GGUF gives the trainer's
// logits through the inference engine, and bad inputs give clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/context.h"
#include "model/model.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace lc::train {
namespace {

namespace fs = std::filesystem;

const std::string kVocab = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lc_train_" + std::to_string(getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    text_ = (dir_ / "data.txt").string();
    std::ofstream f(text_);
    for (int i = 0; i < 40; ++i) f << "Once upon a time there was a little cat. The cat liked to play in the sun. ";
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainOptions tiny() const {
    TrainOptions o;
    o.vocab_path = kVocab;
    o.data_path = text_;
    o.model.n_layer = 2;
    o.model.n_embd = 32;
    o.model.n_head = 4;
    o.model.n_head_kv = 2;
    o.model.n_ff = 64;
    o.seq_len = 24;
    o.batch = 2;
    o.optim.lr = 1e-2f;
    o.optim.warmup = 5;
    o.optim.steps = 50;
    o.optim.weight_decay = 0.0f;
    o.seed = 7;
    o.n_threads = 2;
    o.verbose = false;
    return o;
  }

  fs::path dir_;
  std::string text_;
};

TEST_F(TrainerTest, LossFallsOnFixedSeed) {
  auto tr = Trainer::create(tiny());
  ASSERT_TRUE(tr) << tr.error().message;
  std::vector<double> losses;
  for (int i = 0; i < 50; ++i) losses.push_back((*tr)->step().loss);
  // The text repeats one sentence pair: the model memorises it.
  EXPECT_NEAR(losses.front(), std::log(512.0), 0.5);  // ~uniform over the 512 tokens at init
  EXPECT_LT(losses.back(), 0.3 * losses.front()) << "first " << losses.front() << " last " << losses.back();
  // Same seed, same run.
  auto tr2 = Trainer::create(tiny());
  ASSERT_TRUE(tr2);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*tr2)->step().loss, losses[static_cast<size_t>(i)]);
}

TEST_F(TrainerTest, ResumeIsBitForBit) {
  TrainOptions o = tiny();
  o.checkpoint_dir = (dir_ / "ckpt").string();
  fs::create_directories(o.checkpoint_dir);
  auto a = Trainer::create(o);
  ASSERT_TRUE(a) << a.error().message;
  for (int i = 0; i < 4; ++i) (*a)->step();
  ASSERT_TRUE((*a)->save_checkpoint((*a)->checkpoint_path()).is_ok());
  const StepRecord ra = (*a)->step();  // step 5, uninterrupted

  o.resume = true;
  auto b = Trainer::create(o);
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ((*b)->steps_done(), 4);
  EXPECT_EQ((*b)->history().size(), 4u);
  const StepRecord rb = (*b)->step();  // step 5, resumed
  EXPECT_EQ(rb.step, 5);
  EXPECT_EQ(rb.loss, ra.loss);
  EXPECT_EQ(rb.grad_norm, ra.grad_norm);
  EXPECT_EQ(rb.lr, ra.lr);
  const auto& pa = (*a)->model();
  const auto& pb = (*b)->model();
  ASSERT_EQ(pa.n_params(), pb.n_params());
  EXPECT_EQ(std::memcmp(pa.params(), pb.params(), pa.n_params() * sizeof(float)), 0);
}

TEST_F(TrainerTest, RunWritesModelCheckpointAndLossCurve) {
  TrainOptions o = tiny();
  o.optim.steps = 6;
  o.checkpoint_dir = (dir_ / "ck").string();
  o.checkpoint_every = 3;
  o.out_path = (dir_ / "m.gguf").string();
  auto tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().message;
  ASSERT_TRUE((*tr)->run().is_ok());
  EXPECT_TRUE(fs::exists(dir_ / "m.gguf"));
  EXPECT_TRUE(fs::exists(dir_ / "ck" / "checkpoint.bin"));
  std::ifstream csv(dir_ / "m.loss.csv");
  std::string line;
  int lines = 0;
  while (std::getline(csv, line)) ++lines;
  EXPECT_EQ(lines, 7);  // header + 6 steps
  std::ifstream svg(dir_ / "m.loss.svg");
  std::string s((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(s.find("<svg"), std::string::npos);
  EXPECT_NE(s.find("<path"), std::string::npos);  // cairo draws the curve as a path
  // The same chart as PNG (bench/plot.h draws both).
  std::ifstream png(dir_ / "m.loss.png", std::ios::binary);
  std::string p((std::istreambuf_iterator<char>(png)), std::istreambuf_iterator<char>());
  ASSERT_GT(p.size(), 8u);
  EXPECT_EQ(p.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_FALSE(fs::exists(dir_ / "m.loss.tmp.png"));
  // A run asked for more steps resumes from the final checkpoint.
  o.optim.steps = 8;
  o.resume = true;
  auto tr2 = Trainer::create(o);
  ASSERT_TRUE(tr2) << tr2.error().message;
  EXPECT_EQ((*tr2)->steps_done(), 6);
  ASSERT_TRUE((*tr2)->run().is_ok());
  EXPECT_EQ((*tr2)->history().size(), 8u);
}

// The oracle tying trainer to inference: the exported GGUF, loaded by lc::Model and run by
// lc::Context, gives the trainer's own logits.
void check_export(TrainOptions o, const fs::path& dir) {
  o.optim.steps = 10;
  auto tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().message;
  for (int i = 0; i < 10; ++i) (*tr)->step();  // weights away from their initial values
  const std::string path = (dir / (o.model.tied ? "tied.gguf" : "sep.gguf")).string();
  ASSERT_TRUE((*tr)->export_model(path).is_ok());

  auto model = Model::load(path);
  ASSERT_TRUE(model) << model.error().message;
  EXPECT_EQ((*model)->hparams().n_layer, o.model.n_layer);
  EXPECT_EQ((*model)->hparams().n_head_kv, o.model.n_head_kv);
  EXPECT_EQ((*model)->tied_output(), o.model.tied);
  EXPECT_EQ((*model)->tokenizer().n_vocab(), 512);
  EXPECT_EQ((*model)->hparams().fixed_distance, o.model.fixed_distance);
  EXPECT_EQ((*model)->hparams().logn_orig, o.model.logn_orig);
  ContextParams cp;
  cp.n_ctx = o.seq_len;
  cp.n_threads = 2;
  auto ctx = Context::create(**model, cp);
  ASSERT_TRUE(ctx) << ctx.error().message;
  // A model trained with a distance ceiling runs with it by default.
  EXPECT_EQ((*ctx)->attention().spec(), o.model.fixed_distance > 0
                                            ? "fixed:distance=" + std::to_string(o.model.fixed_distance)
                                            : std::string("dense"));
  const auto& data = (*tr)->data().tokens();
  std::vector<int32_t> toks(data.begin() + 3, data.begin() + 3 + o.seq_len);
  ASSERT_TRUE((*ctx)->decode(toks, Logits::kAll).is_ok());
  auto& m = (*tr)->model();
  m.forward(toks.data(), nullptr, o.seq_len, (*tr)->pool());
  double max_diff = 0, max_logit = 0;
  for (int64_t t = 0; t < o.seq_len; ++t)
    for (int64_t i = 0; i < 512; ++i) {
      const double a = (*ctx)->logits(t)[i], b = m.logits()[t * 512 + i];
      max_diff = std::max(max_diff, std::fabs(a - b));
      max_logit = std::max(max_logit, std::fabs(b));
    }
  EXPECT_LT(max_diff, 1e-4) << "largest |logit| " << max_logit;
  EXPECT_GT(max_logit, 0.5);  // not a degenerate comparison
}

TEST_F(TrainerTest, ExportedGgufReproducesTrainerLogitsTied) { check_export(tiny(), dir_); }

// Trained with a distance ceiling shorter than the window: the engine's default attention for
// the exported file (`fixed`) gives the trainer's logits, and plain dense attention does not.
TEST_F(TrainerTest, ExportedGgufReproducesTrainerLogitsFixedDistance) {
  TrainOptions o = tiny();
  o.model.fixed_distance = 5;
  o.model.logn_orig = 4;  // and trained logit scaling, also the exported model's default
  check_export(o, dir_);
  auto model = Model::load((dir_ / "tied.gguf").string());
  ASSERT_TRUE(model) << model.error().message;
  auto tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().message;
  const auto& data = (*tr)->data().tokens();
  std::vector<int32_t> toks(data.begin() + 3, data.begin() + 3 + o.seq_len);
  ContextParams cp;
  cp.n_ctx = o.seq_len;
  cp.n_threads = 2;
  cp.attn = "dense";
  cp.rope = "logn:orig=4";
  auto dense = Context::create(**model, cp);
  ASSERT_TRUE(dense) << dense.error().message;
  cp.attn = "";
  cp.rope = "";
  auto fixed = Context::create(**model, cp);
  ASSERT_TRUE(fixed) << fixed.error().message;
  ASSERT_TRUE((*dense)->decode(toks, Logits::kAll).is_ok());
  ASSERT_TRUE((*fixed)->decode(toks, Logits::kAll).is_ok());
  double near = 0, far = 0;
  for (int64_t t = 0; t < o.seq_len; ++t)
    for (int64_t i = 0; i < 512; ++i) {
      const double d = std::fabs((*dense)->logits(t)[i] - (*fixed)->logits(t)[i]);
      double& m = t <= 5 ? near : far;
      m = std::max(m, d);
    }
  EXPECT_LT(near, 1e-5);  // within the ceiling the two are the same attention
  EXPECT_GT(far, 1e-3);   // beyond it they differ
}

TEST_F(TrainerTest, ExportedGgufReproducesTrainerLogitsSeparateOutput) {
  TrainOptions o = tiny();
  o.model.tied = false;
  o.model.n_head_kv = 4;
  check_export(o, dir_);
}

TEST_F(TrainerTest, TokenFileData) {
  TrainOptions o = tiny();
  o.data_path = (dir_ / "d.bin").string();
  {
    std::vector<int32_t> ids;
    for (int i = 0; i < 200; ++i) ids.push_back(1 + i % 17);
    std::ofstream f(o.data_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  }
  auto tr = Trainer::create(o);
  ASSERT_TRUE(tr) << tr.error().message;
  EXPECT_EQ((*tr)->data().size(), 200);
  EXPECT_EQ((*tr)->data().tokens()[5], 6);
}

void expect_error(const TrainOptions& o, const std::string& needle) {
  auto tr = Trainer::create(o);
  ASSERT_FALSE(tr) << "expected an error containing '" << needle << "'";
  EXPECT_NE(tr.error().message.find(needle), std::string::npos) << tr.error().message;
}

TEST_F(TrainerTest, BadInputsGiveClearErrors) {
  TrainOptions o = tiny();
  o.data_path = (dir_ / "missing.txt").string();
  expect_error(o, "missing.txt");
  o = tiny();
  o.vocab_path = (dir_ / "nope.gguf").string();
  expect_error(o, "nope.gguf");
  o = tiny();
  o.model.n_embd = 30;  // not a multiple of 4 heads
  expect_error(o, "multiple of n_head");
  o = tiny();
  o.model.n_head_kv = 3;
  expect_error(o, "n_head_kv");
  o = tiny();
  o.optim.lr = 0;
  expect_error(o, "learning rate");
  o = tiny();
  o.optim.warmup = 100;
  expect_error(o, "warm-up");
  o = tiny();
  o.seq_len = 100000;
  expect_error(o, "sequence length");
  o = tiny();
  o.seq_len = 5000;  // more than the data holds
  expect_error(o, "seq_len + 1");
  o = tiny();
  o.batch = 0;
  expect_error(o, "batch");
  o = tiny();
  o.model.fixed_distance = 4;
  o.chunk = 8;
  expect_error(o, "--fixed-distance is not supported with --chunk");
  o = tiny();
  o.model.fixed_distance = -2;
  expect_error(o, "fixed distance");
  o = tiny();
  o.model.logn_orig = 1;
  expect_error(o, "logn length");
  o = tiny();
  o.checkpoint_dir = (dir_ / "none").string();
  o.resume = true;
  expect_error(o, "checkpoint.bin");
  // A token file of the wrong size and one with an id outside the vocabulary.
  o = tiny();
  o.data_path = (dir_ / "odd.tokens").string();
  { std::ofstream(o.data_path, std::ios::binary) << "abcde"; }
  expect_error(o, "multiple of 4");
  {
    std::vector<int32_t> ids(100, 3);
    ids[42] = 999;
    std::ofstream f(o.data_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(ids.data()), 400);
  }
  expect_error(o, "token 999 at index 42");
  // A truncated checkpoint, and one made for another shape.
  o = tiny();
  o.checkpoint_dir = (dir_ / "ck").string();
  fs::create_directories(o.checkpoint_dir);
  {
    auto tr = Trainer::create(o);
    ASSERT_TRUE(tr);
    (*tr)->step();
    ASSERT_TRUE((*tr)->save_checkpoint((*tr)->checkpoint_path()).is_ok());
  }
  o.resume = true;
  TrainOptions other = o;
  other.model.n_layer = 3;
  expect_error(other, "n_layer = 2");
  fs::resize_file(fs::path(o.checkpoint_dir) / "checkpoint.bin", 100);
  expect_error(o, "truncated");
}

// --init-std: matrices drawn with that standard deviation, the residual outputs with it over
// sqrt(2 n_layer), norm weights 1 (sample statistics over thousands of weights).
TEST_F(TrainerTest, InitStdSetsTheWeightScale) {
  for (double sd : {0.02, 0.125}) {
    TrainOptions o = tiny();
    o.init_std = sd;
    auto tr = Trainer::create(o);
    ASSERT_TRUE(tr) << tr.error().message;
    const auto& m = (*tr)->model();
    for (const auto& t : m.tensors()) {
      const float* p = m.params() + t.offset;
      double s2 = 0, mean = 0;
      for (size_t i = 0; i < t.size; ++i) {
        mean += p[i];
        s2 += static_cast<double>(p[i]) * p[i];
      }
      mean /= static_cast<double>(t.size);
      const double rms = std::sqrt(s2 / static_cast<double>(t.size));
      if (t.ne.size() == 1) {
        EXPECT_EQ(mean, 1.0) << t.name;
        continue;
      }
      const bool resid = t.name.find("attn_output") != std::string::npos || t.name.find("ffn_down") != std::string::npos;
      const double want = resid ? sd / std::sqrt(2.0 * o.model.n_layer) : sd;
      // n >= 1024 samples: the sample rms is within ~5 / sqrt(2n) of sigma with overwhelming odds.
      EXPECT_NEAR(rms / want, 1.0, 5.0 / std::sqrt(2.0 * static_cast<double>(t.size))) << t.name << " sd " << sd;
    }
  }
}

// --init-from: a later stage starts from an earlier stage's exported weights, bit for bit,
// at step 0; a file of another shape, a missing file and --resume with it are refused.
TEST_F(TrainerTest, InitFromStartsFromAnExportedStage) {
  TrainOptions a = tiny();
  a.optim.steps = 4;
  a.optim.warmup = 1;
  a.out_path = (dir_ / "stage1.gguf").string();
  auto t1 = Trainer::create(a);
  ASSERT_TRUE(t1) << t1.error().message;
  ASSERT_TRUE((*t1)->run().is_ok());
  TrainOptions b = tiny();
  b.seed = 99;  // another random initialisation, replaced by the file
  b.seq_len = 16;  // a stage may change the window
  b.init_from = a.out_path;
  auto t2 = Trainer::create(b);
  ASSERT_TRUE(t2) << t2.error().message;
  const auto& m1 = (*t1)->model();
  const auto& m2 = (*t2)->model();
  ASSERT_EQ(m1.n_params(), m2.n_params());
  EXPECT_EQ(std::memcmp(m1.params(), m2.params(), m1.n_params() * sizeof(float)), 0);
  EXPECT_EQ((*t2)->steps_done(), 0);
  auto expect_error = [&](TrainOptions o, const std::string& what) {
    auto t = Trainer::create(o);
    ASSERT_FALSE(t) << what;
    EXPECT_NE(t.error().message.find(what), std::string::npos) << t.error().message;
  };
  TrainOptions wider = b;
  wider.model.n_embd = 48;
  expect_error(wider, "token_embd.weight' is 32 x 512, this model's is 48 x 512");
  TrainOptions deeper = b;
  deeper.model.n_layer = 3;
  expect_error(deeper, "has no tensor 'blk.2.");
  TrainOptions shallower = b;
  shallower.model.n_layer = 1;
  expect_error(shallower, "has tensor 'blk.1.");
  TrainOptions missing = b;
  missing.init_from = (dir_ / "nope.gguf").string();
  expect_error(missing, "nope.gguf");
  TrainOptions both = b;
  both.checkpoint_dir = (dir_ / "ck").string();
  both.resume = true;
  expect_error(both, "--init-from and --resume");
}

TEST(Schedule, WarmupThenCosine) {
  OptimConfig o;
  o.lr = 1.0f;
  o.warmup = 4;
  o.steps = 14;
  o.min_lr_ratio = 0.1f;
  EXPECT_FLOAT_EQ(learning_rate(o, 0), 0.25f);
  EXPECT_FLOAT_EQ(learning_rate(o, 3), 1.0f);
  EXPECT_FLOAT_EQ(learning_rate(o, 4), 1.0f);
  EXPECT_NEAR(learning_rate(o, 9), 0.1f + 0.9f * 0.5f * (1 + std::cos(M_PI * 5 / 9)), 1e-6);
  EXPECT_FLOAT_EQ(learning_rate(o, 13), 0.1f);
  for (int s = 5; s < 14; ++s) EXPECT_LE(learning_rate(o, s), learning_rate(o, s - 1));
}

// The CLI: `longctx train` end to end, and a clear error for a missing data file.
TEST_F(TrainerTest, CommandLine) {
  const std::string bin = LONGCTX_BINARY;
  if (!fs::exists(bin)) GTEST_SKIP() << "longctx binary not built";
  const std::string out = (dir_ / "cli.gguf").string();
  const std::string cmd = bin + " train --vocab " + kVocab + " --data " + text_ + " --out " + out +
                          " --n-layer 1 --n-embd 16 --n-head 2 --seq-len 16 --batch 1 --steps 3 --threads 1 2>" +
                          (dir_ / "err.txt").string();
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_TRUE(fs::exists(out));
  EXPECT_TRUE(fs::exists(dir_ / "cli.loss.svg"));
  EXPECT_TRUE(fs::exists(dir_ / "cli.loss.png"));
  const std::string bad = bin + " train --vocab " + kVocab + " --data " + (dir_ / "nope.txt").string() + " --out " +
                          out + " 2>" + (dir_ / "err2.txt").string();
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream e(dir_ / "err2.txt");
  std::string s((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  EXPECT_NE(s.find("nope.txt"), std::string::npos) << s;
}

}  // namespace
}  // namespace lc::train
