// longctx: the command-line front end. Subcommands: run, chat, info, tokenize, perplexity,
// bench speed, make-model.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/log.h"
#include "command.h"
#include "embedded_model.h"
#include "core/sys.h"
#include "kernels/kernels.h"
#include "attention/lychee.h"
#include "kv/block_pool.h"
#include "model/context.h"
#include "model/model.h"
#include "model/random_model.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace {

using lc::Expected;
using lc::Status;


int fail(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "longctx: error: %s\n", msg.c_str());
  return 1;
}

Expected<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return lc::make_error(lc::strprintf("%s: cannot open prompt file", path.c_str()));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return lc::make_error(lc::strprintf("%s: read error", path.c_str()));
  return ss.str();
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

struct CommonOpts {
  std::string model;  // empty: the embedded model
  int64_t n_ctx = 0;
  int64_t n_batch = 512;
  int threads = 0;
  std::string rope;
  std::string attn = "dense";
  int64_t kv_block = 64;
  std::string kv_type_k = "f32", kv_type_v = "f32", kv_budget, kv_spill, kv_press;
  bool verbose = false;
  void add(CLI::App* app) {
    app->add_option("-m,--model", model, "GGUF model file (default: the embedded stories260K)");
    app->add_option("-c,--ctx-size", n_ctx, "context size in tokens (0 = model's training context)")
        ->capture_default_str();
    app->add_option("-b,--batch-size", n_batch, "tokens per prefill chunk")->capture_default_str();
    app->add_option("-t,--threads", threads, "threads (0 = all cores)")->capture_default_str();
    app->add_option("--rope", rope, "RoPE scaling NAME:key=value,...[+logn] overriding the GGUF's "
                    "(none, linear, ntk, dynamic-ntk, yarn, llama3, mrrope-uni, mrrope-pro; see docs/rope.md)");
    app->add_option("--attn", attn, "attention backend NAME:key=value,... (dense, streaming, quest, infllm, "
                    "dssa, lychee; see docs/attention.md)")->capture_default_str();
    app->add_option("--kv-block", kv_block, "tokens per KV-cache block")->capture_default_str();
    app->add_option("--kv-type-k", kv_type_k, "key storage type: f32, f16, bf16, q8_0")->capture_default_str();
    app->add_option("--kv-type-v", kv_type_v, "value storage type: f32, f16, bf16, q8_0")->capture_default_str();
    app->add_option("--kv-budget", kv_budget, "cap on KV-cache RAM, e.g. 512M, 2G (default: none)");
    app->add_option("--kv-spill", kv_spill, "directory for a spill file that takes cold KV blocks past the budget");
    app->add_option("--kv-press", kv_press, "KV-cache compression NAME:key=value,...[+NAME...] (streaming_llm, "
                    "snapkv, h2o, tova, knorm, pyramidkv, adakv, expected_attention, random; see docs/kv-press.md)");
    app->add_flag("-v,--verbose", verbose, "log more");
  }
  Expected<lc::ContextParams> ctx_params() const {
    lc::ContextParams p;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_threads = threads;
    p.rope = rope;
    p.attn = attn;
    p.kv_block = kv_block;
    LC_ASSIGN_OR_RETURN(p.kv_type_k, lc::parse_kv_type(kv_type_k));
    LC_ASSIGN_OR_RETURN(p.kv_type_v, lc::parse_kv_type(kv_type_v));
    if (!kv_budget.empty()) {
      LC_ASSIGN_OR_RETURN(p.kv_budget, lc::parse_byte_size(kv_budget));
    }
    p.kv_spill = kv_spill;
    p.kv_press = kv_press;
    return p;
  }
};

