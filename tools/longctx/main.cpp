// longctx: the command-line front end. Subcommands: run, chat, info, tokenize, perplexity,
// bench speed, bench press, make-model.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <algorithm>
#include <memory>
#include <span>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tasks/text.h"
#include "core/log.h"
#include "core/progress.h"
#include "command.h"
#include "options.h"
#include "embedded_model.h"
#include "core/sys.h"
#include "kernels/blas_cpu.h"
#include "kernels/kernels.h"
#include "attention/lychee.h"
#include "kv/block_pool.h"
#include "model/context.h"
#include "model/model.h"
#include "runtime/qttt.h"
#include "model/random_model.h"
#include "runtime/measure.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "dist/comm.h"
#include "dist/context_parallel.h"

namespace {

using lc::Expected;
using lc::Status;


Expected<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return lc::make_error(fmt::format("{}: cannot open prompt file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return lc::make_error(fmt::format("{}: read error", path));
  return ss.str();
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

// Tokens that tokenizing `head` and `head + tail` have in common: where the tail starts in
// the tokens of the whole text (a token that straddles the boundary belongs to the tail).
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

void print_summary(const lc::RequestStats& st, const lc::Context& ctx) {
  fmt::print(stderr,
             "\n\nprompt:     {:6} tokens in {:>8.3f} s = {:>9.2f} tokens/s\n"
             "generation: {:6} tokens in {:>8.3f} s = {:>9.2f} tokens/s\n"
             "memory:     peak RSS {:.1f} MiB, KV cache {:.2f} MiB in use ({:.2f} MiB resident, {:.2f} MiB spilled; "
             "{} tokens seen, {} bytes/token), activations {:.2f} MiB\n",
             st.n_prompt, st.t_prompt, st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0.0,
             st.n_gen, st.t_gen, st.t_gen > 0 ? st.n_gen / st.t_gen : 0.0,
             mib(lc::peak_rss_bytes()), mib(static_cast<int64_t>(ctx.kv().memory().in_use_bytes)),
             mib(static_cast<int64_t>(ctx.kv().memory().resident_bytes)),
             mib(static_cast<int64_t>(ctx.kv().memory().spilled_bytes)), ctx.n_past(),
             ctx.kv().memory().bytes_per_token, mib(static_cast<int64_t>(ctx.activation_bytes())));
  fmt::print(stderr, "method:     rope {}, attention {}{}\n", ctx.rope_plan().describe(), ctx.attention().spec(),
             ctx.press() ? ", kv press " + ctx.press()->spec() : std::string());
}

// Streams generated text to stdout as it comes.
bool print_piece(int32_t, std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return true;
}

Expected<std::unique_ptr<lc::Session>> make_session(const lc::Model& m, const CommonOpts& co,
                                                    const std::string& qttt_spec) {
  lc::SessionParams sp;
  LC_ASSIGN_OR_RETURN(sp.ctx, co.ctx_params());
  LC_ASSIGN_OR_RETURN(sp.qttt, lc::parse_qttt(qttt_spec));
  return lc::Session::create(m, sp);
}

// Options of `run` for context parallelism over MPI (src/dist).
struct CpOpts {
  std::string mode;     // --cp: "" = one process
  double timeout = 60;  // --cp-timeout: seconds any rank waits for another
};

int cmd_run(const CommonOpts& co_in, const SamplingOpts& so, const std::string& prompt_arg,
            const std::string& file, const std::string& question, int64_t n_predict, bool no_special_bos,
            bool parse_special, const std::string& qttt_spec, const std::string& prompt_cache, const CpOpts& cpo,
            bool ignore_eos) {
  if (!prompt_arg.empty() && !file.empty()) return fail("give either -p or -f, not both");
  if (n_predict < 0) return fail("-n must be >= 0");
  if (auto q = lc::parse_qttt(qttt_spec); !q) return fail(q.error().message);
  // --cp: this process holds one shard of the sequence (mpirun starts the others). Errors after
  // MPI is up end every rank (Comm::abort), so that none waits for one that gave up.
  std::unique_ptr<lc::dist::Comm> comm;
  lc::dist::CpParams cp_params;
  if (!cpo.mode.empty()) {
    auto p = lc::dist::parse_cp(cpo.mode);
    if (!p) return fail(p.error().message);
    cp_params = *p;
    if (!prompt_cache.empty()) return fail("--cp: --prompt-cache is not supported (each rank holds one shard)");
    if (!qttt_spec.empty()) return fail("--cp: --qttt trains on the whole cache, which no rank holds");
    auto c = lc::dist::Comm::init(nullptr, nullptr, cpo.timeout);
    if (!c) return fail(c.error().message);
    comm = std::move(*c);
  }
  auto bail = [&](const std::string& msg) {
    if (comm) comm->abort(msg);
    return fail(msg);
  };
  const bool speak = !comm || comm->rank() == 0;  // one rank prints the text
  std::string prompt = prompt_arg;
  if (!file.empty()) {
    auto t = read_file(file);
    if (!t) return bail(t.error().message);
    prompt = std::move(*t);
  }
  auto sp = so.params();
  if (!sp) return bail(sp.error().message);
  auto model = load_model(co_in);
  if (!model) return bail(model.error().message);
  if (lc::Status s = lc::check_logit_bias_vocab(*sp, (*model)->hparams().n_vocab); !s) return bail(s.message());
  const lc::Tokenizer& tok = (*model)->tokenizer();
  // --question: appended after the prompt (tokenised as one text); a query-agnostic press
  // compresses the prompt before the question is read, and qTTT trains on the prompt alone.
  lc::Prompt pr;
  pr.tokens = tok.encode(prompt + question, !no_special_bos, parse_special);
  if (!question.empty())
    pr.n_context = static_cast<int64_t>(common_prefix(tok.encode(prompt, !no_special_bos, parse_special), pr.tokens));
  CommonOpts co = co_in;
  if (comm && cp_params.mode == lc::dist::CpMode::kRing) {
    // Ring attention evaluates each rank's shard in one forward chunk.
    // (+1: a zigzag shard's two pieces of n / 2N tokens each may round up together)
    const int64_t shard = (static_cast<int64_t>(pr.tokens.size()) + comm->size() - 1) / comm->size() + 1;
    co.n_batch = std::clamp<int64_t>(shard, co.n_batch, lc::kMaxBatch);
  }
  auto session = make_session(**model, co, qttt_spec);
  if (!session) return bail(session.error().message);
  if (Status s = (*session)->validate(pr); !s) return bail(s.message());
  std::unique_ptr<lc::dist::ContextParallel> cp;
  if (comm) {
    auto c = lc::dist::ContextParallel::create(*comm, cp_params, (*session)->context());
    if (!c) return bail(c.error().message);
    cp = std::move(*c);
    const int64_t n = static_cast<int64_t>(pr.tokens.size());
    cp->set_query_tokens(pr.n_context >= 0 && pr.n_context < n ? n - pr.n_context : 1);
    fmt::print(stderr, "cp {}: rank {}/{} started, pid {}\n", cp_params.spec(), comm->rank(), comm->size(),
               static_cast<long>(getpid()));
    std::fflush(stderr);
  }
  // --prompt-cache: a saved session continues (the prompt's prefix it holds is not evaluated
  // again), and the session is saved when the request ends.
  bool resume = false;
  if (!prompt_cache.empty()) {
    if (Status s = (*session)->check_multi_turn(); !s) return fail("--prompt-cache: " + s.message());
    std::error_code ec;
    if (std::filesystem::exists(prompt_cache, ec)) {
      if (Status s = (*session)->load(prompt_cache); !s) return fail("--prompt-cache: " + s.message());
      resume = true;
    }
  }
  lc::Sampler sampler(*sp);
  const std::string shown = prompt + question;
  if (speak) {
    std::fputs(shown.size() > 2000 ? "" : shown.c_str(), stdout);
    std::fflush(stdout);
  }
  lc::GenerateOptions go;
  go.n_predict = n_predict;
  go.qttt_seed = sp->seed;
  go.ignore_eos = ignore_eos;
  // A long prefill shows a progress line (tokens, rate, time left) on a terminal.
  std::unique_ptr<lc::Progress> prog;
  (*session)->set_progress([&prog, speak](int64_t done, int64_t total) {
    if (total < 4096 || !speak) return;
    if (!prog) prog = std::make_unique<lc::Progress>("prefill", total);
    prog->update(done);
    if (done >= total) {
      prog->finish();
      prog.reset();
    }
  });
  const lc::TokenCallback on_token = speak ? lc::TokenCallback(print_piece)
                                           : lc::TokenCallback([](int32_t, std::string_view) { return true; });
  auto st = resume ? (*session)->continue_with(pr.tokens, sampler, go, on_token)
                    : (*session)->run(pr, sampler, go, on_token);
  if (!st) return bail(st.error().message);
  if (speak) print_summary(*st, (*session)->context());
  if (comm) {
    const lc::dist::CpStats& cs = cp->stats();
    const lc::KvMemory mem = (*session)->context().kv().memory();
    // One line per rank, in rank order (each rank prints its own after the one before).
    for (int r = 0; r < comm->size(); ++r) {
      if (r == comm->rank())
        fmt::print(stderr, "cp {}: rank {}/{}: tokens [{}, {}){}, KV {:.2f} MiB, peak RSS {:.1f} MiB, {:.3f} s in "
                   "communication, {} bytes sent\n", cp_params.spec(), r, comm->size(), cs.shard_first,
                   cs.shard_end,
                   cs.tail_end > cs.tail_first ? fmt::format(" and [{}, {})", cs.tail_first, cs.tail_end) : "",
                   mib(static_cast<int64_t>(mem.in_use_bytes)), mib(lc::peak_rss_bytes()), cs.t_comm,
                   cs.bytes_sent);
      if (r == comm->rank() && cs.prefill_pairs > 0)
        fmt::print(stderr, "cp {}: rank {}/{}: prefill attended {} (query, key) pairs per layer{}\n",
                   cp_params.spec(), r, comm->size(), cs.prefill_pairs,
                   cs.star_blocks > 0 ? fmt::format(" in {} block(s)", cs.star_blocks) : "");
      std::fflush(stderr);
      if (Status s = comm->barrier(); !s) return bail(s.message());
    }
  }
  if (!prompt_cache.empty()) {
    if (Status s = (*session)->save(prompt_cache); !s) return fail("--prompt-cache: " + s.message());
    fmt::print(stderr, "prompt cache: {} prompt tokens reused, {} evaluated; saved {}\n", st->n_reused,
               st->n_prompt, prompt_cache);
  }
  if (!qttt_spec.empty()) fmt::print(stderr, "{}\n", lc::qttt_summary(st->qttt));
  return 0;
}

int cmd_chat(const CommonOpts& co, const SamplingOpts& so, const std::string& system,
             const std::string& tmpl_name, int64_t n_predict) {
  auto sp = so.params();
  if (!sp) return fail(sp.error().message);
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  if (lc::Status s = lc::check_logit_bias_vocab(*sp, (*model)->hparams().n_vocab); !s) return fail(s.message());
  const lc::Tokenizer& tok = (*model)->tokenizer();
  lc::ChatTemplate tmpl = lc::detect_chat_template((*model)->file(), tok);
  if (!tmpl_name.empty()) {
    auto t = lc::chat_template_from_name(tmpl_name);
    if (!t) return fail(t.error().message);
    tmpl = *t;
  }
  auto session = make_session(**model, co, "");
  if (!session) return fail(session.error().message);
  if (Status s = (*session)->check_multi_turn(); !s) return fail(s.message());
  fmt::print(stderr, "chat template: {}. Type a message; an empty line or Ctrl-D ends.\n",
             lc::chat_template_name(tmpl));
  lc::Sampler sampler(*sp);
  std::vector<lc::ChatMessage> msgs;
  if (!system.empty()) msgs.push_back({"system", system});
  lc::RequestStats total;
  lc::GenerateOptions go;
  go.n_predict = n_predict;
  std::string line;
  for (;;) {
    fmt::print(stderr, "\n> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    msgs.push_back({"user", line});
    // The whole conversation, re-rendered; the Session evaluates what the cache does not hold.
    // Special-token text typed into a message stays text: only the template's markup is parsed.
    std::vector<int32_t> ids = lc::tokenize_chat(tok, tmpl, msgs, true, true);
    auto st = (*session)->continue_with(std::move(ids), sampler, go, print_piece);
    if (!st) return fail(st.error().message);
    std::fputc('\n', stdout);
    total.n_prompt += st->n_prompt;
    total.n_gen += st->n_gen;
    total.t_prompt += st->t_prompt;
    total.t_gen += st->t_gen;
    msgs.push_back({"assistant", st->text});
  }
  print_summary(total, (*session)->context());
  return 0;
}

// LycheeDecode: finds the heads that attend far back on a retrieval prompt and writes them to a
// file for --attn lychee:heads=FILE.
int cmd_calibrate(const CommonOpts& co, const std::string& file, int64_t far, int64_t per_layer, int64_t total,
                  const std::string& out) {
  if (far < 1) return fail("--far must be >= 1");
  if (per_layer < 1) return fail("--per-layer must be >= 1");
  if (total < 0) return fail("--total must be >= 1 (or 0: --per-layer)");
  auto text = read_file(file);
  if (!text) return fail(text.error().message);
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  const lc::HParams& hp = (*model)->hparams();
  if (per_layer > hp.n_head) return fail(fmt::format("--per-layer {} exceeds the {} heads per layer",
                                                      per_layer, hp.n_head));
  if (total > hp.n_layer * hp.n_head)
    return fail(fmt::format("--total {} exceeds the model's {} heads", total,
                            hp.n_layer * hp.n_head));
  lc::AttnShape as{hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.head_dim_v, 0.0f};
  auto cal = lc::make_lychee_calibrator(as, far);
  if (!cal) return fail(cal.error().message);
  const lc::LycheeCalibrator* stats = cal->get();
  auto cp = co.ctx_params();
  if (!cp) return fail(cp.error().message);
  const auto ids = (*model)->tokenizer().encode(*text, true, false);
  if (static_cast<int64_t>(ids.size()) <= far)
    return fail(fmt::format("the calibration prompt has {} tokens; it needs more than --far {}",
                            ids.size(), far));
  cp->n_ctx = std::max<int64_t>(cp->n_ctx, static_cast<int64_t>(ids.size()));
  auto ctx = lc::Context::create(**model, *cp, std::move(*cal));
  if (!ctx) return fail(ctx.error().message);
  Status s = (*ctx)->decode(ids, lc::Logits::kNone);
  if (!s) return fail(s.message());
  const lc::RetrievalHeads rh = total > 0 ? lc::pick_retrieval_heads_total(stats->stats(), total)
                                           : lc::pick_retrieval_heads(stats->stats(), per_layer);
  s = lc::save_retrieval_heads(out, rh);
  if (!s) return fail(s.message());
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    fmt::print("layer {}:", il);
    for (int32_t h : rh.heads[static_cast<size_t>(il)])
      fmt::print(" {} (far mass {:.3f})", h, stats->stats().mean(il, h));
    fmt::print("\n");
  }
  fmt::print(stderr, "wrote {}; use --attn lychee:{}heads={}\n", out, total > 0 ? "share=head," : "",
             out);
  return 0;
}

int cmd_info(const std::string& path) {
  auto model = lc::Model::load(path);
  if (!model) return fail(model.error().message);
  const lc::Model& m = **model;
  const lc::HParams& hp = m.hparams();
  const lc::Tokenizer& tok = m.tokenizer();
  const auto& f = m.file();
  fmt::print("file:            {} (GGUF v{}, {:.2f} MiB, {} tensors, {} metadata keys)\n", path,
             f.version(), mib(static_cast<int64_t>(f.file_size())), f.tensors().size(), f.metadata().size());
  if (auto n = f.get_string("general.name")) fmt::print("name:            {}\n", *n);
  fmt::print("architecture:    {}\n", lc::arch_name(hp.arch));
  fmt::print("n_vocab:         {}\nn_ctx_train:     {}\nn_embd:          {}\nn_layer:         {}\n",
             hp.n_vocab, hp.n_ctx_train, hp.n_embd, hp.n_layer);
  fmt::print("n_head:          {}\nn_head_kv:       {} (GQA {})\nhead_dim:        {} (v {})\nn_ff:            {}\n",
             hp.n_head, hp.n_head_kv, hp.n_gqa(), hp.head_dim,
             hp.head_dim_v, hp.n_ff);
  fmt::print("rms_eps:         {:g}\n", hp.rms_eps);
  fmt::print("rope:            {} pairs, n_rot {}, base {:g}, scaling {} (freq_scale {:g}, orig ctx {}){}\n",
             hp.rope_kind == lc::RopeKind::kNorm ? "adjacent" : "neox", hp.n_rot, hp.rope_base,
             lc::rope_scaling_name(hp.rope_scaling), hp.rope_freq_scale, hp.rope_orig_ctx,
             m.rope_freq_factors().empty() ? "" : ", rope_freqs tensor present");
  if (hp.fixed_distance > 0 || hp.logn_orig > 0)
    fmt::print("long context:    trained distance ceiling {}, logn from {} (defaults: --attn fixed:distance={}, "
               "--rope logn:orig={}; 0: none)\n",
               hp.fixed_distance, hp.logn_orig, hp.fixed_distance,
               hp.logn_orig);
  fmt::print("output:          {}\n", m.tied_output() ? "tied to token_embd" : "separate output.weight");
  fmt::print("tokenizer:       {} (pre {}), {} tokens, bos {}, eos {}, add_bos {}, add_eos {}\n",
             tok.model_name(), tok.pre_name().empty() ? "-" : tok.pre_name(), tok.n_vocab(),
             tok.bos(), tok.eos(), tok.add_bos() ? "yes" : "no", tok.add_eos() ? "yes" : "no");
  fmt::print("chat template:   {}\n", lc::chat_template_name(lc::detect_chat_template(f, tok)));
  std::map<std::string, std::pair<int, size_t>> by_type;
  for (const auto& t : f.tensors()) {
    auto& e = by_type[lc::dtype_name(t.type)];
    e.first++;
    e.second += t.n_bytes;
  }
  fmt::print("weights:         {:.2f} MiB:", mib(static_cast<int64_t>(m.weight_bytes())));
  for (const auto& [name, e] : by_type) fmt::print(" {} x{} ({:.2f} MiB)", name, e.first, mib(static_cast<int64_t>(e.second)));
  fmt::print("\n\ntensors:\n");
  for (const auto& t : f.tensors()) {
    std::string shape;
    for (int d = 0; d < t.n_dims; ++d) shape += (d ? ", " : "") + std::to_string(t.ne[d]);
    fmt::print("  {:<32} {:<6} [{}] {} bytes\n", t.name, lc::dtype_name(t.type), shape, t.n_bytes);
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
  // Only the tokenizer is read, so a vocabulary-only GGUF does (as llama-tokenize's vocab_only).
  auto loaded = load_tokenizer(co);
  if (!loaded) return fail(loaded.error().message);
  const lc::Tokenizer& tok = *loaded->tok;
  auto ids = tok.encode(text, !no_bos, parse_special);
  if (ids_only) {
    fmt::print("[");
    for (size_t i = 0; i < ids.size(); ++i) fmt::print("{}{}", i ? ", " : "", ids[i]);
    fmt::print("]\n");
    return 0;
  }
  for (int32_t id : ids) fmt::print("{:6} -> '{}'\n", id, tok.token_to_piece(id, true));
  fmt::print(stderr, "{} tokens\n", ids.size());
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
  auto session = lc::Session::create(**model, lc::SessionParams{cp});
  if (!session) return fail(session.error().message);
  const lc::Tokenizer& tok = (*model)->tokenizer();
  auto ids = tok.encode(*text, true, false);
  fmt::print(stderr, "perplexity: {} tokens, chunks of {}\n", ids.size(), chunk);
  const double t0 = lc::now_seconds();
  auto r = lc::perplexity((*session)->context(), ids, chunk, [](int64_t i, double ppl) {
    fmt::print("[{}]{:.4f},", i + 1, ppl);
    std::fflush(stdout);
  });
  if (!r) return fail(r.error().message);
  const double dt = lc::now_seconds() - t0;
  fmt::print("\nFinal estimate: PPL = {:.4f} +/- {:.5f}\n", r->ppl, r->ppl_err);
  fmt::print(stderr, "{} chunks, {} scored tokens, {:.2f} s ({:.1f} tokens/s), peak RSS {:.1f} MiB\n",
             r->n_chunks, r->n_scored, dt, r->n_chunks * chunk / dt,
             mib(lc::peak_rss_bytes()));
  return 0;
}

// One row of `bench speed`: a test at a depth with one attention backend.
struct SpeedRow {
  std::string attn;
  lc::SpeedTest t;
  lc::KvMemory kv;  // at the depth the test started from
  int64_t peak_rss = 0;  // the process's peak so far
};

int cmd_bench_speed(const CommonOpts& co, const std::vector<int64_t>& ps, const std::vector<int64_t>& ns,
                    const std::vector<int64_t>& ds, int reps, const std::string& output,
                    std::vector<std::string> attns, const std::string& fill_attn, bool warmup, bool interleave,
                    bool limits, int64_t limits_mib, int64_t budget) {
  if (reps < 1) return fail("-r must be >= 1");
  if (output != "md" && output != "json") return fail("--format must be md or json");
  if (attns.empty()) attns.push_back(co.attn);
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
  cp.attn = attns[0];
  auto session = lc::Session::create(**model, lc::SessionParams{cp});
  if (!session) return fail(session.error().message);
  lc::Context& c = (*session)->context();
  // The model's default attention, named as it runs.
  for (auto& a : attns)
    if (a.empty()) a = c.attention().spec();
  // Equal budgets: every sparse backend set to read `budget` keys per query head.
  if (budget > 0)
    for (auto& a : attns) {
      auto eq = lc::equal_budget_spec(a, budget);
      if (!eq) return fail(eq.error().message);
      a = *eq;
    }
  // Every spec is checked before the first (possibly long) fill.
  for (const auto& a : attns)
    if (auto st = c.set_attention(a); !st.is_ok()) return fail(st.message());
  if (!fill_attn.empty())
    if (auto st = c.set_attention(fill_attn); !st.is_ok()) return fail("--fill-attn: " + st.message());
  const int threads = c.pool().size();
  // The machine's limits (measured after the tests, so that the buffers do not count in the
  // tests' peak RSS), on the engine's own threads: read bandwidth over buffers several times
  // the last-level cache, and register-only peaks.
  lc::kernels::Bandwidth bw;
  lc::kernels::PeakOps peak;
  const int64_t llc = lc::kernels::last_level_cache_bytes();
  auto measure_limits = [&] {
    if (!limits) return;
    const int64_t buf = limits_mib > 0 ? limits_mib << 20
                                       : std::clamp<int64_t>(4 * llc, int64_t{128} << 20, int64_t{512} << 20);
    bw = lc::kernels::measure_bandwidth(c.pool(), buf, 5);
    peak = lc::kernels::measure_peak(c.pool(), int64_t{1} << 22);
  };
  const lc::TokenCost cost = lc::token_cost(**model);
  auto bound_of = [&](const SpeedRow& r) {
    if (!limits) return 0.0;
    if (r.t.n_prompt > 0) return lc::prefill_bound_tps(cost, r.t.n_prompt, r.t.depth, peak);
    const double mean_ctx = static_cast<double>(r.t.depth) + static_cast<double>(r.t.n_gen + 1) / 2;
    return lc::decode_bound_tps(cost, static_cast<double>(r.kv.bytes_per_token), mean_ctx, bw.read_gbps);
  };
  std::vector<SpeedRow> rows;
  auto report = [&](const SpeedRow& row) {
    rows.push_back(row);
    if (output != "md") return;
    fmt::print(stderr, "{} {}: {:.2f} t/s\n", row.attn, row.t.name, row.t.mean());
    const auto& ps = row.t.pool;
    if (ps.regions > 0 && row.t.timed_s > 0) {
      const double tokens = static_cast<double>((row.t.n_prompt > 0 ? row.t.n_prompt : row.t.n_gen) *
                                                static_cast<int64_t>(row.t.tps.size()));
      fmt::print(stderr,
                 "  threads: {:.0f} parallel regions per token, {:.1f} us each; of the time, {:.1f}% outside them "
                 "and {:.1f}% the caller waiting for the others (latest start {:.2f} us after the hand-out)\n",
                 static_cast<double>(ps.regions) / tokens, 1e6 * ps.region_s / static_cast<double>(ps.regions),
                 100.0 * (row.t.timed_s - ps.region_s) / row.t.timed_s, 100.0 * ps.wait_s / row.t.timed_s,
                 1e6 * ps.late_s / static_cast<double>(ps.regions));
    }
  };
  if (interleave) {
    // Repetitions go round the backends: repetition r of every backend runs before repetition
    // r + 1 of any, so a change in the machine's speed during the run (memory bandwidth on a
    // shared host drifts by tens of percent over minutes) falls on every backend alike and
    // their ratios stay comparable. Each turn starts a fresh backend over the same fill, with
    // its own untimed warm-up (which also rebuilds the backend's key summaries).
    for (auto d : ds) {
      auto one = [&](int64_t p, int64_t n) -> bool {
        std::vector<SpeedRow> acc(attns.size());
        for (int r = 0; r < reps; ++r)
          for (size_t ai = 0; ai < attns.size(); ++ai) {
            Status st = c.set_attention(attns[ai]);
            if (st.is_ok()) st = lc::bench_fill(c, d, fill_attn, 1234);
            if (!st.is_ok()) {
              fail(st.message());
              return false;
            }
            const lc::KvMemory kv = c.kv().memory();
            auto res = lc::bench_speed(c, p, n, 1, warmup, 1234 + static_cast<uint64_t>(r));
            if (!res) {
              fail(res.error().message);
              return false;
            }
            SpeedRow& a = acc[ai];
            if (r == 0) a = SpeedRow{c.attention().spec(), *res, kv, 0};
            else {
              a.t.tps.push_back(res->tps.at(0));
              a.t.pool += res->pool;
              a.t.timed_s += res->timed_s;
            }
            a.peak_rss = lc::peak_rss_bytes();
          }
        for (const auto& a : acc) report(a);
        return true;
      };
      for (auto p : ps)
        if (p > 0 && !one(p, 0)) return 1;
      for (auto n : ns)
        if (n > 0 && !one(0, n)) return 1;
    }
  }
  for (auto d : interleave ? std::vector<int64_t>{} : ds) {
    // One fill per depth, shared by every backend (each truncates back to it); ascending
    // depths extend the previous fill unless a backend (streaming) evicted tokens.
    for (const auto& a : attns) {
      // A no-op when the cache still holds the depth; a refill after a backend that evicts.
      if (auto st = c.set_attention(a); !st.is_ok()) return fail(st.message());
      if (auto st = lc::bench_fill(c, d, fill_attn, 1234); !st.is_ok()) return fail(st.message());
      auto one = [&](int64_t p, int64_t n) -> bool {
        const lc::KvMemory kv = c.kv().memory();
        auto r = lc::bench_speed(c, p, n, reps, warmup, 1234);
        if (!r) {
          fail(r.error().message);
          return false;
        }
        report(SpeedRow{c.attention().spec(), *r, kv, lc::peak_rss_bytes()});
        return true;
      };
      for (auto p : ps)
        if (p > 0 && !one(p, 0)) return 1;
      for (auto n : ns)
        if (n > 0 && !one(0, n)) return 1;
    }
  }
  measure_limits();
  const auto& m = **model;
  std::map<std::string, int> types;
  for (const auto& t : m.file().tensors())
    if (t.n_dims == 2) types[lc::dtype_name(t.type)]++;
  std::string type_str;
  for (const auto& [k, v] : types) type_str += (type_str.empty() ? "" : "+") + k;
  const std::string model_name = co.model.empty() ? kEmbeddedModelName : co.model;
  // Speed relative to the first -a backend on the same test (prompt/generation length and
  // depth). Interleaved, the mean of the per-turn ratios: each turn's backends ran back to
  // back, so a drift in machine speed cancels out of them.
  std::vector<double> vs_first(rows.size(), 1.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const SpeedRow* first = nullptr;
    for (const auto& r : rows)
      if (r.t.name == rows[i].t.name) {
        first = &r;
        break;
      }
    if (!first || first->t.mean() <= 0) continue;
    const auto& a = rows[i].t.tps;
    const auto& b = first->t.tps;
    if (interleave && a.size() == b.size()) {
      double sum = 0;
      for (size_t k = 0; k < a.size(); ++k) sum += a[k] / b[k];
      vs_first[i] = sum / static_cast<double>(a.size());
    } else {
      vs_first[i] = rows[i].t.mean() / first->t.mean();
    }
  }
  if (output == "json") {
    nlohmann::json j = nlohmann::json::array();
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const SpeedRow& r = rows[ri];
      j.push_back({{"model", model_name}, {"weights", type_str}, {"size_bytes", m.weight_bytes()},
                   {"threads", threads}, {"n_batch", co.n_batch}, {"attn", r.attn}, {"fill_attn", fill_attn},
                   {"test", r.t.name}, {"n_prompt", r.t.n_prompt}, {"n_gen", r.t.n_gen}, {"n_depth", r.t.depth},
                   {"samples_ts", r.t.tps}, {"avg_ts", r.t.mean()}, {"stddev_ts", r.t.stddev()},
                   {"kv_bytes_per_token", r.kv.bytes_per_token}, {"kv_in_use_bytes", r.kv.in_use_bytes},
                   {"kv_resident_bytes", r.kv.resident_bytes}, {"peak_rss_bytes", r.peak_rss},
                   {"vs_first", vs_first[ri]},
                   {"pool", {{"regions", r.t.pool.regions}, {"region_s", r.t.pool.region_s},
                             {"wait_s", r.t.pool.wait_s}, {"late_s", r.t.pool.late_s}, {"timed_s", r.t.timed_s}}}});
      if (limits) {
        const double b = bound_of(r);
        j.back()["bound_ts"] = b;
        j.back()["of_bound"] = b > 0 ? r.t.mean() / b : 0.0;
      }
    }
    if (limits && !j.empty())
      j.front()["machine"] = {{"isa", lc::kernels::kernel_isa()}, {"llc_bytes", llc},
                              {"read_gbps", bw.read_gbps}, {"triad_gbps", bw.triad_gbps},
                              {"buffer_bytes", bw.buffer_bytes}, {"f32_gflops", peak.f32_gflops},
                              {"bf16_gflops", peak.bf16_gflops}, {"int8_gops", peak.int8_gops}};
    fmt::print("{}\n", j.dump(1));
  } else {
    if (limits) {
      fmt::print("machine ({}, {} threads): read {:.1f} GB/s, triad {:.1f} GB/s over {:.0f} MiB buffers (LLC {:.0f} "
                 "MiB); peak f32 {:.0f} GFLOP/s, bf16 {:.0f} GFLOP/s, int8 {:.0f} GOP/s\n",
                 lc::kernels::kernel_isa(), threads, bw.read_gbps, bw.triad_gbps, mib(bw.buffer_bytes), mib(llc),
                 peak.f32_gflops, peak.bf16_gflops, peak.int8_gops);
      fmt::print("bound: tg reads every matrix ({:.1f} MiB) and the K/V of its context at the read bandwidth; pp "
                 "does its multiply-adds at the peak of its kernels' arithmetic\n\n",
                 mib(static_cast<int64_t>(cost.layer_bytes + cost.output_bytes)));
    }
    fmt::print("| model | weights | threads | attn | test | t/s | vs first |{} KV B/token | KV in use | peak RSS |\n"
               "|---|---|---:|---|---|---:|---:|{}---:|---:|---:|\n",
               limits ? " of bound |" : "", limits ? "---:|" : "");
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const SpeedRow& r = rows[ri];
      std::string of_bound;
      if (limits) {
        const double b = bound_of(r);
        of_bound = b > 0 ? fmt::format(" {:.0f}% of {:.0f} |", 100 * r.t.mean() / b, b) : " - |";
      }
      fmt::print("| {} | {} | {} | {} | {} | {:.2f} ± {:.2f} | {:.2f}x |{} {} | {:.1f} MiB | {:.1f} MiB |\n",
                 model_name, type_str, threads, r.attn, r.t.name, r.t.mean(), r.t.stddev(), vs_first[ri], of_bound,
                 r.kv.bytes_per_token, mib(static_cast<int64_t>(r.kv.in_use_bytes)), mib(r.peak_rss));
    }
    if (!fill_attn.empty()) fmt::print("\ncache filled to each depth with --fill-attn {} (not timed)\n", fill_attn);
  }
  return 0;
}

// KV-cache compression cost on random tokens: one press, one context length per row (run it
// once per press so that the peak RSS is the press's own). KV bytes are token-exact: held
// tokens x bytes per token (K + V of one (layer, head) slot), before (the whole prompt) and
// after compression; `in use` is the block-granular memory the cache really holds.
int cmd_bench_press(const CommonOpts& co, const std::vector<int64_t>& lens, int64_t n_gen, bool header,
                    uint64_t seed, const std::string& fill_attn) {
  if (n_gen < 1) return fail("-n must be >= 1");
  if (lens.empty()) return fail("-L: no length given");
  auto model = load_model(co);
  if (!model) return fail(model.error().message);
  const std::string press_name = co.kv_press.empty() ? "none" : co.kv_press;
  if (header)
    fmt::print("| press | context | KV before (MiB) | KV after (MiB) | KV in use (MiB) | prefill (s) | compression (s) | "
               "decode (tok/s) | peak RSS (MiB) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t L : lens) {
    auto cpe = co.ctx_params();
    if (!cpe) return fail(cpe.error().message);
    lc::ContextParams cp = *cpe;
    cp.n_ctx = std::max(cp.n_ctx, L + n_gen + 64);
    auto session = lc::Session::create(**model, lc::SessionParams{cp});
    if (!session) return fail(session.error().message);
    lc::Context& c = (*session)->context();
    const int32_t nv = (*model)->tokenizer().n_vocab();
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> pick(0, nv - 1);
    std::vector<int32_t> toks(static_cast<size_t>(L));
    for (auto& t : toks) t = pick(rng);
    // --fill-attn: the prompt (and the press, which scores with its own exact arithmetic) runs
    // under the fill backend; decoding over the compressed cache runs under --attn.
    const std::string own = c.attention().spec();
    if (!fill_attn.empty())
      if (auto st = c.set_attention(fill_attn); !st.is_ok()) return fail("--fill-attn: " + st.message());
    double t0 = lc::now_seconds();
    Status s = c.decode(toks, lc::Logits::kLast);
    if (!s) return fail(s.message());
    const double t_prefill = lc::now_seconds() - t0;
    if (!fill_attn.empty())
      if (auto st = c.set_attention(own); !st.is_ok()) return fail("--attn: " + st.message());
    const lc::KvCache& kv = c.kv();
    const lc::KvMemory mem = kv.memory();
    int64_t held = 0;
    for (int64_t il = 0; il < kv.n_layer(); ++il)
      for (int64_t h = 0; h < kv.n_head_kv(); ++h) held += kv.n_tokens(il, h);
    const double slot = static_cast<double>(mem.bytes_per_token) / static_cast<double>(kv.n_layer() * kv.n_head_kv());
    const double before = static_cast<double>(L) * static_cast<double>(mem.bytes_per_token);
    const double after = static_cast<double>(held) * slot;
    // Greedy decoding over the compressed cache.
    t0 = lc::now_seconds();
    for (int64_t i = 0; i < n_gen; ++i) {
      const float* lg = c.logits(0);
      const int32_t id = static_cast<int32_t>(std::max_element(lg, lg + nv) - lg);
      s = c.decode(std::span<const int32_t>(&id, 1), lc::Logits::kLast);
      if (!s) return fail(s.message());
    }
    const double t_dec = lc::now_seconds() - t0;
    fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | {:.0f} |\n", press_name, L,
               mib(static_cast<int64_t>(before)), mib(static_cast<int64_t>(after)),
               mib(static_cast<int64_t>(mem.in_use_bytes)), t_prefill - c.press_seconds(), c.press_seconds(),
               static_cast<double>(n_gen) / t_dec, mib(lc::peak_rss_bytes()));
    std::fflush(stdout);
  }
  return 0;
}

int cmd_make_model(const std::string& shape, const std::string& type, const std::string& vocab,
                   const std::string& out, uint64_t seed, int64_t layers) {
  auto shaped = lc::model_shape(shape);
  if (!shaped) return fail("--shape: " + shaped.error().message);
  lc::RandomModelSpec spec = *shaped;
  if (Status st = lc::set_weight_type(spec, type); !st) return fail("--type: " + st.message());
  if (layers != 0) {
    if (layers < 1 || layers > 1024) return fail(fmt::format("--layers: {} is not in 1..1024", layers));
    spec.n_layer = layers;
  }
  spec.vocab_path = vocab;
  spec.seed = seed;
  Status s = lc::write_random_model(spec, out);
  if (!s) return fail(s.message());
  fmt::print(stderr, "wrote {}\n", out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  lc::kernels::reexec_for_faster_blas(argv);  // before anything else: it may replace this process
  CLI::App app{"longctx: long-context inference engine for GGUF models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for all subcommands");

  CommonOpts run_co;
  SamplingOpts run_so;
  std::string run_prompt = "Once upon a time", run_file, run_question;
  int64_t run_n = 128;
  bool run_no_bos = false, run_special = false, run_no_special = false;
  auto* run = app.add_subcommand("run", "generate a continuation of a prompt, streamed as it is produced");
  run_co.add(run);
  run_so.add(run);
  run->add_option("-p,--prompt", run_prompt, "prompt text")->capture_default_str();
  run->add_option("-f,--file", run_file, "read the prompt from a file");
  run->add_option("--question", run_question, "text appended after the prompt; a query-agnostic press "
                  "(--kv-press ...,query=agnostic) compresses the prompt before reading it");
  run->add_option("-n,--n-predict", run_n, "tokens to generate")->capture_default_str();
  run->add_flag("--no-bos", run_no_bos, "do not add the BOS/EOS tokens the model asks for");
  // As llama-cli, which tokenizes the prompt with parse_special = true.
  auto* run_ps = run->add_flag("--parse-special", run_special, "turn special-token text in the prompt into those tokens (the "
                "default, as llama-cli does)");
  run->add_flag("--no-parse-special", run_no_special, "keep special-token text in the prompt as text")->excludes(run_ps);
  std::string run_prompt_cache;
  run->add_option("--prompt-cache", run_prompt_cache,
                  "session file: when it exists, the run continues from it (the prompt's prefix it holds is not "
                  "evaluated again); the session is saved to it at the end");
  bool run_ignore_eos = false;
  run->add_flag("--ignore-eos", run_ignore_eos, "keep generating after an end-of-generation token (as llama-cli)");
  CpOpts run_cp;
  run->add_option("--cp", run_cp.mode,
                  "context parallelism over MPI, under `mpirun -np N`: ring[:split=zigzag|contiguous] (exact ring "
                  "attention; zigzag balances the ranks' work) or star[:anchor=A,block=B|blocks=K] (Star Attention; block: tokens per "
                  "context block, blocks: how many, several per rank); each rank holds 1/N of the prompt's KV cache (docs/scale-out.md)");
  run->add_option("--cp-timeout", run_cp.timeout,
                  "seconds a rank waits for another before it ends the job with an error naming it")
      ->capture_default_str();
  std::string run_qttt;
  run->add_option("--qttt", run_qttt, "query-only test-time training after the prefill: steps=N,lr=X,span=S "
                  "(Adam on W_q over spans of the context; see docs/qttt.md)");

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
  bool tok_no_bos = false, tok_special = false, tok_no_special = false, tok_ids = false;
  auto* tokc = app.add_subcommand("tokenize", "print the token ids and pieces of a text (-m may be a vocabulary-only "
                                  "GGUF)");
  tok_co.add(tokc);
  tokc->add_option("-p,--prompt", tok_prompt, "text");
  tokc->add_option("-f,--file", tok_file, "read the text from a file");
  tokc->add_flag("--no-bos", tok_no_bos, "do not add BOS/EOS");
  // As llama-tokenize: special-token text is parsed unless --no-parse-special.
  auto* tok_ps = tokc->add_flag("--parse-special", tok_special, "parse special-token text into those tokens (the default, as "
                 "llama-tokenize)");
  tokc->add_flag("--no-parse-special", tok_no_special, "keep special-token text as text")->excludes(tok_ps);
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
  std::vector<int64_t> bs_p{512}, bs_n{128}, bs_d{0};
  std::string bs_o = "md";
  int bs_r = 5;
  auto* bspeed = bench->add_subcommand("speed", "prompt and generation tokens/s, like llama-bench");
  bs_co.add(bspeed);
  bspeed->add_option("-p,--n-prompt", bs_p, "prompt lengths, comma-separated")
      ->delimiter(',')->check(CLI::Range(int64_t{0}, int64_t{1} << 30))->capture_default_str();
  bspeed->add_option("-n,--n-gen", bs_n, "generation lengths, comma-separated")
      ->delimiter(',')->check(CLI::Range(int64_t{0}, int64_t{1} << 30))->capture_default_str();
  bspeed->add_option("-d,--n-depth", bs_d, "context depths, comma-separated")
      ->delimiter(',')->check(CLI::Range(int64_t{0}, int64_t{1} << 30))->capture_default_str();
  bspeed->add_option("-r,--repetitions", bs_r, "repetitions")->capture_default_str();
  bspeed->add_option("--format", bs_o, "md or json")->capture_default_str();
  bspeed->add_option("-o,--output", bs_o, "same as --format")->group("");  // the older name
  std::vector<std::string> bs_attns;
  std::string bs_fill;
  bool bs_no_warmup = false;
  bspeed->add_option("-a,--attn-each", bs_attns,
                     "attention backends to time in turn over the same filled cache (repeat the flag; "
                     "default: --attn)");
  bspeed->add_option("--fill-attn", bs_fill,
                     "attention backend that fills the cache to each depth (not timed; default: the timed one), "
                     "e.g. infllm:sinks=4,local=64,topk=0 to fill 256K tokens in minutes");
  bspeed->add_flag("--no-warmup", bs_no_warmup, "skip the untimed warm-up run of each test");
  bool bs_interleave = false, bs_no_limits = false;
  int64_t bs_budget = 0;
  bspeed->add_option("--budget", bs_budget,
                     "equal budgets: set every -a backend to read this many keys per query head when decoding "
                     "(docs/attention.md lists how each is set; dense stays the baseline), tokens")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  int64_t bs_limits_mib = 0;
  bspeed->add_option("--limits-mib", bs_limits_mib,
                     "size of each of the bandwidth measurement's three buffers, MiB (0: 4 x the last-level cache, "
                     "128 to 512)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))->capture_default_str();
  bspeed->add_flag("--no-limits", bs_no_limits,
                   "skip measuring the machine's read bandwidth and peak arithmetic (the 'of bound' column)");
  bspeed->add_flag("--interleave", bs_interleave,
                   "take the repetitions in turns across the -a backends (a fresh backend and a warm-up each "
                   "turn), so that drift in machine speed affects them alike");

  CommonOpts bp_co;
  std::vector<int64_t> bp_len{16 * 1024};
  int64_t bp_n = 32;
  bool bp_header = false;
  uint64_t bp_seed = 1234;
  auto* bpress = bench->add_subcommand("press", "KV-cache compression: KV bytes before/after, compression time, "
                                       "decode tokens/s after it (one --kv-press per run)");
  bp_co.add(bpress);
  bpress->add_option("-L,--length", bp_len, "context lengths in tokens, comma-separated, e.g. 16K,64K (K = 1024)")
      ->delimiter(',')->transform(token_length_value())
      ->check(CLI::Range(int64_t{2}, int64_t{INT64_MAX}).description(""))->capture_default_str();
  bpress->add_option("-n,--n-gen", bp_n, "tokens decoded after compression")->capture_default_str();
  bpress->add_flag("--header", bp_header, "print the table header first");
  bpress->add_option("--seed", bp_seed, "seed of the random prompt")->capture_default_str();
  std::string bp_fill;
  bpress->add_option("--fill-attn", bp_fill,
                     "attention backend for the prompt's prefill (timed, and the press runs after it); decoding "
                     "runs under --attn. E.g. dssa for 64K prompts, where a dense prefill takes most of an hour");

  CommonOpts cal_co;
  std::string cal_file, cal_out = "retrieval-heads.txt";
  int64_t cal_far = 1024, cal_per_layer = 2, cal_total = 0;
  auto* cal = app.add_subcommand("calibrate", "pick a model's retrieval heads for --attn lychee from a retrieval prompt");
  cal_co.add(cal);
  cal->add_option("-f,--file", cal_file, "retrieval prompt (e.g. from `bench tasks --task passkey --show`)")->required();
  cal->add_option("--far", cal_far, "attention to tokens further back than this counts as retrieval")->capture_default_str();
  cal->add_option("--per-layer", cal_per_layer, "retrieval heads kept per layer")->capture_default_str();
  cal->add_option("--total", cal_total,
                  "instead of --per-layer: the N heads of the whole model that look furthest back, for "
                  "lychee:share=head (layers may get none)");
  cal->add_option("-o,--output", cal_out, "heads file to write")->capture_default_str();

  std::vector<RegisteredCommand> extra = add_bench_suite_commands(bench);
  for (auto& c : add_bench_serve_commands(bench)) extra.push_back(std::move(c));
  for (auto& c : add_dist_commands(bench)) extra.push_back(std::move(c));
  for (auto& c : add_route_commands(&app)) extra.push_back(std::move(c));
  for (auto& c : add_train_commands(&app)) extra.push_back(std::move(c));
  for (auto& c : add_vocab_commands(&app)) extra.push_back(std::move(c));
  for (auto& c : add_methods_commands(&app)) extra.push_back(std::move(c));
  for (auto& c : add_read_commands(&app)) extra.push_back(std::move(c));
  for (auto& c : add_serve_commands(&app)) extra.push_back(std::move(c));

  std::string mm_shape = "smollm2-135m", mm_type = "f16", mm_vocab, mm_out;
  uint64_t mm_seed = 42;
  auto* mm = app.add_subcommand("make-model", "write a random-weight model of a known shape (for benchmarks)");
  mm->add_option("--shape", mm_shape, "shape: smollm2-135m, qwen2.5-0.5b")->capture_default_str();
  mm->add_option("--type", mm_type, "weight type: one for every matrix (f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_k, "
                 "q5_k) or a llama.cpp mixture as llama-quantize makes it (q4_k_m, q5_k_m, q6_k)")->capture_default_str();
  mm->add_option("--vocab", mm_vocab, "GGUF file whose tokenizer is copied")->required();
  mm->add_option("-o,--output", mm_out, "output GGUF")->required();
  mm->add_option("--seed", mm_seed, "seed")->capture_default_str();
  int64_t mm_layers = 0;
  mm->add_option("--layers", mm_layers,
                 "layers instead of the shape's (0: the shape's; e.g. 4: a small draft with the same vocabulary for speckv)");

  // llama.cpp's -ctk, -ctv, -fa, -ngl: CLI11 takes only one letter after a single dash.
  std::vector<std::string> arg_storage;
  std::vector<char*> args;
  llama_cpp_flag_aliases(argc, argv, arg_storage, args);
  try {
    app.parse(argc, args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*run)
      return cmd_run(run_co, run_so, run_file.empty() ? run_prompt : "", run_file, run_question, run_n, run_no_bos,
                     !run_no_special, run_qttt, run_prompt_cache, run_cp, run_ignore_eos);
    if (*chat) return cmd_chat(chat_co, chat_so, chat_system, chat_tmpl, chat_n);
    if (*info) return cmd_info(info_path);
    if (*cal) return cmd_calibrate(cal_co, cal_file, cal_far, cal_per_layer, cal_total, cal_out);
    if (*tokc) return cmd_tokenize(tok_co, tok_prompt, tok_file, tok_no_bos, !tok_no_special, tok_ids);
    if (*ppl) return cmd_perplexity(ppl_co, ppl_file, ppl_chunk);
    if (*bspeed) return cmd_bench_speed(bs_co, bs_p, bs_n, bs_d, bs_r, bs_o, bs_attns, bs_fill, !bs_no_warmup, bs_interleave,
                                          !bs_no_limits, bs_limits_mib, bs_budget);
    if (*bpress) return cmd_bench_press(bp_co, bp_len, bp_n, bp_header, bp_seed, bp_fill);
    if (*mm) return cmd_make_model(mm_shape, mm_type, mm_vocab, mm_out, mm_seed, mm_layers);
    for (const auto& c : extra)
      if (*c.app) return c.run();
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  }
  return 0;
}
