// `longctx bench tasks | run | ppl`: the long-context benchmark suite (src/bench,
// with its tasks from src/tasks and its plots from src/report).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/comm.h"
#include "attention/backend.h"
#include "bench/method.h"
#include "bench/ppl.h"
#include "bench/run.h"
#include "report/plot.h"
#include "tasks/haystack.h"
#include "tasks/tasks.h"
#include "tasks/text.h"
#include "command.h"
#include "options.h"
#include "core/progress.h"
#include "embedded_model.h"
#include "gguf/gguf.h"
#include "model/model.h"

namespace {

namespace bench = lc::bench;
namespace report = lc::report;
namespace tasks = lc::tasks;
namespace dist = lc::dist;
using nlohmann::json;

bench::ModelRef model_ref(const std::string& path) {
  if (!path.empty()) return {"", path, nullptr, 0};
  auto img = embedded_model();
  return {"longctx-2l (embedded)", "", img.data(), img.size()};
}

lc::Expected<std::unique_ptr<lc::Model>> load(const bench::ModelRef& r) {
  if (r.image) return lc::Model::load_memory(r.image, r.image_size, r.name);
  return lc::Model::load(r.path);
}

// Options shared by the three commands.
struct MethodOpts {
  std::vector<std::string> rope, attn, press, method;
  std::vector<std::string> qttt;  // bench run only (add_qttt)
  std::vector<std::string> reader;  // bench run only (add_reader)
  int64_t budget = 0;  // --budget: every attention spec set to read this many keys per query head
  void add(CLI::App* app) {
    app->add_option("--rope", rope, "RoPE scaling spec(s), e.g. gguf, yarn:factor=8 (repeat the flag for several)");
    app->add_option("--attn", attn, "attention backend spec(s), e.g. dense");
    app->add_option("--kv-press", press, "KV press spec(s), e.g. none, snapkv:ratio=0.5 (" + press_flag_help() + ")");
    app->add_option("--method", method, "a whole setting: 'rope=..;attn=..;press=..;qttt=..;reader=..;model=M.gguf;name=..' (repeatable; model= runs it on that model only)");
    app->add_option("--budget", budget,
                    "equal budgets: set every method's attention backend to read this many keys per query head "
                    "when decoding (a multiple of 256, >= 512; docs/attention.md, \"Equal budgets\"); dense stays dense");
  }
  void add_qttt(CLI::App* app) {
    app->add_option("--qttt", qttt, "query-only test-time training after the prefill: steps=N,lr=X,span=S, or none "
                    "(repeat the flag for several; see docs/qttt.md)");
  }
  void add_reader(CLI::App* app) {
    app->add_option("--reader", reader, "reading agent(s) NAME:key=value,... or none: the context is read in "
                    "chunks by the reader, rope/attn/press apply inside its calls (repeat the flag for several; "
                    "see docs/readers.md)");
  }
  bool given() const {
    return !rope.empty() || !attn.empty() || !press.empty() || !method.empty() || !qttt.empty() || !reader.empty() ||
           budget != 0;
  }
  // --method settings, else the cross product of --rope x --attn x --kv-press x --qttt; with
  // --budget, each one's attention spec rewritten by lc::equal_budget_spec.
  lc::Expected<std::vector<bench::MethodSetting>> settings() const {
    LC_ASSIGN_OR_RETURN(std::vector<bench::MethodSetting> out, unbudgeted());
    if (budget == 0) return out;
    for (auto& m : out) {
      if (m.attn.empty())
        return lc::make_error(fmt::format("--budget {}: method {} runs the model's default attention; give it "
                                          "explicitly (attn=... or --attn)", budget, m.label()));
      LC_ASSIGN_OR_RETURN(m.attn, lc::equal_budget_spec(m.attn, budget));
    }
    return out;
  }
  lc::Expected<std::vector<bench::MethodSetting>> unbudgeted() const {
    std::vector<bench::MethodSetting> out;
    if (!method.empty()) {
      if (!rope.empty() || !attn.empty() || !press.empty() || !qttt.empty() || !reader.empty())
        return lc::make_error("give either --method or --rope/--attn/--kv-press/--qttt/--reader, not both");
      for (const auto& m : method) {
        LC_ASSIGN_OR_RETURN(auto s, bench::parse_method(m));
        out.push_back(s);
      }
      return out;
    }
    const std::vector<std::string> r = rope.empty() ? std::vector<std::string>{"gguf"} : rope;
    // "": each model's default attention (dense, or fixed for a model trained with it).
    const std::vector<std::string> a = attn.empty() ? std::vector<std::string>{""} : attn;
    const std::vector<std::string> p = press.empty() ? std::vector<std::string>{"none"} : press;
    const std::vector<std::string> q = qttt.empty() ? std::vector<std::string>{"none"} : qttt;
    const std::vector<std::string> rd = reader.empty() ? std::vector<std::string>{"none"} : reader;
    for (const auto& x : r)
      for (const auto& y : a)
        for (const auto& z : p)
          for (const auto& w : q)
            for (const auto& v : rd) {
              auto qp = lc::parse_qttt(w == "none" ? "" : w);
              if (!qp) return qp.error();
              out.push_back({"", x, y, z, w, v});
            }
    return out;
  }
};

int cmd_tasks(bool list, const std::string& model_path, const std::vector<std::string>& task_names,
              const std::vector<int64_t>& lengths, const std::vector<int>& depths, int64_t samples,
              uint64_t seed, int64_t max_new, int64_t obs, const std::string& tmpl_name, const std::string& out_path,
              bool show) {
  if (list) {
    fmt::print("{:<16} {:<9} {:<18} {:>6}  {}\n", "task", "family", "metric", "budget", "what it measures");
    for (const auto& t : tasks::task_list())
      fmt::print("{:<16} {:<9} {:<18} {:6}  {}\n", t.name, t.family, tasks::metric_name(t.metric),
                 t.new_tokens, t.description);
    return 0;
  }
  auto tasks = lc::tasks::expand_task_names(task_names.empty() ? std::vector<std::string>{"all"} : task_names);
  if (!tasks) return fail(tasks.error().message);
  if (samples < 1) return fail("--samples must be at least 1");
  // Only the tokenizer is needed, so a tokenizer-only GGUF (a vocab file) will do.
  const bench::ModelRef ref = model_ref(model_path);
  auto gf = ref.image ? lc::gguf::File::parse(ref.image, ref.image_size, ref.name) : lc::gguf::File::open(ref.path);
  if (!gf) return fail(gf.error().message);
  auto tok = lc::Tokenizer::from_gguf(**gf);
  if (!tok) return fail(tok.error().message);
  lc::Expected<lc::ChatTemplate> tmpl = lc::ChatTemplate::kNone;
  if (tmpl_name == "auto") tmpl = lc::detect_chat_template(**gf, **tok);
  else tmpl = lc::chat_template_from_name(tmpl_name);
  if (!tmpl) return fail(tmpl.error().message);
  const tasks::PromptRenderer r(**tok, *tmpl);
  std::ofstream file;
  if (!out_path.empty()) {
    file.open(out_path);
    if (!file) return fail(out_path + ": cannot write");
  }
  std::ostream& out = out_path.empty() ? std::cout : file;
  const std::vector<int> ds = depths.empty() ? std::vector<int>{-1} : depths;
  int64_t made = 0;
  for (int64_t len : lengths)
    for (const auto& t : *tasks)
      for (int d : ds)
        for (int64_t i = 0; i < samples; ++i) {
          tasks::SampleSpec spec{t, len, d, i, seed, {max_new, obs}};
          auto s = tasks::make_sample(r, spec);
          if (!s) {
            fmt::print(stderr, "longctx: skipped: {}\n", s.error().message);
            continue;
          }
          ++made;
          if (show) {
            out << "=== " << t << " length " << len << " depth " << s->spec.depth << " sample " << i << ": "
                << s->n_prompt << " prompt tokens + " << s->max_new_tokens << " to generate, answers:";
            for (const auto& a : s->answers) out << " [" << a << "]";
            out << "\n" << r.text(s->user, s->answer_prefix) << "\n\n";
            continue;
          }
          json j;
          j["task"] = t;
          j["length"] = len;
          j["depth"] = s->spec.depth;
          j["index"] = i;
          j["seed"] = s->seed;
          j["input_hash"] = s->input_hash;
          j["n_prompt"] = s->n_prompt;
          j["max_new_tokens"] = s->max_new_tokens;
          j["haystack_size"] = s->size_units;
          j["haystack_unit"] = s->unit;
          j["answers"] = s->answers;
          j["needles"] = json::array();
          for (const auto& n : s->needles) j["needles"].push_back({{"text", n.text}, {"depth", n.depth}});
          json info = json::object();
          for (const auto& [k, v] : s->info) info[k] = v;
          j["info"] = info;
          j["user"] = s->user;
          j["answer_prefix"] = s->answer_prefix;
          j["chat_template"] = lc::chat_template_name(*tmpl);
          out << j.dump() << "\n";
        }
  if (made == 0) return fail("no sample could be made");
  return 0;
}

void print_report(const bench::RunReport& rep, const std::string& out_dir) {
  fmt::print("{:<28} {:<24} {:>8} {:>5} {:>7} {:>11} {:>10} {:>9}\n", "model", "method", "length", "n", "score", "prefill t/s",
             "decode t/s", "RSS MiB");
  for (const auto& c : rep.summary.cells) {
    if (c.task != "average") continue;
    fmt::print("{:<28} {:<24} {:>8} {:5} {:>7.2f} {:>11.1f} {:>10.2f} {:>9.1f}\n", c.model, c.method,
               report::length_label(static_cast<double>(c.length)), c.n, c.score, c.prefill_tps,
               c.decode_tps, static_cast<double>(c.peak_rss) / (1024.0 * 1024.0));
  }
  for (const auto& e : rep.summary.effective)
    if (e.task == "average")
      fmt::print("effective length (> {:.1f}): {} / {}: {}\n", rep.summary.threshold, e.model, e.method,
                 e.length > 0 ? report::length_label(static_cast<double>(e.length)) : "none");
  fmt::print("{} sample(s) run, {} resumed from {}/results.jsonl, {} skipped (length too short)\n",
             rep.run, rep.resumed, out_dir, rep.too_short);
  fmt::print("reports: {}/summary.csv, summary.json, effective_length.csv, *.svg, *.png\n", out_dir);
}

}  // namespace

