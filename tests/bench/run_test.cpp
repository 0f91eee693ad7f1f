// The run matrix end to end on the real tiny model (stories260K): JSON lines, summaries,
// plots, resuming, method settings, config files, perplexity by position. Nothing here
// asserts an accuracy figure or a timing.
#include <gtest/gtest.h>

#include "plot_check.h"

#include <map>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bench/method.h"
#include "bench/ppl.h"
#include "bench/run.h"
#include "model/model.h"
#include "report/plot.h"

namespace lc::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kModel = std::string(LONGCTX_TEST_DATA) + "/golden/models/stories260K.gguf";

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("longctx_bench_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(in, l))
    if (!l.empty()) out.push_back(l);
  return out;
}

using test::expect_plot;
using test::slurp;

RunConfig small(const std::string& out) {
  RunConfig c;
  c.models = {{"", kModel, nullptr, 0}};
  c.tasks = {"niah_single_1", "passkey"};
  c.lengths = {512, 1024};
  c.depths = {50};
  c.samples = 2;
  c.gen.max_new_tokens = 4;
  c.out_dir = out;
  c.progress = false;
  c.n_threads = 1;
  c.note = [](const std::string&) {};
  return c;
}

TEST(BenchRun, WritesLinesSummaryAndPlots) {
  const std::string out = fresh_dir("basic");
  auto rep = run_matrix(small(out));
  ASSERT_TRUE(rep.has_value()) << rep.error().message;
  EXPECT_EQ(rep->run, 8);  // 2 tasks x 2 lengths x 2 samples
  EXPECT_EQ(rep->resumed, 0);
  const auto ls = lines(out + "/results.jsonl");
  ASSERT_EQ(ls.size(), 8u);
  std::set<std::string> hashes;
  for (const auto& l : ls) {
    json j = json::parse(l);
    EXPECT_EQ(j["model"], "stories260K.gguf");
    EXPECT_EQ(j["method"], "baseline");
    EXPECT_EQ(j["rope"], "gguf");
    EXPECT_EQ(j["attn"], "dense");
    EXPECT_EQ(j["press"], "none");
    EXPECT_EQ(j["n_prompt"].get<int64_t>() + j["max_new_tokens"].get<int64_t>(), j["length"].get<int64_t>());
    EXPECT_LE(j["n_gen"].get<int64_t>(), j["max_new_tokens"].get<int64_t>());
    EXPECT_GE(j["n_gen"].get<int64_t>(), 1);
    EXPECT_EQ(j["input_hash"].get<std::string>().size(), 16u);
    hashes.insert(j["input_hash"]);
    EXPECT_TRUE(j["output"].is_string());
    EXPECT_FALSE(j["answers"].empty());
    const double s = j["score"];
    EXPECT_TRUE(s == 0.0 || s == 100.0);
    EXPECT_GT(j["peak_rss"].get<int64_t>(), 0);
    EXPECT_GT(j["kv_bytes"].get<int64_t>(), 0);
    EXPECT_GE(j["t_prefill"].get<double>(), 0.0);
    EXPECT_EQ(j["depth"], 50);
    EXPECT_NEAR(j["needle_depth"].get<double>(), 0.5, 0.2);
  }
  EXPECT_EQ(hashes.size(), 8u);

  const auto csv = lines(out + "/summary.csv");
  ASSERT_EQ(csv.size(), 1u + 4u + 2u);  // header, 2 tasks x 2 lengths, 2 averages
  EXPECT_EQ(csv[0], "model,method,rope,attn,press,query,task,length,n,score,prefill_tps,decode_tps,peak_rss_mib,kv_mib");
  EXPECT_EQ(csv[1].rfind("stories260K.gguf,baseline,gguf,dense,none,,average,512,4,", 0), 0u) << csv[1];
  // The average is the mean of the task means, and matches the per-sample scores.
  double sum[2] = {0, 0};
  for (const auto& l : ls) {
    json j = json::parse(l);
    sum[j["length"] == 512 ? 0 : 1] += j["score"].get<double>();
  }
  for (const auto& c : rep->summary.cells) {
    if (c.task == "average") {
      EXPECT_NEAR(c.score, sum[c.length == 512 ? 0 : 1] / 4.0, 1e-9);
    }
  }
  EXPECT_TRUE(fs::exists(out + "/summary.json"));
  const auto eff = lines(out + "/effective_length.csv");
  ASSERT_EQ(eff.size(), 1u + 3u);  // average + 2 tasks
  EXPECT_EQ(eff[0], "model,method,task,threshold,effective_length");
  for (const char* p : {"accuracy_vs_length", "memory_vs_length", "speed_vs_length", "accuracy_by_task-baseline"})
    expect_plot(out + "/" + p);
  fs::remove_all(out);
}