struct SamplingOpts {
  lc::SamplerParams p;
  int64_t seed = -1;
  void add(CLI::App* app) {
    app->add_option("--temp", p.temp, "temperature (0 = greedy)")->capture_default_str();
    app->add_option("--top-k", p.top_k, "top-k (0 = off)")->capture_default_str();
    app->add_option("--top-p", p.top_p, "top-p (1 = off)")->capture_default_str();
    app->add_option("--min-p", p.min_p, "min-p (0 = off)")->capture_default_str();
    app->add_option("--repeat-penalty", p.repeat_penalty, "repetition penalty (1 = off)")->capture_default_str();
    app->add_option("--repeat-last-n", p.repeat_last_n, "tokens considered by the penalty")->capture_default_str();
    app->add_option("--seed", seed, "random seed (-1 = from the clock)")->capture_default_str();
  }
  Expected<lc::SamplerParams> params() const {
    lc::SamplerParams q = p;
    q.seed = seed < 0 ? static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())
                      : static_cast<uint64_t>(seed);
    LC_TRY(lc::validate(q));
    return q;
  }
};

Expected<std::unique_ptr<lc::Model>> load_model(const CommonOpts& o) {
  if (o.verbose) lc::set_log_level(lc::LogLevel::kInfo);
  if (o.model.empty()) {
    auto img = embedded_model();
    return lc::Model::load_memory(img.data(), img.size(), kEmbeddedModelName);
  }
  return lc::Model::load(o.model);
}

Expected<std::unique_ptr<lc::Context>> make_context(const lc::Model& m, const Expected<lc::ContextParams>& p) {
  if (!p) return p.error();
  return lc::Context::create(m, *p);
}

void print_summary(const lc::GenerateStats& st, const lc::Context& ctx) {
  std::fprintf(stderr,
               "\n\nprompt:     %6lld tokens in %8.3f s = %9.2f tokens/s\n"
               "generation: %6lld tokens in %8.3f s = %9.2f tokens/s\n"
               "memory:     peak RSS %.1f MiB, KV cache %.2f MiB in use (%.2f MiB resident, %.2f MiB spilled; "
               "%lld tokens seen, %zu bytes/token), activations %.2f MiB\n",
               (long long)st.n_prompt, st.t_prompt, st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0.0,
               (long long)st.n_gen, st.t_gen, st.t_gen > 0 ? st.n_gen / st.t_gen : 0.0,
               mib(lc::peak_rss_bytes()), mib(static_cast<int64_t>(ctx.kv().memory().in_use_bytes)),
               mib(static_cast<int64_t>(ctx.kv().memory().resident_bytes)),
               mib(static_cast<int64_t>(ctx.kv().memory().spilled_bytes)), (long long)ctx.n_past(),
               ctx.kv().memory().bytes_per_token, mib(static_cast<int64_t>(ctx.activation_bytes())));
}

int cmd_run(const CommonOpts& co, const SamplingOpts& so, const std::string& prompt_arg,
            const std::string& file, int64_t n_predict, bool no_special_bos, bool parse_special) {
  if (!prompt_arg.empty() && !file.empty()) return fail("give either -p or -f, not both");
  if (n_predict < 0) return fail("-n must be >= 0");
  std::string prompt = prompt_arg;
  if (!file.empty()) {
    auto t = read_file(file);
    if (!t) return fail(t.error().message);
    prompt = std::move(*t);
  }
  auto sp = so.params();
  if (!sp) return fail(sp.error().message);
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  auto ctx = make_context(**model, co.ctx_params());
  if (!ctx) return fail(ctx.error().message);
  const lc::Tokenizer& tok = (*model)->tokenizer();
  std::vector<int32_t> ids = tok.encode(prompt, !no_special_bos, parse_special);
  if (static_cast<int64_t>(ids.size()) > (*ctx)->n_ctx())
    return fail(lc::strprintf("the prompt has %zu tokens but the context holds %lld (raise --ctx-size)",
                              ids.size(), (long long)(*ctx)->n_ctx()));
  if (ids.empty()) return fail("the prompt is empty and the model adds no BOS token");
  lc::Sampler sampler(*sp);
  std::fputs(prompt.size() > 2000 ? "" : prompt.c_str(), stdout);
  std::fflush(stdout);
  lc::GenerateStats st;
  Status s = lc::generate(**ctx, sampler, ids, n_predict,
                          [](int32_t, std::string_view text) {
                            std::fwrite(text.data(), 1, text.size(), stdout);
                            std::fflush(stdout);
                            return true;
                          },
                          st);
  if (!s) return fail(s.message());
  print_summary(st, **ctx);
  return 0;
}