std::vector<RegisteredCommand> add_bench_suite_commands(CLI::App* bench_app) {
  std::vector<RegisteredCommand> cmds;

  // ---- bench tasks
  {
    struct O {
      bool list = false, show = false;
      std::string model, tmpl = "auto", out, data_dir;
      std::vector<std::string> tasks;
      std::vector<int64_t> lengths = {4 * 1024};
      std::vector<int> depths;
      int64_t samples = 1, max_new = 0, obs = 0;
      uint64_t seed = 42;
    };
    auto o = std::make_shared<O>();
    CLI::App* app = bench_app->add_subcommand("tasks", "generate long-context task samples (JSON lines), or --list them");
    app->add_flag("--list", o->list, "list the tasks and what they measure");
    app->add_option("-m,--model", o->model, "GGUF model whose tokenizer sizes the samples (default: the embedded longctx-2l)");
    app->add_option("--task", o->tasks, "tasks or groups (all, ruler, passkey, babilong, dense)")->delimiter(',');
    app->add_option("-L,--length", o->lengths, "lengths in tokens, e.g. 4K,8K (K = 1024)")
        ->delimiter(',')->transform(token_length_value())
        ->check(CLI::Range(int64_t{1}, int64_t{INT64_MAX}).description(""))->capture_default_str();
    app->add_option("--depth", o->depths, "needle depths in percent (default: drawn from RULER's 40 depths)")->delimiter(',');
    app->add_option("--samples", o->samples, "samples per cell")->capture_default_str();
    app->add_option("--seed", o->seed, "seed")->capture_default_str();
    app->add_option("--max-new-tokens", o->max_new, "cap on the answer budget (0: each task's own)")->capture_default_str();
    app->add_option("--observations", o->obs, "dense tasks: a fixed number of observations in filler (0: fill the length)")->capture_default_str();
    app->add_option("--chat-template", o->tmpl, "auto, none, llama3, chatml, llama2, zephyr")->capture_default_str();
    app->add_option("--data-dir", o->data_dir, "folder holding opticks.txt (default: found next to the binary or the sources)");
    app->add_option("-o,--output", o->out, "write the JSON lines here (default: stdout)");
    app->add_flag("--show", o->show, "print the rendered prompts as text instead of JSON");
    cmds.push_back({app, [o]() -> int {
                      try {
                        if (!o->data_dir.empty()) tasks::set_data_dir(o->data_dir);
                        return cmd_tasks(o->list, o->model, o->tasks, o->lengths, o->depths, o->samples, o->seed,
                                         o->max_new, o->obs, o->tmpl, o->out, o->show);
                      } catch (const std::exception& e) {
                        return fail(e.what());
                      }
                    }});
  }

  // ---- bench run
  {
    struct O {
      std::vector<std::string> models, tasks;
      std::vector<int64_t> lengths;
      std::vector<int> depths;
      std::string config, suite, out, tmpl, data_dir, draft;
      int64_t samples = 0, max_new = -1, obs = -1, batch = 0, ctx = -2;
      int threads = -1;
      int64_t seed = -1;
      double threshold = -1;
      bool no_plots = false;
      double cp_timeout = 3600;  // ranks finish their shares at different times
      MethodOpts mo;
      CacheOpts cache;
    };
    auto o = std::make_shared<O>();
    CLI::App* app = bench_app->add_subcommand("run", "run a benchmark matrix: models x methods x tasks x lengths x depths x samples");
    app->add_option("-m,--model", o->models, "GGUF model(s) (default: the embedded longctx-2l)");
    app->add_option("--config", o->config, "JSON run config (see docs/benchmarks.md); flags override it");
    app->add_option("--suite", o->suite, "preset: tiny (every task at 512 and 1K, for plumbing) or standard (4K..128K)");
    app->add_option("--task", o->tasks, "tasks or groups (all, ruler, passkey, babilong, dense)")->delimiter(',');
    app->add_option("-L,--length", o->lengths, "lengths in tokens, e.g. 4K,8K,16K (K = 1024)")
        ->delimiter(',')->transform(token_length_value())
        ->check(CLI::Range(int64_t{1}, int64_t{INT64_MAX}).description(""));
    app->add_option("--depth", o->depths, "needle depths in percent (default: drawn from RULER's 40 depths)")->delimiter(',');
    app->add_option("--samples", o->samples, "samples per cell (default 1)");
    app->add_option("--seed", o->seed, "seed (default 42)");
    app->add_option("--threshold", o->threshold, "score for the effective length (default 85.6)");
    app->add_option("--max-new-tokens", o->max_new, "cap on the answer budget (0: each task's own)");
    app->add_option("--observations", o->obs, "dense tasks: a fixed number of observations (0: fill the length)");
    app->add_option("--chat-template", o->tmpl, "auto (default), none, llama3, chatml, llama2, zephyr");
    app->add_option("--out-dir", o->out, "output folder (default bench-out); a re-run resumes from it");
    app->add_option("-o,--out", o->out, "same as --out-dir")->group("");  // the older name
    app->add_option("-b,--batch-size", o->batch, "tokens per prefill chunk (default 512)");
    app->add_option("-c,--ctx-size", o->ctx,
                    "context size of every session (default: the longest length; 0: grows as needed, "
                    "e.g. for kvzip's reconstruction passes)")
        ->check(CLI::Range(int64_t{0}, int64_t{INT64_MAX}).description(""));
    app->add_option("-t,--threads", o->threads, "threads (0 = all cores)");
    app->add_option("--data-dir", o->data_dir, "folder holding opticks.txt");
    app->add_flag("--no-plots", o->no_plots, "skip the SVG/PNG plots");
    app->add_option("--draft", o->draft, "draft model GGUF for --kv-press speckv / specpc (same vocabulary)");
    app->add_option("--cp-timeout", o->cp_timeout,
                    "under mpirun: seconds a rank waits for the others' results before it ends the job")
        ->capture_default_str();
    o->mo.add(app);
    o->mo.add_qttt(app);
    o->mo.add_reader(app);
    o->cache.add(app);
    cmds.push_back({app, [o, app]() -> int {
                      try {
                        if (!o->data_dir.empty()) tasks::set_data_dir(o->data_dir);
                        bench::RunConfig cfg;
                        if (o->suite == "tiny") cfg = bench::tiny_suite();
                        else if (o->suite == "standard") cfg = bench::standard_suite();
                        else if (!o->suite.empty()) return fail("unknown suite '" + o->suite + "' (tiny, standard)");
                        if (!o->config.empty()) {
                          lc::Status st = bench::load_config_file(o->config, cfg);
                          if (!st) return fail(st.message());
                        }
                        if (!o->models.empty()) {
                          cfg.models.clear();
                          for (const auto& m : o->models) cfg.models.push_back(model_ref(m));
                        }
                        if (cfg.models.empty()) cfg.models.push_back(model_ref(""));
                        if (!o->tasks.empty()) cfg.tasks = o->tasks;
                        if (!o->lengths.empty()) cfg.lengths = o->lengths;
                        if (!o->depths.empty()) cfg.depths = o->depths;
                        if (o->samples > 0) cfg.samples = o->samples;
                        if (o->seed >= 0) cfg.seed = static_cast<uint64_t>(o->seed);
                        if (o->threshold >= 0) cfg.threshold = o->threshold;
                        if (o->max_new >= 0) cfg.gen.max_new_tokens = o->max_new;
                        if (o->obs >= 0) cfg.gen.observations = o->obs;
                        if (!o->tmpl.empty()) cfg.chat_template = o->tmpl;
                        if (!o->out.empty()) cfg.out_dir = o->out;
                        if (o->batch > 0) cfg.n_batch = o->batch;
                        if (o->ctx >= 0) cfg.n_ctx = o->ctx;
                        if (o->threads >= 0) cfg.n_threads = o->threads;
                        if (o->no_plots) cfg.plots = false;
                        if (!o->draft.empty()) cfg.draft = o->draft;
                        {
                          // The cache flags given on the command line replace the config's.
                          lc::ContextParams kv;
                          if (lc::Status st = o->cache.apply(kv); !st) return fail(st.message());
                          if (app->count("--kv-block")) cfg.kv_block = kv.kv_block;
                          if (app->count("--kv-type-k")) cfg.kv_type_k = kv.kv_type_k;
                          if (app->count("--kv-type-v")) cfg.kv_type_v = kv.kv_type_v;
                          if (app->count("--kv-budget")) cfg.kv_budget = kv.kv_budget;
                          if (app->count("--kv-spill")) cfg.kv_spill = kv.kv_spill;
                        }
                        if (o->mo.given()) {
                          auto ms = o->mo.settings();
                          if (!ms) return fail(ms.error().message);
                          cfg.methods = *ms;
                        }
                        // Under mpirun with several ranks the samples are spread over them
                        // (bench/run.h RunShard); rank 0 writes the reports.
                        std::unique_ptr<dist::Comm> comm;
                        if (dist::Comm::launched_by_mpi()) {
                          auto c = dist::Comm::init(nullptr, nullptr, o->cp_timeout);
                          if (!c) return fail(c.error().message);
                          comm = std::move(*c);
                          dist::Comm* cm = comm.get();
                          cfg.shard.rank = cm->rank();
                          cfg.shard.size = cm->size();
                          cfg.shard.gather = [cm](const std::string& mine) { return cm->gather_strings(mine, 0); };
                        }
                        auto rep = bench::run_matrix(cfg);
                        report::release_plot_caches();  // nothing draws after this
                        if (!rep) {
                          if (comm && comm->size() > 1) comm->abort(rep.error().message);
                          return fail(rep.error().message);
                        }
                        if (!comm || comm->rank() == 0) print_report(*rep, cfg.out_dir);
                        if (comm)
                          if (lc::Status st = comm->barrier(); !st) comm->abort(st.message());
                        return 0;
                      } catch (const std::exception& e) {
                        return fail(e.what());
                      }
                    }});
  }

  // ---- bench ppl
  {
    struct O {
      std::vector<std::string> models;
      std::string file, out = "bench-ppl", data_dir;
      int64_t length = 4 * 1024;
      int64_t bucket = 0, batch = 512;
      int threads = 0;
      MethodOpts mo;
    };
    auto o = std::make_shared<O>();
    CLI::App* app = bench_app->add_subcommand("ppl", "perplexity as a function of position over one long text");
    app->add_option("-m,--model", o->models, "GGUF model(s) (default: the embedded longctx-2l)");
    app->add_option("-f,--file", o->file, "text file (default: the shipped essay, data/haystack/opticks.txt)");
    app->add_option("-L,--length", o->length, "tokens to evaluate in one sequence, e.g. 32K (K = 1024)")
        ->transform(token_length_value())
        ->check(CLI::Range(int64_t{16}, int64_t{INT64_MAX}).description(""))->capture_default_str();
    app->add_option("--bucket", o->bucket, "positions per bucket (default: length / 16)");
    app->add_option("--out-dir", o->out, "output folder: ppl.csv, ppl_vs_position.svg/.png")->capture_default_str();
    app->add_option("-o,--out", o->out, "same as --out-dir")->group("");  // the older name
    app->add_option("-b,--batch-size", o->batch, "tokens per prefill chunk")->capture_default_str();
    app->add_option("-t,--threads", o->threads, "threads (0 = all cores)")->capture_default_str();
    app->add_option("--data-dir", o->data_dir, "folder holding opticks.txt");
    o->mo.add(app);
    cmds.push_back({app, [o]() -> int {
                      try {
                        if (!o->data_dir.empty()) tasks::set_data_dir(o->data_dir);
                        const int64_t len = o->length;
                        const int64_t bucket = o->bucket > 0 ? o->bucket : std::max<int64_t>(1, len / 16);
                        auto ms = o->mo.settings();
                        if (!ms) return fail(ms.error().message);
                        std::string path = o->file;
                        if (path.empty()) {
                          auto p = tasks::find_data_file("opticks.txt");
                          if (!p) return fail(p.error().message);
                          path = *p;
                        }
                        std::ifstream in(path, std::ios::binary);
                        if (!in) return fail(path + ": cannot open");
                        std::ostringstream ss;
                        ss << in.rdbuf();
                        const std::string text = ss.str();
                        std::error_code ec;
                        std::filesystem::create_directories(o->out, ec);
                        if (ec) return fail(o->out + ": cannot create the output folder");
                        std::vector<bench::PplCurve> curves;
                        std::vector<std::string> models = o->models.empty() ? std::vector<std::string>{""} : o->models;
                        for (const auto& mp : models) {
                          const bench::ModelRef ref = model_ref(mp);
                          auto model = load(ref);
                          if (!model) return fail(model.error().message);
                          std::vector<int32_t> toks = (*model)->tokenizer().encode(text, true, false);
                          if (static_cast<int64_t>(toks.size()) < len)
                            return fail(fmt::format("{} has {} tokens, fewer than --length {} (a repeated text would "
                                                    "make later positions easier, so it is not repeated)",
                                                    path, toks.size(), len));
                          toks.resize(static_cast<size_t>(len));
                          const std::string name = ref.image ? ref.name : std::filesystem::path(mp).filename().string();
                          for (const auto& m : *ms) {
                            if (!m.qttt.empty() && m.qttt != "none")
                              return fail("bench ppl does not run qTTT (method " + m.label() +
                                          "): use bench run or run --qttt");
                            lc::ContextParams cp;
                            cp.n_ctx = len;
                            cp.n_batch = o->batch;
                            cp.n_threads = o->threads;
                            auto session = bench::make_session_for(**model, m, cp);
                            if (!session) return fail(session.error().message);
                            lc::Progress prog("ppl " + m.label(), len, "tok");
                            auto c = bench::perplexity_by_position((*session)->context(), toks, bucket, [&](int64_t d) { prog.update(d); });
                            prog.finish();
                            if (!c) return fail(c.error().message);
                            c->model = name;
                            c->method = m.label();
                            fmt::print("{} / {}: {} tokens, perplexity {:.3f}, {:.1f} tokens/s\n", name,
                                       c->method, c->n_tokens, c->ppl,
                                       c->seconds > 0 ? static_cast<double>(c->n_tokens) / c->seconds : 0.0);
                            for (const auto& b : c->buckets)
                              fmt::print("  [{:7}, {:7})  ppl {:>10.3f}\n", b.begin, b.end, b.ppl);
                            curves.push_back(std::move(*c));
                          }
                        }
                        lc::Status st = bench::write_ppl_csv(curves, o->out + "/ppl.csv");
                        if (!st) return fail(st.message());
                        st = bench::write_ppl_plot(curves, o->out + "/ppl_vs_position");
                        report::release_plot_caches();  // nothing draws after this
                        if (!st) return fail(st.message());
                        fmt::print("reports: {}/ppl.csv, {}/ppl_vs_position.svg, .png\n", o->out, o->out);
                        return 0;
                      } catch (const std::exception& e) {
                        return fail(e.what());
                      }
                    }});
  }
  return cmds;
}
