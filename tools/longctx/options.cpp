#include "options.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "attention/backend.h"
#include "core/log.h"
#include "embedded_model.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "kv/press.h"
#include "rope/rope_scaling.h"
#include "tasks/text.h"

namespace {

template <class List>
std::string names_of(const List& methods) {
  std::string s;
  for (const auto& m : methods) {
    if (!s.empty()) s += ", ";
    s += m.first;
  }
  return s;
}

}  // namespace

CLI::Validator byte_size_value() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        if (in.empty()) {  // --kv-budget "": no cap, as when the flag held the text
          in = "0";
          return {};
        }
        auto v = lc::parse_byte_size(in);
        if (!v) return v.error().message;
        in = std::to_string(*v);
        return {};
      },
      "SIZE", "byte size");
}

CLI::Validator token_length_value() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        const int64_t n = lc::tasks::parse_length(in);
        if (n < 0) return "'" + in + "' is not a length (a number of tokens, or like 4K, 128K, 1M; K = 1024)";
        in = std::to_string(n);
        return {};
      },
      "LENGTH", "token length");
}

std::string rope_flag_help() {
  std::string names;
  for (const auto& n : lc::rope_method_names()) names += (names.empty() ? "" : ", ") + n;
  return "RoPE scaling NAME:key=value,...[+logn] overriding the GGUF's (" + names +
         "; see docs/rope.md)";
}

std::string attn_flag_help() {
  return "attention backend NAME:key=value,... (" + names_of(lc::attention_methods()) +
         "; see docs/attention.md). Default: dense, or fixed for a model trained with a distance ceiling";
}

std::string press_flag_help() {
  return "KV-cache compression NAME:key=value,...[+NAME...] (" + names_of(lc::kv_press_methods()) +
         "; see docs/kv-press.md)";
}

void CacheOpts::add(CLI::App* app) {
  app->add_option("--kv-block", kv_block, "tokens per KV-cache block")->capture_default_str();
  app->add_option("--kv-type-k", kv_type_k, "key storage type: f32, f16, bf16, q8_0")->capture_default_str();
  app->add_option("--kv-type-v", kv_type_v, "value storage type: f32, f16, bf16, q8_0")->capture_default_str();
  app->add_option("--kv-budget", kv_budget, "cap on KV-cache RAM in bytes, e.g. 512M, 2G; K/M/G/T are powers of "
                  "1024 (default: none)")
      ->transform(byte_size_value());
  app->add_option("--kv-spill", kv_spill, "directory for a spill file that takes cold KV blocks past the budget");
}

lc::Status CacheOpts::apply(lc::ContextParams& p) const {
  p.kv_block = kv_block;
  LC_ASSIGN_OR_RETURN(p.kv_type_k, lc::parse_kv_type(kv_type_k));
  LC_ASSIGN_OR_RETURN(p.kv_type_v, lc::parse_kv_type(kv_type_v));
  p.kv_budget = kv_budget;
  p.kv_spill = kv_spill;
  return lc::ok_status();
}

void CommonOpts::add(CLI::App* app) {
  app->add_option("-m,--model", model, "GGUF model file (default: the embedded longctx-2l, the project's retrieval model)");
  app->add_option("-c,--ctx-size", n_ctx, "context size in tokens (0: grows as the input needs, bounded by --kv-budget or 3/4 of the free memory)")->capture_default_str();
  app->add_option("-b,--batch-size", n_batch, "tokens per prefill chunk")->capture_default_str();
  app->add_option("-t,--threads", threads, "threads (0 = all cores)")->capture_default_str();
  app->add_option("--rope", rope, rope_flag_help());
  app->add_option("--attn", attn, attn_flag_help());
  cache.add(app);
  app->add_option("--kv-press", kv_press, press_flag_help());
  app->add_option("--draft", draft, "draft model GGUF for --kv-press speckv / specpc (a small model with the same "
                  "vocabulary)");
  app->add_flag("-v,--verbose", verbose, "log more");
}

lc::Expected<lc::ContextParams> CommonOpts::ctx_params() const {
  lc::ContextParams p;
  p.n_ctx = n_ctx;
  p.n_batch = n_batch;
  p.n_threads = threads;
  p.rope = rope;
  p.attn = attn;
  LC_TRY(cache.apply(p));
  p.kv_press = kv_press;
  p.model_name = model.empty() ? kEmbeddedModelName : model;
  if (!draft.empty()) {
    if (!draft_model) {
      LC_ASSIGN_OR_RETURN(std::unique_ptr<lc::Model> d, lc::Model::load(draft));
      draft_model = std::move(d);
    }
    p.draft = draft_model.get();
    p.draft_name = draft;
  }
  return p;
}

void SamplingOpts::add(CLI::App* app) {
  app->add_option("--temp", p.temp, "temperature (0 = greedy)")->capture_default_str();
  app->add_option("--top-k", p.top_k, "top-k (0 = off)")->capture_default_str();
  app->add_option("--top-p", p.top_p, "top-p (1 = off)")->capture_default_str();
  app->add_option("--min-p", p.min_p, "min-p (0 = off)")->capture_default_str();
  app->add_option("--repeat-penalty", p.repeat_penalty, "repetition penalty (1 = off)")->capture_default_str();
  app->add_option("--repeat-last-n", p.repeat_last_n, "tokens considered by the penalty")->capture_default_str();
  app->add_option("--seed", seed, "random seed (-1 = from the clock)")->capture_default_str();
}

lc::Expected<lc::SamplerParams> SamplingOpts::params() const {
  lc::SamplerParams q = p;
  q.seed = seed < 0 ? static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())
                    : static_cast<uint64_t>(seed);
  LC_TRY(lc::validate(q));
  return q;
}

int fail(const std::string& msg) {
  std::fflush(stdout);
  fmt::print(stderr, "longctx: error: {}\n", msg);
  return 1;
}

lc::Expected<std::unique_ptr<lc::Model>> load_model(const CommonOpts& o) {
  if (o.verbose) lc::set_log_level(lc::LogLevel::kInfo);
  if (o.model.empty()) {
    auto img = embedded_model();
    return lc::Model::load_memory(img.data(), img.size(), kEmbeddedModelName);
  }
  return lc::Model::load(o.model);
}
