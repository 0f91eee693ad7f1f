// The training loop: data windows, forward/backward with batch accumulation, AdamW, checkpoints
// that resume bit for bit, a progress line, the loss curve (CSV, SVG, PNG) and the GGUF export.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "train/chunked.h"
#include "train/config.h"
#include "train/curriculum.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/plot.h"
#include "train/rng.h"
#include "train/transformer.h"

namespace lc::train {

struct TrainOptions {
  std::string vocab_path;      // GGUF whose tokenizer gives n_vocab and is copied on export
  std::string data_path;       // text or token file (see TokenData); optional with a curriculum
  // Synthetic curriculum (curriculum.h): "" = off (windows of data_path), "default" or
  // "task=weight,...". Sequences are cur_min_len..seq_len tokens, ramped over cur_ramp of the run.
  std::string curriculum;
  int64_t cur_min_len = 256;
  double cur_ramp = 0.3;
  double cur_lm = 0.5;  // fraction of task sequences scored on every token
  double cur_hard_values = 0;  // fraction of reader tasks' numbers drawn from 2-4 digits (hard_number)
  int64_t cur_alphabet = 0;  // repeat/induction pieces: the first N text pieces (0 = all)
  DataFormat data_format = DataFormat::kAuto;
  std::string out_path;        // exported GGUF; the loss curve goes next to it. "" = no export
  std::string checkpoint_dir;  // "" = no checkpoints
  ModelConfig model;           // n_vocab is taken from the vocabulary; n_ctx 0 = seq_len
  int64_t seq_len = 256;       // tokens per training window
  int64_t batch = 8;           // windows per optimizer step (gradients accumulated)
  int64_t chunk = 0;           // > 0: chunk-recurrent training in chunks of this many tokens (chunked.h)
  OptimConfig optim;
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0 = only at the end
  uint64_t seed = 1337;        // initialisation and data order
  double init_std = 0.02;      // std of the weight matrices at initialisation (residual outputs: / sqrt(2 n_layer))
  int n_threads = 0;           // 0 = all cores
  bool resume = false;         // continue from checkpoint_dir/checkpoint.bin
  std::string init_from;       // GGUF of the same shape whose weights replace the random initialisation
  int64_t stop_at = 0;         // > 0: stop this process after that step (the schedule keeps --steps)
  bool verbose = true;         // progress line on a terminal, log lines otherwise
};

class Trainer {
 public:
  // Loads the vocabulary and data, validates every option (errors name the option or file),
  // initialises the model from the seed or, with resume, from the checkpoint.
  static Expected<std::unique_ptr<Trainer>> create(const TrainOptions& o);

  // One optimizer step over `batch` windows.
  StepRecord step();
  // Steps until optim.steps with progress and periodic checkpoints, then the final checkpoint,
  // the export and the loss files.
  Status run();

  int64_t steps_done() const { return step_; }
  const std::vector<StepRecord>& history() const { return history_; }
  Transformer<float>& model() { return *model_; }
  const Transformer<float>& model() const { return *model_; }
  const TrainOptions& options() const { return o_; }
  const ModelConfig& config() const { return model_->config(); }
  ThreadPool& pool() { return *pool_; }
  const TokenData& data() const { return data_; }

  std::string checkpoint_path() const;  // checkpoint_dir/checkpoint.bin
  Status save_checkpoint(const std::string& path) const;
  Status load_checkpoint(const std::string& path);
  Status load_weights(const std::string& gguf_path);
  Status export_model(const std::string& path) const;
  // <out without .gguf>.loss.csv, .loss.svg and .loss.png.
  Status write_loss_files(const std::string& out_path) const;
  static std::string loss_file_stem(const std::string& out_path);

 private:
  Trainer() = default;

  TrainOptions o_;
  std::unique_ptr<gguf::File> vocab_;
  std::unique_ptr<Tokenizer> tok_;
  TokenData data_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Transformer<float>> model_;
  std::unique_ptr<ChunkRecurrent<float>> chunked_;  // with chunk > 0 (model_ then has no window buffers)
  std::unique_ptr<AdamW> adam_;
  Rng rng_;
  int64_t step_ = 0;
  int64_t tokens_done_ = 0;    // tokens trained on by this process (the progress line's speed)
  double elapsed_before_ = 0;  // seconds trained before this process (resume)
  double t_start_ = 0;
  std::vector<StepRecord> history_;
  std::unique_ptr<Curriculum> cur_;
  Status data_error_ = ok_status();  // a curriculum failure inside step(); run() returns it
  std::vector<int32_t> inputs_, targets_;  // [batch, seq_len]
  // Token rows whose embedding (and output row) get no update: the pieces an alphabet-limited
  // warm-up never shows (Curriculum::warmup_pieces). Sorted; empty = none.
  std::vector<int32_t> frozen_rows_;
};

}  // namespace lc::train
