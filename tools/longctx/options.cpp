#include "options.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
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
  app->add_option("--kv-type-k,--cache-type-k", kv_type_k,
                  "key storage type: f32, f16, bf16, q8_0 (also -ctk, as llama.cpp)")->capture_default_str();
  app->add_option("--kv-type-v,--cache-type-v", kv_type_v,
                  "value storage type: f32, f16, bf16, q8_0 (also -ctv, as llama.cpp)")->capture_default_str();
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
  // llama.cpp's rope flags, translated into a --rope spec (rope_spec()).
  const std::string lg = "llama.cpp compatibility (see docs/rope.md)";
  app->add_option("--rope-scaling", llama_rope.scaling,
                  "llama.cpp's RoPE scaling type: none, linear, yarn (with the flags below, instead of --rope)")
      ->check(CLI::IsMember({"none", "linear", "yarn"}))->group(lg);
  app->add_option("--rope-freq-base", llama_rope.freq_base, "RoPE base (rope method's base=)")
      ->check(CLI::PositiveNumber)->group(lg);
  app->add_option("--rope-freq-scale", llama_rope.freq_scale,
                  "RoPE frequency scale: the context grows by 1/N (factor = 1/N); alone it means --rope-scaling linear")
      ->check(CLI::Range(0.0, 1.0).description("in (0, 1]"))->group(lg);
  app->add_option("--rope-scale", llama_rope.scale, "RoPE context scaling factor N (= --rope-freq-scale 1/N)")
      ->check(CLI::Range(1.0, 1e9).description(">= 1"))->group(lg);
  app->add_option("--yarn-orig-ctx", llama_rope.yarn_orig_ctx, "YaRN original context (0: the model's training context)")
      ->check(CLI::NonNegativeNumber)->group(lg);
  app->add_option("--yarn-ext-factor", llama_rope.yarn_ext_factor,
                  "YaRN extrapolation mix: -1 (auto) or 1, the full NTK-by-parts ramp (the only one longctx has)")
      ->group(lg);
  app->add_option("--yarn-attn-factor", llama_rope.yarn_attn_factor, "YaRN attention factor (yarn's attn_factor=)")
      ->check(CLI::PositiveNumber)->group(lg);
  app->add_option("--yarn-beta-fast", llama_rope.yarn_beta_fast, "YaRN high correction dim (yarn's beta=, default 32)")
      ->check(CLI::PositiveNumber)->group(lg);
  app->add_option("--yarn-beta-slow", llama_rope.yarn_beta_slow, "YaRN low correction dim (yarn's alpha=, default 1)")
      ->check(CLI::PositiveNumber)->group(lg);
  app->add_option("--flash-attn", flash_attn,
                  "accepted for llama.cpp compatibility (also -fa), no effect: on, off or auto; the attention "
                  "backend is --attn")
      ->expected(0, 1)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v.empty() || v == "on" || v == "off" || v == "auto") return {};
            return "'" + v + "' is not on, off or auto";
          },
          "on|off|auto", "flash-attn value"))
      ->group(lg);
  app->add_option("--n-gpu-layers,--gpu-layers", n_gpu_layers,
                  "accepted for llama.cpp compatibility (also -ngl), with a notice: longctx runs on the CPU")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto" || v == "all") return {};
            size_t i = (!v.empty() && v[0] == '-') ? 1 : 0;
            if (i == v.size()) return "'" + v + "' is not a number of layers (or auto, all)";
            for (; i < v.size(); ++i)
              if (v[i] < '0' || v[i] > '9') return "'" + v + "' is not a number of layers (or auto, all)";
            return {};
          },
          "N", "layers"))
      ->group(lg);
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
  LC_ASSIGN_OR_RETURN(p.rope, rope_spec());
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

bool CommonOpts::LlamaRope::any() const {
  return !scaling.empty() || !std::isnan(freq_base) || !std::isnan(freq_scale) || !std::isnan(scale) ||
         yarn_orig_ctx >= 0 || !std::isnan(yarn_ext_factor) || !std::isnan(yarn_attn_factor) ||
         !std::isnan(yarn_beta_fast) || !std::isnan(yarn_beta_slow);
}

