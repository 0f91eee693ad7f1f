// The flags shared by the commands that run a model, declared once: each struct adds its flags
// to a CLI11 subcommand and turns what was given into the engine's parameters.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
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
  std::string kv_type_k = "f32", kv_type_v = "f32", kv_budget, kv_spill;
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
  CacheOpts cache;
  bool verbose = false;
  mutable std::shared_ptr<lc::Model> draft_model;  // --draft, loaded by ctx_params()
  void add(CLI::App* app);
  lc::Expected<lc::ContextParams> ctx_params() const;
};

struct SamplingOpts {
  lc::SamplerParams p;
  int64_t seed = -1;
  void add(CLI::App* app);
  lc::Expected<lc::SamplerParams> params() const;
};

// The help line of a method flag, listing the registry's names.
std::string rope_flag_help();
std::string attn_flag_help();
std::string press_flag_help();