int cmd_chat(const CommonOpts& co, const SamplingOpts& so, const std::string& system,
             const std::string& tmpl_name, int64_t n_predict) {
  auto sp = so.params();
  if (!sp) return fail(sp.error().message);
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  const lc::Tokenizer& tok = (*model)->tokenizer();
  lc::ChatTemplate tmpl = lc::detect_chat_template((*model)->file(), tok);
  if (!tmpl_name.empty()) {
    auto t = lc::chat_template_from_name(tmpl_name);
    if (!t) return fail(t.error().message);
    tmpl = *t;
  }
  auto ctx = make_context(**model, co.ctx_params());
  if (!ctx) return fail(ctx.error().message);
  std::fprintf(stderr, "chat template: %s. Type a message; an empty line or Ctrl-D ends.\n",
               lc::chat_template_name(tmpl));
  lc::Sampler sampler(*sp);
  std::vector<lc::ChatMessage> msgs;
  if (!system.empty()) msgs.push_back({"system", system});
  std::vector<int32_t> history;  // tokens of the conversation; the cache holds a prefix of it
  lc::GenerateStats total;
  std::string line;
  for (;;) {
    std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    msgs.push_back({"user", line});
    // Re-render the whole conversation and evaluate only what differs from the cached prefix
    // (the way servers reuse a prompt cache): the template's end-of-turn markers may tokenize
    // differently from what was sampled.
    std::vector<int32_t> ids = tok.encode(lc::apply_chat_template(tmpl, msgs, true), true, true);
    size_t common = 0;
    const size_t cached = static_cast<size_t>((*ctx)->n_past());
    while (common < ids.size() && common < cached && ids[common] == history[common]) ++common;
    if (common == ids.size() && common > 0) --common;  // at least one token yields the logits
    (*ctx)->truncate(static_cast<int64_t>(common));
    history = std::move(ids);
    std::string reply;
    lc::GenerateStats st;
    Status s = lc::generate(**ctx, sampler, history, n_predict,
                            [&](int32_t, std::string_view text) {
                              reply += text;
                              std::fwrite(text.data(), 1, text.size(), stdout);
                              std::fflush(stdout);
                              return true;
                            },
                            st);
    if (!s) return fail(s.message());
    std::fputc('\n', stdout);
    total.n_prompt += st.n_prompt;
    total.n_gen += st.n_gen;
    total.t_prompt += st.t_prompt;
    total.t_gen += st.t_gen;
    msgs.push_back({"assistant", reply});
  }
  print_summary(total, **ctx);
  return 0;
}

// LycheeDecode: finds the heads that attend far back on a retrieval prompt and writes them to a
// file for --attn lychee:heads=FILE.
int cmd_calibrate(const CommonOpts& co, const std::string& file, int64_t far, int64_t per_layer,
                  const std::string& out) {
  if (far < 1) return fail("--far must be >= 1");
  if (per_layer < 1) return fail("--per-layer must be >= 1");
  auto text = read_file(file);
  if (!text) return fail(text.error().message);
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  const lc::HParams& hp = (*model)->hparams();
  if (per_layer > hp.n_head) return fail(lc::strprintf("--per-layer %lld exceeds the %lld heads per layer",
                                                        (long long)per_layer, (long long)hp.n_head));
  lc::AttnShape as{hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.head_dim_v, 0.0f};
  auto cal = lc::make_lychee_calibrator(as, far);
  if (!cal) return fail(cal.error().message);
  const lc::LycheeCalibrator* stats = cal->get();
  auto cp = co.ctx_params();
  if (!cp) return fail(cp.error().message);
  const auto ids = (*model)->tokenizer().encode(*text, true, false);
  if (static_cast<int64_t>(ids.size()) <= far)
    return fail(lc::strprintf("the calibration prompt has %zu tokens; it needs more than --far %lld",
                              ids.size(), (long long)far));
  cp->n_ctx = std::max<int64_t>(cp->n_ctx, static_cast<int64_t>(ids.size()));
  auto ctx = lc::Context::create(**model, *cp, std::move(*cal));
  if (!ctx) return fail(ctx.error().message);
  Status s = (*ctx)->decode(ids, lc::Logits::kNone);
  if (!s) return fail(s.message());
  const lc::RetrievalHeads rh = lc::pick_retrieval_heads(stats->stats(), per_layer);
  s = lc::save_retrieval_heads(out, rh);
  if (!s) return fail(s.message());
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    std::printf("layer %lld:", (long long)il);
    for (int32_t h : rh.heads[static_cast<size_t>(il)])
      std::printf(" %d (far mass %.3f)", h, stats->stats().mean(il, h));
    std::printf("\n");
  }
  std::fprintf(stderr, "wrote %s; use --attn lychee:heads=%s\n", out.c_str(), out.c_str());
  return 0;
}