TEST(BenchRun, AccuracyAgainstPressRatioChart) {
  auto cell = [](const std::string& press, const std::string& query, double score, const char* task = "average") {
    CellSummary c;
    c.model = "m.gguf", c.method = press, c.press = press, c.query = query, c.task = task;
    c.length = 1024, c.n = 4, c.score = score;
    return c;
  };
  Summary s;
  s.cells = {cell("none", "", 80),
             cell("snapkv:ratio=0.5,query=aware", "aware", 60),
             cell("snapkv:ratio=0.25,query=aware", "aware", 70),
             cell("snapkv:ratio=0.25,query=aware", "aware", 10, "passkey"),  // not an average
             cell("snapkv:ratio=0.5,query=agnostic", "agnostic", 40),      // one ratio only
             cell("knorm:ratio=0.5+snapkv:budget=8", "aware", 30),          // a chain
             cell("simlayerkv:query=aware", "aware", 20),                   // no ratio
             cell("duo_attention:head_ratio=0.75,query=aware", "aware", 50),
             cell("duo_attention:head_ratio=0.5,query=aware", "aware", 55),
             cell("think:channel_ratio=0.5,query=aware", "aware", 75),
             cell("think:channel_ratio=0.25,query=aware", "aware", 78)};
  const auto charts = ratio_charts(s);
  ASSERT_EQ(charts.size(), 1u);  // the agnostic chart has no curve of two ratios
  EXPECT_EQ(charts[0].stem, "accuracy_vs_ratio-aware");
  const report::Chart& ch = charts[0].chart;
  ASSERT_TRUE(ch.hline.has_value());
  EXPECT_EQ(*ch.hline, 80);
  ASSERT_EQ(ch.series.size(), 3u);
  EXPECT_EQ(ch.series[0].label, "duo_attention");
  EXPECT_EQ(ch.series[0].x, (std::vector<double>{0.5, 0.75}));
  EXPECT_EQ(ch.series[0].y, (std::vector<double>{55, 50}));
  EXPECT_EQ(ch.series[1].label, "snapkv");
  EXPECT_EQ(ch.series[1].x, (std::vector<double>{0.25, 0.5}));
  EXPECT_EQ(ch.series[1].y, (std::vector<double>{70, 60}));
  EXPECT_EQ(ch.series[2].label, "think");  // channel_ratio is its ratio
  EXPECT_EQ(ch.series[2].x, (std::vector<double>{0.25, 0.5}));
  EXPECT_EQ(ch.series[2].y, (std::vector<double>{78, 75}));
  const std::string out = fresh_dir("ratio");
  fs::create_directories(out);
  const Status st = write_plots(s, out);
  ASSERT_TRUE(st.is_ok()) << st.error().message;
  expect_plot(out + "/accuracy_vs_ratio-aware");
  EXPECT_FALSE(fs::exists(out + "/accuracy_vs_ratio-agnostic.svg"));
  fs::remove_all(out);
}

TEST(BenchRun, ResumeSkipsDoneSamples) {
  const std::string out = fresh_dir("resume");
  RunConfig c = small(out);
  auto first = run_matrix(c);
  ASSERT_TRUE(first.has_value()) << first.error().message;
  EXPECT_EQ(first->run, 8);
  auto second = run_matrix(c);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->run, 0);
  EXPECT_EQ(second->resumed, 8);
  EXPECT_EQ(lines(out + "/results.jsonl").size(), 8u);
  EXPECT_EQ(second->summary.cells.size(), first->summary.cells.size());

  // An interrupted run: the last line lost and a half-written one in its place.
  auto ls = lines(out + "/results.jsonl");
  {
    std::ofstream f(out + "/results.jsonl", std::ios::trunc);
    for (size_t i = 0; i + 1 < ls.size(); ++i) f << ls[i] << "\n";
    f << ls.back().substr(0, ls.back().size() / 2) << "\n";
  }
  auto third = run_matrix(c);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->run, 1);
  EXPECT_EQ(third->resumed, 7);
  // A larger matrix runs only what is new.
  c.samples = 3;
  auto fourth = run_matrix(c);
  ASSERT_TRUE(fourth.has_value());
  EXPECT_EQ(fourth->run, 4);
  EXPECT_EQ(fourth->resumed, 8);
  // Another seed makes other samples: their hashes differ, so they run again.
  c.seed = 7;
  c.samples = 1;
  auto fifth = run_matrix(c);
  ASSERT_TRUE(fifth.has_value());
  EXPECT_EQ(fifth->run, 4);
  EXPECT_EQ(fifth->resumed, 0);
  for (const auto& cell : fifth->summary.cells) EXPECT_EQ(cell.n, cell.task == "average" ? 2 : 1);
  fs::remove_all(out);
}