// llama.cpp's flags as a spec: --rope-scaling picks the method (without it: linear when a
// factor is given, else none); --rope-freq-scale/--rope-scale give factor, --rope-freq-base
// base, and the --yarn-* flags yarn's keys. What llama.cpp would take from the model's GGUF
// when a flag is missing (its scaling type and factor) is not guessed: such a combination is an
// error that says what to add.
lc::Expected<std::string> CommonOpts::rope_spec() const {
  const LlamaRope& r = llama_rope;
  if (!r.any()) return rope;
  if (!rope.empty())
    return lc::make_error(
        "--rope cannot be combined with llama.cpp's rope flags (--rope-scaling, --rope-freq-base, "
        "--rope-freq-scale, --rope-scale, --yarn-*): give the whole method with one of them, e.g. --rope "
        "yarn:factor=4,orig=4096,base=500000");
  if (!std::isnan(r.freq_scale) && !std::isnan(r.scale))
    return lc::make_error("give --rope-freq-scale or --rope-scale, not both (--rope-scale N = --rope-freq-scale 1/N)");
  if (!std::isnan(r.freq_scale) && !(r.freq_scale > 0.0 && r.freq_scale <= 1.0))
    return lc::make_error(fmt::format("--rope-freq-scale {}: must be in (0, 1] (the context grows by 1/N)", r.freq_scale));
  double factor = std::numeric_limits<double>::quiet_NaN();
  if (!std::isnan(r.freq_scale)) factor = 1.0 / r.freq_scale;
  if (!std::isnan(r.scale)) factor = r.scale;
  const bool yarn_keys = r.yarn_orig_ctx >= 0 || !std::isnan(r.yarn_ext_factor) || !std::isnan(r.yarn_attn_factor) ||
                         !std::isnan(r.yarn_beta_fast) || !std::isnan(r.yarn_beta_slow);
  const std::string type = !r.scaling.empty() ? r.scaling : (!std::isnan(factor) ? "linear" : "none");
  if (yarn_keys && type != "yarn")
    return lc::make_error(fmt::format("the --yarn-* flags need --rope-scaling yarn (the method is {})", type));
  if (type == "none" && !std::isnan(factor))
    return lc::make_error("--rope-scaling none takes no --rope-freq-scale / --rope-scale");
  if (type != "none" && std::isnan(factor))
    return lc::make_error(fmt::format(
        "--rope-scaling {} needs the factor: --rope-freq-scale 1/N or --rope-scale N (longctx does not take it "
        "from the model's GGUF here; --rope gguf runs the model's own scaling)",
        type));
  std::vector<std::string> keys;
  if (type != "none") keys.push_back(fmt::format("factor={}", factor));
  if (type == "yarn") {
    if (r.yarn_orig_ctx > 0) keys.push_back(fmt::format("orig={}", r.yarn_orig_ctx));
    if (!std::isnan(r.yarn_ext_factor) && r.yarn_ext_factor != -1.0 && r.yarn_ext_factor != 1.0)
      return lc::make_error(fmt::format(
          "--yarn-ext-factor {}: longctx's yarn has the full ramp only; give -1 (auto) or 1 (for 0, plain "
          "interpolation, use --rope-scaling linear)",
          r.yarn_ext_factor));
    if (!std::isnan(r.yarn_beta_slow)) keys.push_back(fmt::format("alpha={}", r.yarn_beta_slow));
    if (!std::isnan(r.yarn_beta_fast)) keys.push_back(fmt::format("beta={}", r.yarn_beta_fast));
    if (!std::isnan(r.yarn_attn_factor)) keys.push_back(fmt::format("attn_factor={}", r.yarn_attn_factor));
  }
  if (!std::isnan(r.freq_base)) keys.push_back(fmt::format("base={}", r.freq_base));
  std::string spec = type;
  for (size_t i = 0; i < keys.size(); ++i) spec += (i ? "," : ":") + keys[i];
  return spec;
}