int cmd_info(const std::string& path) {
  auto model = lc::Model::load(path);
  if (!model) return fail(model.error().message);
  const lc::Model& m = **model;
  const lc::HParams& hp = m.hparams();
  const lc::Tokenizer& tok = m.tokenizer();
  const auto& f = m.file();
  std::printf("file:            %s (GGUF v%u, %.2f MiB, %zu tensors, %zu metadata keys)\n", path.c_str(),
              f.version(), mib(static_cast<int64_t>(f.file_size())), f.tensors().size(), f.metadata().size());
  if (auto n = f.get_string("general.name")) std::printf("name:            %s\n", n->c_str());
  std::printf("architecture:    %s\n", lc::arch_name(hp.arch));
  std::printf("n_vocab:         %lld\nn_ctx_train:     %lld\nn_embd:          %lld\nn_layer:         %lld\n",
              (long long)hp.n_vocab, (long long)hp.n_ctx_train, (long long)hp.n_embd, (long long)hp.n_layer);
  std::printf("n_head:          %lld\nn_head_kv:       %lld (GQA %lld)\nhead_dim:        %lld (v %lld)\nn_ff:            %lld\n",
              (long long)hp.n_head, (long long)hp.n_head_kv, (long long)hp.n_gqa(), (long long)hp.head_dim,
              (long long)hp.head_dim_v, (long long)hp.n_ff);
  std::printf("rms_eps:         %g\n", hp.rms_eps);
  std::printf("rope:            %s pairs, n_rot %lld, base %g, scaling %s (freq_scale %g, orig ctx %lld)%s\n",
              hp.rope_kind == lc::RopeKind::kNorm ? "adjacent" : "neox", (long long)hp.n_rot, hp.rope_base,
              lc::rope_scaling_name(hp.rope_scaling), hp.rope_freq_scale, (long long)hp.rope_orig_ctx,
              m.rope_freq_factors().empty() ? "" : ", rope_freqs tensor present");
  std::printf("output:          %s\n", m.tied_output() ? "tied to token_embd" : "separate output.weight");
  std::printf("tokenizer:       %s (pre %s), %d tokens, bos %d, eos %d, add_bos %s, add_eos %s\n",
              tok.model_name().c_str(), tok.pre_name().empty() ? "-" : tok.pre_name().c_str(), tok.n_vocab(),
              tok.bos(), tok.eos(), tok.add_bos() ? "yes" : "no", tok.add_eos() ? "yes" : "no");
  std::printf("chat template:   %s\n", lc::chat_template_name(lc::detect_chat_template(f, tok)));
  std::map<std::string, std::pair<int, size_t>> by_type;
  for (const auto& t : f.tensors()) {
    auto& e = by_type[lc::dtype_name(t.type)];
    e.first++;
    e.second += t.n_bytes;
  }
  std::printf("weights:         %.2f MiB:", mib(static_cast<int64_t>(m.weight_bytes())));
  for (const auto& [name, e] : by_type) std::printf(" %s x%d (%.2f MiB)", name.c_str(), e.first, mib(static_cast<int64_t>(e.second)));
  std::printf("\n\ntensors:\n");
  for (const auto& t : f.tensors()) {
    std::string shape;
    for (int d = 0; d < t.n_dims; ++d) shape += (d ? ", " : "") + std::to_string(t.ne[d]);
    std::printf("  %-32s %-6s [%s] %zu bytes\n", t.name.c_str(), lc::dtype_name(t.type), shape.c_str(), t.n_bytes);
  }
  return 0;
}