TEST(BenchRun, MethodSettings) {
  MethodSetting base;
  EXPECT_EQ(base.label(), "baseline");
  MethodSetting lin{"", "linear:factor=2", "dense", "none"};
  EXPECT_EQ(lin.label(), "rope linear:factor=2");
  MethodSetting snap{"", "gguf", "dense", "snapkv:ratio=0.5"};
  auto m = parse_method("rope=yarn:factor=8;press=snapkv:ratio=0.5,window=64;name=y8");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->rope, "yarn:factor=8");
  EXPECT_EQ(m->attn, "");  // not given: the model's default attention (dense, or fixed)
  EXPECT_EQ(m->press, "snapkv:ratio=0.5,window=64");
  EXPECT_EQ(m->label(), "y8");
  EXPECT_FALSE(parse_method("bogus=1").has_value());
  EXPECT_FALSE(parse_method("rope").has_value());

  auto model = Model::load(kModel);
  ASSERT_TRUE(model.has_value());
  ContextParams cp;
  cp.n_ctx = 256;
  cp.n_batch = 64;
  cp.n_threads = 1;
  auto ok = make_session_for(**model, base, cp);
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  EXPECT_EQ((*ok)->context().n_ctx(), 256);
  EXPECT_EQ((*ok)->context().attention().spec(), "dense");  // this model has no distance ceiling
  auto ok2 = make_session_for(**model, MethodSetting{"", "linear:factor=2", "streaming:sinks=4,window=64", "none"}, cp);
  ASSERT_TRUE(ok2.has_value()) << ok2.error().message;
  auto bad = make_session_for(**model, MethodSetting{"", "nosuchrope:x=1", "dense", "none"}, cp);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("nosuchrope"), std::string::npos) << bad.error().message;
  auto with_press = make_session_for(**model, snap, cp);
  ASSERT_TRUE(with_press.has_value()) << with_press.error().message;
  EXPECT_NE((*with_press)->context().press(), nullptr);
  auto bad2 = make_session_for(**model, MethodSetting{"", "gguf", "dense", "nosuchpress:ratio=0.5"}, cp);
  ASSERT_FALSE(bad2.has_value());
  EXPECT_NE(bad2.error().message.find("nosuchpress"), std::string::npos) << bad2.error().message;

  // A run with a setting that cannot be made fails before doing any work, naming it.
  const std::string out = fresh_dir("method");
  RunConfig c = small(out);
  for (const MethodSetting& wrong : {MethodSetting{"", "gguf", "dense", "nosuchpress"}, MethodSetting{"", "nosuchrope", "dense", "none"},
                                     MethodSetting{"", "gguf", "nosuchattn", "none"}}) {
    c.methods = {base, wrong};
    auto rep = run_matrix(c);
    ASSERT_FALSE(rep.has_value());
    EXPECT_NE(rep.error().message.find(wrong.label()), std::string::npos) << rep.error().message;
    EXPECT_EQ(lines(out + "/results.jsonl").size(), 0u);
  }
  // Several settings side by side: their names flow into the lines and the summary.
  c.methods = {MethodSetting{"plain", "gguf", "dense", "none"}, lin, snap,
               MethodSetting{"", "gguf", "streaming:sinks=4,window=128", "none"}};
  c.lengths = {512};
  c.samples = 1;
  auto rep2 = run_matrix(c);
  ASSERT_TRUE(rep2.has_value()) << rep2.error().message;
  std::set<std::string> methods;
  for (const auto& l : lines(out + "/results.jsonl")) {
    json j = json::parse(l);
    methods.insert(j["method"].get<std::string>());
    if (j["method"] == "rope linear:factor=2") {
      EXPECT_EQ(j["rope"], "linear:factor=2");
    }
  }
  EXPECT_EQ(methods, (std::set<std::string>{"plain", "rope linear:factor=2", "press snapkv:ratio=0.5", "attn streaming:sinks=4,window=128"}));
  std::set<std::string> in_summary;
  for (const auto& cell : rep2->summary.cells) in_summary.insert(cell.method);
  EXPECT_EQ(in_summary, methods);
  // Method labels with commas survive the CSV.
  const std::string csv = slurp(out + "/summary.csv");
  EXPECT_NE(csv.find("\"attn streaming:sinks=4,window=128\""), std::string::npos);
  for (const auto& l : std::vector<std::string>{"plain", "rope-linear-factor-2", "attn-streaming-sinks-4-window-128"})
    expect_plot(out + "/accuracy_by_task-" + l);
  fs::remove_all(out);
}

