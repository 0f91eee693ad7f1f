// The flags shared by the commands that run a model, declared once: each struct adds its flags
// to a CLI11 subcommand and turns what was given into the engine's parameters.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <vector>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/context.h"
#include "model/model.h"
#include "runtime/sampler.h"

// The paged KV cache: block size, storage types, RAM budget, spill folder (every command that
// runs a model, bench run included).
struct CacheOpts {
  int64_t kv_block = 64;
  std::string kv_type_k = "f32", kv_type_v = "f32", kv_spill;
  int64_t kv_budget = 0;  // bytes; 0: no cap
  // --kv-type-k/-v are also spelt --cache-type-k/-v, and -ctk/-ctv (llama.cpp's names; main()
  // rewrites the single-dash forms, see llama_cpp_flag_aliases).
  void add(CLI::App* app);
  lc::Status apply(lc::ContextParams& p) const;
};

// The model and how it runs: -m, context, batch, threads, methods (one spec each), cache,
// draft. bench run takes the methods as lists (a matrix) and declares them itself.
struct CommonOpts {
  std::string model;  // empty: the embedded model
  int64_t n_ctx = 0;
  int64_t n_batch = 512;
  int threads = 0;
  std::string rope, attn, kv_press, draft;
  // llama.cpp's rope flags, turned into a --rope spec by rope_spec() (NaN / -1 / "": not given).
  struct LlamaRope {
    std::string scaling;  // --rope-scaling none|linear|yarn
    double freq_base = std::numeric_limits<double>::quiet_NaN();
    double freq_scale = std::numeric_limits<double>::quiet_NaN();
    double scale = std::numeric_limits<double>::quiet_NaN();  // --rope-scale (= 1 / freq_scale)
    int64_t yarn_orig_ctx = -1;
    double yarn_ext_factor = std::numeric_limits<double>::quiet_NaN();
    double yarn_attn_factor = std::numeric_limits<double>::quiet_NaN();
    double yarn_beta_fast = std::numeric_limits<double>::quiet_NaN();
    double yarn_beta_slow = std::numeric_limits<double>::quiet_NaN();
    bool any() const;
  } llama_rope;
  std::string flash_attn;  // -fa/--flash-attn on|off|auto: accepted, no effect
  std::string n_gpu_layers;  // -ngl N|auto|all: accepted, with a notice
  CacheOpts cache;
  bool verbose = false;
  mutable std::shared_ptr<lc::Model> draft_model;  // --draft, loaded by ctx_params()
  void add(CLI::App* app);
  lc::Expected<lc::ContextParams> ctx_params() const;
  // The rope spec to run: --rope, or the llama.cpp rope flags translated (an error when both
  // are given, or when the flags do not make a method; see docs/rope.md).
  lc::Expected<std::string> rope_spec() const;
};

// llama.cpp's single-dash multi-letter flags, which CLI11 cannot declare (it would read -ctk as
// -c tk): -ctk, -ctv, -fa, -ngl become --cache-type-k, --cache-type-v, --flash-attn,
// --n-gpu-layers. Arguments after "--" are left alone. Applied to argv before parsing.
void llama_cpp_flag_aliases(int argc, char** argv, std::vector<std::string>& storage,
                            std::vector<char*>& out);

// Prints "longctx: error: MSG" to stderr (after flushing stdout) and returns exit code 1.
int fail(const std::string& msg);
// The model of -m, or the embedded model without it; --verbose turns on info logging.
lc::Expected<std::unique_ptr<lc::Model>> load_model(const CommonOpts& o);
// The model of -m, or without it the project's reader model (models/longctx-2l-reader.gguf,
// compiled in: trained on the readers' protocols, it keeps the base model's scores).
lc::Expected<std::unique_ptr<lc::Model>> load_model_or_reader(const CommonOpts& o);
// The chat template of --chat-template NAME ("" or "auto": the one the model's GGUF gives).
lc::Expected<lc::ChatTemplate> chat_template_for(const lc::Model& m, const std::string& name);
// Only the tokenizer of -m (or of the embedded model): a vocabulary-only GGUF does, and no
// weights are read, as llama-tokenize loads with vocab_only.
struct LoadedTokenizer {
  std::unique_ptr<lc::gguf::File> file;
  std::unique_ptr<lc::Tokenizer> tok;
};
lc::Expected<LoadedTokenizer> load_tokenizer(const CommonOpts& o);

struct SamplingOpts {
  lc::SamplerParams p;
  int64_t seed = -1;
  std::vector<std::string> logit_bias;  // --logit-bias TOKEN_ID(+|-)BIAS, repeatable
  void add(CLI::App* app);
  lc::Expected<lc::SamplerParams> params() const;
};

// CLI11 transformers for values written with a unit suffix: each runs the project's own parser
// inside CLI11 and hands the option the number, so a bad value is a parse error naming the
// flag. Used as opt->transform(byte_size_value()), then ->check(CLI::Range(...)) if needed.
//
// Why not CLI::AsSizeValue(false) / CLI::AsNumberWithUnit: their units would do (K, M, G, T in
// any case as powers of 1024), but in CLI11 2.1.2 they read the number as an integer with
// strtoull/strtoll in base 0: "010" gives 8 (octal) and "08" is refused, "0x10" gives 16, "-1"
// is taken, and "1.5G" is refused. The project's parsers read "010" as 10, refuse signs and
// hex, and parse_byte_size reads a decimal fraction ("1.5GiB"), so they stay, run by CLI11.
//
// A byte size: 4096, 64K, 512M, 2G, 1.5GiB; K/M/G/T are powers of 1024 (lc::parse_byte_size).
// An empty value is 0 (--kv-budget "": no cap).
CLI::Validator byte_size_value();
// A length in tokens: 4096, 4K, 128k, 1M; K = 1024, M = 1024^2 (lc::tasks::parse_length).
// With ->delimiter(',') each item of a list is read so.
CLI::Validator token_length_value();

// The help line of a method flag, listing the registry's names.
std::string rope_flag_help();
std::string attn_flag_help();
std::string press_flag_help();