int cmd_tokenize(const CommonOpts& co, const std::string& prompt, const std::string& file, bool no_bos,
                 bool parse_special, bool ids_only) {
  std::string text = prompt;
  if (!file.empty()) {
    auto t = read_file(file);
    if (!t) return fail(t.error().message);
    text = std::move(*t);
  }
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  const lc::Tokenizer& tok = (*model)->tokenizer();
  auto ids = tok.encode(text, !no_bos, parse_special);
  if (ids_only) {
    std::printf("[");
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
    std::printf("]\n");
    return 0;
  }
  for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, tok.token_to_piece(id, true).c_str());
  std::fprintf(stderr, "%zu tokens\n", ids.size());
  return 0;
}

int cmd_perplexity(const CommonOpts& co, const std::string& file, int64_t chunk) {
  if (file.empty()) return fail("perplexity needs a text file (-f)");
  auto text = read_file(file);
  if (!text) return fail(text.error().message);
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  auto cpe = co.ctx_params();
  if (!cpe) return fail(cpe.error().message);
  lc::ContextParams cp = *cpe;
  cp.n_ctx = std::max(chunk, cp.n_ctx);
  auto ctx = lc::Context::create(**model, cp);
  if (!ctx) return fail(ctx.error().message);
  const lc::Tokenizer& tok = (*model)->tokenizer();
  auto ids = tok.encode(*text, true, false);
  std::fprintf(stderr, "perplexity: %zu tokens, chunks of %lld\n", ids.size(), (long long)chunk);
  const double t0 = lc::now_seconds();
  auto r = lc::perplexity(**ctx, ids, chunk, [](int64_t i, double ppl) {
    std::printf("[%lld]%.4f,", (long long)(i + 1), ppl);
    std::fflush(stdout);
  });
  if (!r) return fail(r.error().message);
  const double dt = lc::now_seconds() - t0;
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r->ppl, r->ppl_err);
  std::fprintf(stderr, "%lld chunks, %lld scored tokens, %.2f s (%.1f tokens/s), peak RSS %.1f MiB\n",
               (long long)r->n_chunks, (long long)r->n_scored, dt, r->n_chunks * chunk / dt,
               mib(lc::peak_rss_bytes()));
  return 0;
}

std::vector<int64_t> parse_list(const std::string& s, const char* flag, std::string& err) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      long long v = std::stoll(item, &pos);
      if (pos != item.size() || v < 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (...) {
      err = lc::strprintf("%s: '%s' is not a non-negative integer", flag, item.c_str());
      return {};
    }
  }
  return out;
}

int cmd_bench_speed(const CommonOpts& co, const std::string& p_list, const std::string& n_list,
                    const std::string& d_list, int reps, const std::string& output) {
  std::string err;
  auto ps = parse_list(p_list, "-p", err);
  auto ns = parse_list(n_list, "-n", err);
  auto ds = parse_list(d_list, "-d", err);
  if (!err.empty()) return fail(err);
  if (reps < 1) return fail("-r must be >= 1");
  if (output != "md" && output != "json") return fail("-o must be md or json");
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  int64_t need = 0;
  for (auto d : ds)
    for (auto p : ps) need = std::max(need, d + p);
  for (auto d : ds)
    for (auto n : ns) need = std::max(need, d + n);
  auto cpe = co.ctx_params();
  if (!cpe) return fail(cpe.error().message);
  lc::ContextParams cp = *cpe;
  cp.n_ctx = std::max(cp.n_ctx, need);
  auto ctx = lc::Context::create(**model, cp);
  if (!ctx) return fail(ctx.error().message);
  const int threads = (*ctx)->pool().size();
  std::vector<lc::SpeedTest> results;
  for (auto d : ds) {
    for (auto p : ps) {
      if (p == 0) continue;
      auto r = lc::bench_speed(**ctx, p, 0, d, reps, 1234);
      if (!r) return fail(r.error().message);
      results.push_back(*r);
    }
    for (auto n : ns) {
      if (n == 0) continue;
      auto r = lc::bench_speed(**ctx, 0, n, d, reps, 1234);
      if (!r) return fail(r.error().message);
      results.push_back(*r);
    }
  }
  const auto& m = **model;
  std::map<std::string, int> types;
  for (const auto& t : m.file().tensors())
    if (t.n_dims == 2) types[lc::dtype_name(t.type)]++;
  std::string type_str;
  for (const auto& [k, v] : types) type_str += (type_str.empty() ? "" : "+") + k;
  if (output == "json") {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : results) {
      j.push_back({{"model", co.model.empty() ? kEmbeddedModelName : co.model}, {"weights", type_str}, {"size_bytes", m.weight_bytes()},
                   {"threads", threads}, {"n_batch", co.n_batch}, {"test", r.name}, {"n_prompt", r.n_prompt},
                   {"n_gen", r.n_gen}, {"n_depth", r.depth}, {"samples_ts", r.tps}, {"avg_ts", r.mean()},
                   {"stddev_ts", r.stddev()}, {"peak_rss_bytes", lc::peak_rss_bytes()}});
    }
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    std::printf("| model | weights | size | threads | test | t/s |\n|---|---|---:|---:|---|---:|\n");
    for (const auto& r : results)
      std::printf("| %s | %s | %.2f MiB | %d | %s | %.2f ± %.2f |\n", (co.model.empty() ? kEmbeddedModelName : co.model.c_str()), type_str.c_str(),
                  mib(static_cast<int64_t>(m.weight_bytes())), threads, r.name.c_str(), r.mean(), r.stddev());
    std::printf("\npeak RSS: %.1f MiB\n", mib(lc::peak_rss_bytes()));
  }
  return 0;
}