// --reader: the context goes to a reading agent, whose calls and chunks are recorded; a bad
// reader spec fails before any work, naming it.
TEST(BenchRun, ReadersRunThroughTheMatrix) {
  const std::string out = fresh_dir("readers");
  RunConfig c = small(out);
  c.tasks = {"niah_single_1"};
  c.lengths = {2048};
  c.samples = 1;
  MethodSetting bad;
  bad.reader = "memagent:nosuch=1";
  c.methods = {MethodSetting{}, bad};
  auto rep = run_matrix(c);
  ASSERT_FALSE(rep.has_value());
  EXPECT_NE(rep.error().message.find("unknown key 'nosuch'"), std::string::npos) << rep.error().message;
  EXPECT_EQ(lines(out + "/results.jsonl").size(), 0u);

  auto mem = parse_method("reader=memagent:window=4096,chunk=400,memory=16,answer=8");
  ASSERT_TRUE(mem.has_value());
  EXPECT_EQ(mem->label(), "reader memagent:window=4096,chunk=400,memory=16,answer=8");
  auto map = parse_method("reader=mapreduce:window=4096,chunk=400,answer=8,agg=first");
  ASSERT_TRUE(map.has_value());
  c.methods = {*mem, *map};
  rep = run_matrix(c);
  ASSERT_TRUE(rep.has_value()) << rep.error().message;
  const auto ls = lines(out + "/results.jsonl");
  ASSERT_EQ(ls.size(), 2u);
  for (const auto& l : ls) {
    json j = json::parse(l);
    const bool is_mem = j["method"] == mem->label();
    EXPECT_EQ(j["reader"].get<std::string>().substr(0, 9), is_mem ? "memagent:" : "mapreduce");
    const int64_t chunks = j["reader_chunks"], calls = j["reader_calls"];
    // A 2K prompt in 400-token chunks.
    EXPECT_GE(chunks, 4) << l;
    EXPECT_LE(chunks, 6) << l;
    EXPECT_EQ(calls, is_mem ? chunks + 1 : chunks) << l;  // agg=first makes no extra call
    // Every call prefills at least its chunk (the last chunk may be short; the template and
    // question the calls share are prefilled once when the caller reuses the prefix).
    EXPECT_GT(j["reader_prompt_tokens"].get<int64_t>(), (chunks - 1) * 400) << l;
  }
  EXPECT_FALSE(fs::exists(out + "/reader_document.txt"));
  fs::remove_all(out);
}

// model=: a setting runs on its own model only, which joins the run; a model that no setting runs
// on is left out; a missing file fails before any work.
TEST(BenchRun, MethodsPinnedToAModelRunOnItOnly) {
  const std::string other = std::string(LONGCTX_TEST_DATA) + "/../../models/longctx-2l.gguf";
  const std::string out = fresh_dir("pinned");
  RunConfig c = small(out);
  c.tasks = {"passkey"};
  c.lengths = {512};
  c.samples = 1;
  auto pinned = parse_method("name=pinned;model=" + other);
  ASSERT_TRUE(pinned.has_value()) << pinned.error().message;
  EXPECT_EQ(pinned->model, other);
  EXPECT_FALSE(parse_method("model=;name=x").has_value());
  c.methods = {MethodSetting{"plain", "gguf", "", "none"}, *pinned};
  auto rep = run_matrix(c);
  ASSERT_TRUE(rep.has_value()) << rep.error().message;
  std::multiset<std::string> ran;
  for (const auto& l : lines(out + "/results.jsonl")) {
    json j = json::parse(l);
    ran.insert(j["model"].get<std::string>() + " " + j["method"].get<std::string>());
  }
  EXPECT_EQ(ran, (std::multiset<std::string>{"stories260K.gguf plain", "longctx-2l.gguf plain",
                                              "longctx-2l.gguf pinned"}));
  fs::remove_all(out);

  // Every setting pinned elsewhere: the run's own model is not loaded.
  c.methods = {*pinned};
  rep = run_matrix(c);
  ASSERT_TRUE(rep.has_value()) << rep.error().message;
  const auto ls = lines(out + "/results.jsonl");
  ASSERT_EQ(ls.size(), 1u);
  EXPECT_EQ(json::parse(ls[0])["model"], "longctx-2l.gguf");
  fs::remove_all(out);

  auto missing = parse_method("name=gone;model=/no/such/model.gguf");
  ASSERT_TRUE(missing.has_value());
  c.methods = {*missing};
  rep = run_matrix(c);
  ASSERT_FALSE(rep.has_value());
  EXPECT_NE(rep.error().message.find("/no/such/model.gguf"), std::string::npos) << rep.error().message;
  fs::remove_all(out);
}