void llama_cpp_flag_aliases(int argc, char** argv, std::vector<std::string>& storage, std::vector<char*>& out) {
  static const std::pair<const char*, const char*> kAliases[] = {
      {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}, {"-fa", "--flash-attn"}, {"-ngl", "--n-gpu-layers"},
      {"-np", "--parallel"}};
  storage.assign(argv, argv + argc);
  bool rest = false;
  for (std::string& a : storage) {
    if (a == "--") rest = true;
    if (rest) continue;
    for (const auto& [from, to] : kAliases) {
      if (a == from) {
        a = to;
      } else if (a.rfind(std::string(from) + "=", 0) == 0) {
        a = to + a.substr(std::strlen(from));
      }
    }
  }
  out.clear();
  for (std::string& a : storage) out.push_back(a.data());
  out.push_back(nullptr);
}

void SamplingOpts::add(CLI::App* app) {
  app->add_option("--temp", p.temp, "temperature (0 = greedy)")->capture_default_str();
  app->add_option("--top-k", p.top_k, "top-k (0 = off)")->capture_default_str();
  app->add_option("--top-p", p.top_p, "top-p (1 = off)")->capture_default_str();
  app->add_option("--min-p", p.min_p, "min-p (0 = off)")->capture_default_str();
  app->add_option("--repeat-penalty", p.repeat_penalty, "repetition penalty (1 = off)")->capture_default_str();
  app->add_option("--repeat-last-n", p.repeat_last_n, "tokens considered by the penalty")->capture_default_str();
  app->add_option("--seed", seed, "random seed (-1 = from the clock)")->capture_default_str();
  app->add_option("-l,--logit-bias", logit_bias,
                  "add BIAS to a token's logit before sampling: TOKEN_ID+BIAS or TOKEN_ID-BIAS, BIAS in [0, 100] or "
                  "inf (TOKEN_ID-inf bans the token); repeatable");
}

lc::Expected<lc::SamplerParams> SamplingOpts::params() const {
  lc::SamplerParams q = p;
  q.seed = seed < 0 ? static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())
                    : static_cast<uint64_t>(seed);
  for (const std::string& b : logit_bias) {
    LC_ASSIGN_OR_RETURN(auto pair, lc::parse_logit_bias(b));
    q.logit_bias.push_back(pair);
  }
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
  if (!o.n_gpu_layers.empty())
    fmt::print(stderr, "longctx: note: --n-gpu-layers {} has no effect: longctx is a CPU engine, every layer runs on "
               "the CPU\n", o.n_gpu_layers);
  if (o.model.empty()) {
    auto img = embedded_model();
    return lc::Model::load_memory(img.data(), img.size(), kEmbeddedModelName);
  }
  return lc::Model::load(o.model);
}

lc::Expected<LoadedTokenizer> load_tokenizer(const CommonOpts& o) {
  if (o.verbose) lc::set_log_level(lc::LogLevel::kInfo);
  LoadedTokenizer t;
  if (o.model.empty()) {
    auto img = embedded_model();
    LC_ASSIGN_OR_RETURN(t.file, lc::gguf::File::parse(img.data(), img.size(), kEmbeddedModelName));
  } else {
    LC_ASSIGN_OR_RETURN(t.file, lc::gguf::File::open(o.model));
  }
  LC_ASSIGN_OR_RETURN(t.tok, lc::Tokenizer::from_gguf(*t.file));
  return t;
}

lc::Expected<std::unique_ptr<lc::Model>> load_model_or_reader(const CommonOpts& o) {
  if (o.verbose) lc::set_log_level(lc::LogLevel::kInfo);
  if (!o.model.empty()) return load_model(o);
  return lc::Model::load_memory(embedded_reader_model().data(), embedded_reader_model().size(),
                                kEmbeddedReaderModelName);
}

lc::Expected<lc::ChatTemplate> chat_template_for(const lc::Model& m, const std::string& name) {
  if (name.empty() || name == "auto") return lc::detect_chat_template(m.file(), m.tokenizer());
  return lc::chat_template_from_name(name);
}
