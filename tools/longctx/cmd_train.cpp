// `longctx train`: trains a Llama-architecture model from scratch on a text or token file and
// exports it as a GGUF that `longctx run` (and llama.cpp) load (src/train).
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "command.h"
#include "train/trainer.h"

namespace {

struct TrainArgs {
  lc::train::TrainOptions o;
  std::string data_format = "auto";
  std::string output;  // --output-weights: tied or separate
};

}  // namespace

std::vector<RegisteredCommand> add_train_commands(CLI::App* app) {
  auto args = std::make_shared<TrainArgs>();
  lc::train::TrainOptions& o = args->o;
  args->output = o.model.tied ? "tied" : "separate";
  auto* t = app->add_subcommand("train", "train a small Llama-architecture model and export it as GGUF");
  t->add_option("--vocab", o.vocab_path, "GGUF whose tokenizer is used (and copied into the output)")->required();
  t->add_option("--data", o.data_path, "training data: a text file, or little-endian int32 token ids (.bin/.tok/.tokens); "
                 "with --curriculum, the plain text of its 'text' task (default: the shipped essay)");
  t->add_option("--curriculum", o.curriculum, "synthetic long-context curriculum: 'default' or task=weight,... "
                 "(bench tasks, recall, quiz, copy, repeat, induction, text); answers are scored, prompts are not");
  t->add_option("--cur-min-len", o.cur_min_len, "curriculum: shortest sequence in tokens")->capture_default_str();
  t->add_option("--cur-ramp", o.cur_ramp, "curriculum: fraction of the steps over which the longest sequence "
                 "grows from --cur-min-len to --seq-len")->capture_default_str();
  t->add_option("--cur-lm", o.cur_lm, "curriculum: fraction of task sequences scored on every token "
                 "(the rest score the answer only)")->capture_default_str();
  t->add_option("--cur-hard-values", o.cur_hard_values, "curriculum: fraction of the reader protocol tasks' number "
                 "values drawn from 2 to 4 distinct digits (runs and repeated pairs, which a copy by content "
                 "confuses); bench tasks keep RULER's values")->capture_default_str();
  t->add_option("--cur-alphabet", o.cur_alphabet, "curriculum: the repeat and induction tasks draw from the first N "
                 "text pieces of the vocabulary (0: all); where the mix has no other task, the other pieces' "
                 "embeddings stay frozen")->capture_default_str();
  t->add_option("--data-format", args->data_format, "auto, text or tokens")->capture_default_str();
  t->add_option("-o,--out", o.out_path, "output GGUF; the loss curve goes next to it (.loss.csv, .loss.svg, .loss.png)")->required();
  t->add_option("--checkpoint-dir", o.checkpoint_dir, "directory for checkpoint.bin (saved at the end and every --checkpoint-every steps)");
  t->add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0: only at the end)")->capture_default_str();
  t->add_flag("--resume", o.resume, "continue from --checkpoint-dir/checkpoint.bin");
  t->add_option("--stop-at", o.stop_at, "stop this run after that step, with a checkpoint and an export; "
                 "the learning-rate schedule still follows --steps, so --resume continues it (0: off)")->capture_default_str();
  t->add_option("--init-from", o.init_from, "start from the weights of this GGUF (same shape: a previous stage's export) "
                 "instead of a random initialisation; the optimizer and the schedule start afresh");
  t->add_option("--n-layer", o.model.n_layer, "transformer blocks")->capture_default_str();
  t->add_option("--n-embd", o.model.n_embd, "embedding width")->capture_default_str();
  t->add_option("--n-head", o.model.n_head, "attention heads")->capture_default_str();
  t->add_option("--fixed-distance", o.model.fixed_distance,
                 "train attention with a distance ceiling: keys more than N positions back are attended as if "
                 "exactly N back (LM-Infinite / InfLLM), so the model reads longer inputs at trained distances "
                 "(0: off)")
      ->capture_default_str();
  t->add_option("--logn", o.model.logn_orig,
                 "train with attention logit scaling: q at position n times max(1, ln n / ln N), the rope "
                 "method `logn:orig=N`, which the exported model then uses by default (0: off)")
      ->capture_default_str();
  t->add_option("--n-head-kv", o.model.n_head_kv, "key/value heads (0: --n-head; fewer: grouped-query attention)")->capture_default_str();
  t->add_option("--n-ff", o.model.n_ff, "feed-forward width (0: 8/3 n_embd rounded up to 32)")->capture_default_str();
  t->add_option("--n-ctx", o.model.n_ctx, "context length written to the GGUF (0: --seq-len)")->capture_default_str();
  t->add_option("--rope-base", o.model.rope_base, "RoPE frequency base")->capture_default_str();
  t->add_option("--output-weights", args->output, "tied (output = token embedding) or separate")->capture_default_str()
      ->check(CLI::IsMember({"tied", "separate"}));
  t->add_option("--seq-len", o.seq_len, "tokens per training window")->capture_default_str();
  t->add_option("--batch", o.batch, "windows per optimizer step (gradients accumulated)")->capture_default_str();
  t->add_option("--chunk", o.chunk, "chunk-recurrent training: process each window in chunks of this many tokens, "
                 "recomputing activations, so memory grows only by the K/V pool (0: whole window)")->capture_default_str();
  t->add_option("--steps", o.optim.steps, "optimizer steps")->capture_default_str();
  t->add_option("--lr", o.optim.lr, "peak learning rate")->capture_default_str();
  t->add_option("--min-lr-ratio", o.optim.min_lr_ratio, "final learning rate of the cosine, as a fraction of --lr")->capture_default_str();
  t->add_option("--warmup", o.optim.warmup, "steps of linear learning-rate warm-up")->capture_default_str();
  t->add_option("--weight-decay", o.optim.weight_decay, "AdamW decoupled weight decay (matrices only)")->capture_default_str();
  t->add_option("--grad-clip", o.optim.grad_clip, "clip the global gradient norm to this (0: off)")->capture_default_str();
  t->add_option("--init-std", o.init_std, "std of the weight matrices at initialisation (residual outputs scaled by "
                 "1/sqrt(2 n_layer)); 0.02 suits wide models, about 1/sqrt(n_embd) lets narrow ones learn attention sooner")
      ->capture_default_str()->check(CLI::Range(1e-6, 10.0));
  t->add_option("--seed", o.seed, "seed of initialisation and data order")->capture_default_str();
  t->add_option("-t,--threads", o.n_threads, "threads (0: all cores)")->capture_default_str();

  RegisteredCommand cmd;
  cmd.app = t;
  cmd.run = [args]() -> int {
    lc::train::TrainOptions o = args->o;
    auto fmt = lc::train::parse_data_format(args->data_format);
    if (!fmt) {
      fmt::print(stderr, "longctx: error: --data-format: {}\n", fmt.error().message);
      return 1;
    }
    o.data_format = *fmt;
    o.model.tied = args->output == "tied";
    auto tr = lc::train::Trainer::create(o);
    if (!tr) {
      fmt::print(stderr, "longctx: error: {}\n", tr.error().message);
      return 1;
    }
    lc::Status st = (*tr)->run();
    if (!st) {
      fmt::print(stderr, "longctx: error: {}\n", st.message());
      return 1;
    }
    return 0;
  };
  return {cmd};
}