TEST(BenchRun, ConfigFile) {
  RunConfig c;
  json j = {{"models", {"a.gguf", "b.gguf"}},
            {"methods", {{{"rope", "gguf"}, {"attn", "dense"}, {"press", "none"}, {"name", "base"}}, "rope=yarn:factor=4"}},
            {"tasks", {"ruler", "passkey"}},
            {"lengths", {4096, "8K"}},
            {"depths", {10, 90}},
            {"samples", 3},
            {"seed", 9},
            {"max_new_tokens", 16},
            {"out", "x"}};
  ASSERT_TRUE(apply_config_json(j, c).is_ok());
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[1].path, "b.gguf");
  ASSERT_EQ(c.methods.size(), 2u);
  EXPECT_EQ(c.methods[0].label(), "base");
  EXPECT_EQ(c.methods[1].rope, "yarn:factor=4");
  EXPECT_EQ(c.lengths, (std::vector<int64_t>{4096, 8192}));
  EXPECT_EQ(c.depths, (std::vector<int>{10, 90}));
  EXPECT_EQ(c.samples, 3);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.gen.max_new_tokens, 16);
  EXPECT_EQ(c.out_dir, "x");
  Status bad = apply_config_json(json{{"lenghts", {1}}}, c);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("lenghts"), std::string::npos);
  EXPECT_FALSE(apply_config_json(json{{"samples", "many"}}, c).is_ok());
  EXPECT_FALSE(apply_config_json(json{{"lengths", {"huge"}}}, c).is_ok());
  EXPECT_FALSE(load_config_file("/nonexistent/run.json", c).is_ok());
}

TEST(BenchRun, BadMatrix) {
  RunConfig c = small(fresh_dir("bad"));
  c.depths = {120};
  EXPECT_FALSE(run_matrix(c).has_value());
  c = small(fresh_dir("bad"));
  c.tasks = {"nope"};
  EXPECT_FALSE(run_matrix(c).has_value());
  c = small(fresh_dir("bad"));
  c.models = {{"", "/nonexistent.gguf", nullptr, 0}};
  auto r = run_matrix(c);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("nonexistent"), std::string::npos);
  fs::remove_all(c.out_dir);
}

// The built-in suite: every task on the embedded model's twin at two short lengths.
TEST(BenchRun, TinySuiteEndToEnd) {
  const std::string out = fresh_dir("tiny");
  RunConfig c = tiny_suite();
  c.models = {{"", kModel, nullptr, 0}};
  c.out_dir = out;
  c.progress = false;
  c.n_threads = 1;
  std::vector<std::string> notes;
  c.note = [&](const std::string& m) { notes.push_back(m); };
  auto rep = run_matrix(c);
  ASSERT_TRUE(rep.has_value()) << rep.error().message;
  // qa_2 does not fit 512 tokens of a 512-token vocabulary; everything else runs.
  EXPECT_EQ(rep->run + rep->too_short, 40);
  EXPECT_LE(rep->too_short, 1);
  std::set<std::string> tasks;
  for (const auto& l : lines(out + "/results.jsonl")) tasks.insert(json::parse(l)["task"].get<std::string>());
  EXPECT_EQ(tasks.size(), 20u);
  for (const auto& cell : rep->summary.cells) {
    EXPECT_GE(cell.score, 0.0);
    EXPECT_LE(cell.score, 100.0);
  }
  expect_plot(out + "/accuracy_vs_length");
  fs::remove_all(out);
}