int cmd_make_model(const std::string& shape, const std::string& type, const std::string& vocab,
                   const std::string& out, uint64_t seed) {
  if (shape != "smollm2-135m") return fail("--shape: only smollm2-135m is known");
  auto t = lc::dtype_from_name(type);
  if (!t || !lc::kernels::can_quantize(*t)) return fail(lc::strprintf("--type: cannot write '%s' weights", type.c_str()));
  lc::RandomModelSpec spec = lc::smollm2_135m_spec();
  spec.weight_type = *t;
  spec.vocab_path = vocab;
  spec.seed = seed;
  Status s = lc::write_random_model(spec, out);
  if (!s) return fail(s.message());
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"longctx: long-context inference engine for GGUF models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for all subcommands");

  CommonOpts run_co;
  SamplingOpts run_so;
  std::string run_prompt = "Once upon a time", run_file;
  int64_t run_n = 128;
  bool run_no_bos = false, run_special = false;
  auto* run = app.add_subcommand("run", "generate a continuation of a prompt, streamed as it is produced");
  run_co.add(run);
  run_so.add(run);
  run->add_option("-p,--prompt", run_prompt, "prompt text")->capture_default_str();
  run->add_option("-f,--file", run_file, "read the prompt from a file");
  run->add_option("-n,--n-predict", run_n, "tokens to generate")->capture_default_str();
  run->add_flag("--no-bos", run_no_bos, "do not add the BOS/EOS tokens the model asks for");
  run->add_flag("--parse-special", run_special, "turn special-token text in the prompt into those tokens");

  CommonOpts chat_co;
  SamplingOpts chat_so;
  std::string chat_system, chat_tmpl;
  int64_t chat_n = 256;
  auto* chat = app.add_subcommand("chat", "converse using the model's chat template (stdin/stdout)");
  chat_co.add(chat);
  chat_so.add(chat);
  chat->add_option("-s,--system", chat_system, "system message");
  chat->add_option("--chat-template", chat_tmpl, "override the template: llama3, chatml, llama2, zephyr");
  chat->add_option("-n,--n-predict", chat_n, "maximum tokens per reply")->capture_default_str();

  std::string info_path;
  auto* info = app.add_subcommand("info", "print a model's architecture, hyper-parameters, rope, tensors, tokenizer");
  info->add_option("model", info_path, "GGUF file")->required();

  CommonOpts tok_co;
  std::string tok_prompt, tok_file;
  bool tok_no_bos = false, tok_special = false, tok_ids = false;
  auto* tokc = app.add_subcommand("tokenize", "print the token ids and pieces of a text");
  tok_co.add(tokc);
  tokc->add_option("-p,--prompt", tok_prompt, "text");
  tokc->add_option("-f,--file", tok_file, "read the text from a file");
  tokc->add_flag("--no-bos", tok_no_bos, "do not add BOS/EOS");
  tokc->add_flag("--parse-special", tok_special, "parse special-token text");
  tokc->add_flag("--ids", tok_ids, "print only the list of ids");

  CommonOpts ppl_co;
  std::string ppl_file;
  int64_t ppl_chunk = 512;
  auto* ppl = app.add_subcommand("perplexity", "perplexity of a text, computed as llama.cpp's perplexity tool does");
  ppl_co.add(ppl);
  ppl->remove_option(ppl->get_option("-c"));
  ppl->add_option("-f,--file", ppl_file, "text file")->required();
  ppl->add_option("-c,--ctx-size", ppl_chunk, "chunk size in tokens")->capture_default_str();

  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  CommonOpts bs_co;
  std::string bs_p = "512", bs_n = "128", bs_d = "0", bs_o = "md";
  int bs_r = 5;
  auto* bspeed = bench->add_subcommand("speed", "prompt and generation tokens/s, like llama-bench");
  bs_co.add(bspeed);
  bspeed->add_option("-p,--n-prompt", bs_p, "prompt lengths, comma-separated")->capture_default_str();
  bspeed->add_option("-n,--n-gen", bs_n, "generation lengths, comma-separated")->capture_default_str();
  bspeed->add_option("-d,--n-depth", bs_d, "context depths, comma-separated")->capture_default_str();
  bspeed->add_option("-r,--repetitions", bs_r, "repetitions")->capture_default_str();
  bspeed->add_option("-o,--output", bs_o, "md or json")->capture_default_str();

  CommonOpts cal_co;
  std::string cal_file, cal_out = "retrieval-heads.txt";
  int64_t cal_far = 1024, cal_per_layer = 2;
  auto* cal = app.add_subcommand("calibrate", "pick a model's retrieval heads for --attn lychee from a retrieval prompt");
  cal_co.add(cal);
  cal->add_option("-f,--file", cal_file, "retrieval prompt (e.g. from `bench tasks --task passkey --show`)")->required();
  cal->add_option("--far", cal_far, "attention to tokens further back than this counts as retrieval")->capture_default_str();
  cal->add_option("--per-layer", cal_per_layer, "retrieval heads kept per layer")->capture_default_str();
  cal->add_option("-o,--output", cal_out, "heads file to write")->capture_default_str();

  std::vector<RegisteredCommand> extra = add_bench_suite_commands(bench);
  for (auto& c : add_train_commands(&app)) extra.push_back(std::move(c));

  std::string mm_shape = "smollm2-135m", mm_type = "f16", mm_vocab, mm_out;
  uint64_t mm_seed = 42;
  auto* mm = app.add_subcommand("make-model", "write a random-weight model of a known shape (for benchmarks)");
  mm->add_option("--shape", mm_shape, "shape")->capture_default_str();
  mm->add_option("--type", mm_type, "weight type: f32, f16, bf16, q8_0, q4_0, ...")->capture_default_str();
  mm->add_option("--vocab", mm_vocab, "GGUF file whose tokenizer is copied")->required();
  mm->add_option("-o,--output", mm_out, "output GGUF")->required();
  mm->add_option("--seed", mm_seed, "seed")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*run) return cmd_run(run_co, run_so, run_file.empty() ? run_prompt : "", run_file, run_n, run_no_bos, run_special);
    if (*chat) return cmd_chat(chat_co, chat_so, chat_system, chat_tmpl, chat_n);
    if (*info) return cmd_info(info_path);
    if (*cal) return cmd_calibrate(cal_co, cal_file, cal_far, cal_per_layer, cal_out);
    if (*tokc) return cmd_tokenize(tok_co, tok_prompt, tok_file, tok_no_bos, tok_special, tok_ids);
    if (*ppl) return cmd_perplexity(ppl_co, ppl_file, ppl_chunk);
    if (*bspeed) return cmd_bench_speed(bs_co, bs_p, bs_n, bs_d, bs_r, bs_o);
    if (*mm) return cmd_make_model(mm_shape, mm_type, mm_vocab, mm_out, mm_seed);
    for (const auto& c : extra)
      if (*c.app) return c.run();
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  }
  return 0;
}