TEST(BenchPpl, ByPositionMatchesOneShotEvaluation) {
  auto model = Model::load(kModel);
  ASSERT_TRUE(model.has_value());
  std::vector<int32_t> toks = (*model)->tokenizer().encode(
      "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "
      "One day the dog ran after a red ball and Lily ran after the dog. They both laughed and went home.",
      true, false);
  ASSERT_GT(toks.size(), 40u);
  const int64_t n = static_cast<int64_t>(toks.size());
  // Chunked prefill (batch 7) against one decode of the whole text: the same numbers.
  auto ctx = Context::create(**model, {256, 7, 1});
  ASSERT_TRUE(ctx.has_value());
  auto c = perplexity_by_position(**ctx, toks, 16);
  ASSERT_TRUE(c.has_value()) << c.error().message;
  auto ref_ctx = Context::create(**model, {256, 256, 1});
  ASSERT_TRUE(ref_ctx.has_value());
  ASSERT_TRUE((*ref_ctx)->decode(toks, Logits::kAll).is_ok());
  const int32_t nv = (*model)->tokenizer().n_vocab();
  double total = 0;
  std::vector<double> bucket_sum((static_cast<size_t>(n) + 15) / 16, 0.0);
  for (int64_t i = 0; i + 1 < n; ++i) {
    const float* lg = (*ref_ctx)->logits(i);
    double mx = lg[0], s = 0;
    for (int32_t j = 1; j < nv; ++j) mx = std::max<double>(mx, lg[j]);
    for (int32_t j = 0; j < nv; ++j) s += std::exp(lg[j] - mx);
    const double nll = -(lg[toks[static_cast<size_t>(i + 1)]] - mx - std::log(s));
    total += nll;
    bucket_sum[static_cast<size_t>((i + 1) / 16)] += nll;
  }
  EXPECT_NEAR(c->ppl, std::exp(total / static_cast<double>(n - 1)), 1e-3 * c->ppl);
  int64_t counted = 0;
  for (const auto& b : c->buckets) {
    counted += b.n;
    EXPECT_NEAR(b.nll * static_cast<double>(b.n), bucket_sum[static_cast<size_t>(b.begin / 16)], 1e-3);
  }
  EXPECT_EQ(counted, n - 1);
  EXPECT_EQ(c->buckets.front().begin, 0);
  EXPECT_EQ(c->buckets.back().end, n);
  EXPECT_FALSE(perplexity_by_position(**ctx, std::vector<int32_t>(300, 1), 16).has_value());  // beyond n_ctx

  const std::string out = fresh_dir("ppl");
  fs::create_directories(out);
  c->model = "stories260K";
  c->method = "baseline";
  ASSERT_TRUE(write_ppl_csv({*c}, out + "/ppl.csv").is_ok());
  EXPECT_EQ(lines(out + "/ppl.csv").size(), 1 + c->buckets.size());
  ASSERT_TRUE(write_ppl_plot({*c}, out + "/ppl").is_ok());
  expect_plot(out + "/ppl");
  fs::remove_all(out);
}

}  // namespace
}  // namespace lc::bench

namespace lc::bench {
namespace {

// Query-aware and query-agnostic runs of one press are recorded apart; in agnostic mode the
// press compresses the context only (the question and answer prefix stay whole in the cache).
TEST(BenchRun, QueryModesAreRecordedApart) {
  const std::string out = fresh_dir("query");
  RunConfig c = small(out);
  c.tasks = {"niah_single_1"};
  c.lengths = {512};
  c.samples = 1;
  c.plots = false;
  c.methods = {MethodSetting{"aware", "gguf", "dense", "knorm:ratio=0.5"},
               MethodSetting{"agnostic", "gguf", "dense", "knorm:ratio=0.5,query=agnostic"}};
  auto rep = run_matrix(c);
  ASSERT_TRUE(rep.has_value()) << rep.error().message;
  std::set<std::string> modes;
  std::map<std::string, int64_t> kv;
  for (const auto& l : lines(out + "/results.jsonl")) {
    const auto j = nlohmann::json::parse(l);
    EXPECT_EQ(j["query"], j["method"]) << l;
    modes.insert(j["query"].get<std::string>());
    kv[j["method"].get<std::string>()] = j["kv_bytes"].get<int64_t>();
  }
  EXPECT_EQ(modes, (std::set<std::string>{"aware", "agnostic"}));
  // Agnostic halves the context only and keeps the question whole: at least as much is held.
  EXPECT_GE(kv["agnostic"], kv["aware"]);
  const auto csv = lines(out + "/summary.csv");
  bool seen = false;
  for (const auto& l : csv) seen |= l.find(",agnostic,") != std::string::npos;
  EXPECT_TRUE(seen);
  fs::remove_all(out);
}

}  // namespace
}  // namespace lc::bench
