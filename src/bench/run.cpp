#include "bench/run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "report/plot.h"
#include "tasks/text.h"
#include "core/progress.h"
#include "core/sys.h"
#include "model/model.h"
#include "readers/reader.h"
#include "readers/session_caller.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace lc::bench {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------- config

namespace {

Expected<int64_t> json_length(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const int64_t n = tasks::parse_length(v.get<std::string>());
    if (n > 0) return n;
  }
  return make_error("a length must be a number of tokens or a string like \"8K\"");
}

Expected<std::vector<std::string>> json_strings(const json& v, const char* what) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
    return out;
  }
  if (!v.is_array()) return make_error(fmt::format("config: \"{}\" must be a string or a list of strings", what));
  for (const auto& e : v) {
    if (!e.is_string()) return make_error(fmt::format("config: \"{}\" must hold strings", what));
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

Status apply_config_json(const json& j, RunConfig& cfg) {
  if (!j.is_object()) return make_error("config: expected a JSON object");
  static const std::set<std::string> known = {"models", "methods", "tasks", "lengths", "depths", "samples",
                                              "seed", "threshold", "max_new_tokens", "observations",
                                              "chat_template", "batch", "ctx_size", "threads", "out", "draft", "kv_block",
                                              "kv_type_k", "kv_type_v", "kv_budget", "kv_spill"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) return make_error(fmt::format("config: unknown field \"{}\"", it.key()));
  try {
    if (j.contains("models")) {
      LC_ASSIGN_OR_RETURN(auto m, json_strings(j["models"], "models"));
      cfg.models.clear();
      for (auto& p : m) cfg.models.push_back({"", p, nullptr, 0});
    }
    if (j.contains("methods")) {
      if (!j["methods"].is_array()) return make_error("config: \"methods\" must be a list");
      cfg.methods.clear();
      for (const auto& m : j["methods"]) {
        MethodSetting s;
        if (m.is_string()) {
          LC_ASSIGN_OR_RETURN(s, parse_method(m.get<std::string>()));
        } else if (m.is_object()) {
          for (auto it = m.begin(); it != m.end(); ++it) {
            if (!it.value().is_string()) return make_error("config: method fields must be strings");
            const std::string& k = it.key();
            const std::string v = it.value().get<std::string>();
            if (k == "rope") s.rope = v;
            else if (k == "attn") s.attn = v;
            else if (k == "press") s.press = v;
            else if (k == "qttt") s.qttt = v;
            else if (k == "reader") s.reader = v;
            else if (k == "name") s.name = v;
            else if (k == "model") s.model = v;
            else
              return make_error(fmt::format(
                  "config: unknown method field \"{}\" (rope, attn, press, qttt, reader, model, name)", k));
          }
        } else {
          return make_error("config: a method is an object {rope, attn, press, qttt, reader, model, name} or a string");
        }
        cfg.methods.push_back(s);
      }
    }
    if (j.contains("tasks")) {
      LC_ASSIGN_OR_RETURN(cfg.tasks, json_strings(j["tasks"], "tasks"));
    }
    if (j.contains("lengths")) {
      if (!j["lengths"].is_array()) return make_error("config: \"lengths\" must be a list");
      cfg.lengths.clear();
      for (const auto& v : j["lengths"]) {
        LC_ASSIGN_OR_RETURN(int64_t n, json_length(v));
        cfg.lengths.push_back(n);
      }
    }
    if (j.contains("depths")) {
      cfg.depths.clear();
      for (const auto& v : j.at("depths")) cfg.depths.push_back(v.get<int>());
    }
    if (j.contains("samples")) cfg.samples = j["samples"].get<int64_t>();
    if (j.contains("seed")) cfg.seed = j["seed"].get<uint64_t>();
    if (j.contains("threshold")) cfg.threshold = j["threshold"].get<double>();
    if (j.contains("max_new_tokens")) cfg.gen.max_new_tokens = j["max_new_tokens"].get<int64_t>();
    if (j.contains("observations")) cfg.gen.observations = j["observations"].get<int64_t>();
    if (j.contains("chat_template")) cfg.chat_template = j["chat_template"].get<std::string>();
    if (j.contains("batch")) cfg.n_batch = j["batch"].get<int64_t>();
    if (j.contains("ctx_size")) cfg.n_ctx = j["ctx_size"].get<int64_t>();
    if (j.contains("threads")) cfg.n_threads = j["threads"].get<int>();
    if (j.contains("out")) cfg.out_dir = j["out"].get<std::string>();
    if (j.contains("draft")) cfg.draft = j["draft"].get<std::string>();
    if (j.contains("kv_block")) cfg.kv_block = j["kv_block"].get<int64_t>();
    if (j.contains("kv_type_k")) {
      LC_ASSIGN_OR_RETURN(cfg.kv_type_k, parse_kv_type(j["kv_type_k"].get<std::string>()));
    }
    if (j.contains("kv_type_v")) {
      LC_ASSIGN_OR_RETURN(cfg.kv_type_v, parse_kv_type(j["kv_type_v"].get<std::string>()));
    }
    if (j.contains("kv_budget")) {
      const json& b = j["kv_budget"];
      if (b.is_number_integer()) {
        cfg.kv_budget = b.get<int64_t>();
      } else {
        LC_ASSIGN_OR_RETURN(cfg.kv_budget, parse_byte_size(b.get<std::string>()));
      }
    }
    if (j.contains("kv_spill")) cfg.kv_spill = j["kv_spill"].get<std::string>();
  } catch (const json::exception& e) {
    return make_error(fmt::format("config: {}", e.what()));
  }
  return ok_status();
}

Status load_config_file(const std::string& path, RunConfig& cfg) {
  std::ifstream in(path);
  if (!in) return make_error(fmt::format("{}: cannot open the config file", path));
  json j;
  try {
    in >> j;
  } catch (const json::exception& e) {
    return make_error(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
  Status st = apply_config_json(j, cfg);
  if (!st) return make_error(path + ": " + st.message());
  return ok_status();
}

// ---------------------------------------------------------------- records

std::string SampleRecord::key() const {
  return model + "|" + method + "|" + task + "|" + std::to_string(length) + "|" + std::to_string(depth) + "|" +
         std::to_string(index);
}

json SampleRecord::to_json() const {
  json j;
  j["model"] = model;
  j["method"] = method;
  j["rope"] = rope;
  j["attn"] = attn;
  j["press"] = press;
  j["query"] = query;
  j["task"] = task;
  j["metric"] = metric;
  j["length"] = length;
  j["depth"] = depth;
  j["index"] = index;
  j["seed"] = seed;
  j["chat_template"] = chat_template;
  j["input_hash"] = input_hash;
  j["n_prompt"] = n_prompt;
  j["max_new_tokens"] = max_new_tokens;
  j["answers"] = answers;
  j["output"] = output;
  j["score"] = score;
  j["n_gen"] = n_gen;
  j["t_prefill"] = t_prefill;
  j["t_decode"] = t_decode;
  j["prefill_tps"] = t_prefill > 0 ? static_cast<double>(n_prompt) / t_prefill : 0.0;
  j["decode_tps"] = t_decode > 0 ? static_cast<double>(n_gen) / t_decode : 0.0;
  j["peak_rss"] = peak_rss;
  j["kv_bytes"] = kv_bytes;
  j["kv_alloc_bytes"] = kv_alloc_bytes;
  j["needle_depth"] = needle_depth;
  if (!reader.empty()) {
    j["reader"] = reader;
    j["reader_calls"] = reader_calls;
    j["reader_chunks"] = reader_chunks;
    j["reader_candidates"] = reader_candidates;
    j["reader_prompt_tokens"] = reader_prompt_tokens;
  }
  if (!qttt.empty()) {
    j["qttt"] = qttt;
    j["t_qttt"] = t_qttt;
    j["qttt_loss_before"] = qttt_loss_before;
    j["qttt_loss_after"] = qttt_loss_after;
  }
  return j;
}

Expected<SampleRecord> SampleRecord::from_json(const json& j) {
  SampleRecord r;
  try {
    r.model = j.at("model").get<std::string>();
    r.method = j.at("method").get<std::string>();
    r.rope = j.value("rope", "");
    r.attn = j.value("attn", "");
    r.press = j.value("press", "");
    r.query = j.value("query", "");
    r.task = j.at("task").get<std::string>();
    r.metric = j.value("metric", "");
    r.length = j.at("length").get<int64_t>();
    r.depth = j.at("depth").get<int>();
    r.index = j.at("index").get<int64_t>();
    r.seed = j.value("seed", uint64_t{0});
    r.chat_template = j.value("chat_template", "");
    r.input_hash = j.at("input_hash").get<std::string>();
    r.n_prompt = j.value("n_prompt", int64_t{0});
    r.max_new_tokens = j.value("max_new_tokens", int64_t{0});
    r.answers = j.value("answers", std::vector<std::string>{});
    r.output = j.value("output", "");
    r.score = j.at("score").get<double>();
    r.n_gen = j.value("n_gen", int64_t{0});
    r.t_prefill = j.value("t_prefill", 0.0);
    r.t_decode = j.value("t_decode", 0.0);
    r.peak_rss = j.value("peak_rss", int64_t{0});
    r.kv_bytes = j.value("kv_bytes", int64_t{0});
    r.kv_alloc_bytes = j.value("kv_alloc_bytes", int64_t{0});
    r.needle_depth = j.value("needle_depth", -1.0);
    r.qttt = j.value("qttt", "");
    r.t_qttt = j.value("t_qttt", 0.0);
    r.qttt_loss_before = j.value("qttt_loss_before", 0.0);
    r.qttt_loss_after = j.value("qttt_loss_after", 0.0);
    r.reader = j.value("reader", "");
    r.reader_calls = j.value("reader_calls", int64_t{0});
    r.reader_chunks = j.value("reader_chunks", int64_t{0});
    r.reader_candidates = j.value("reader_candidates", int64_t{0});
    r.reader_prompt_tokens = j.value("reader_prompt_tokens", int64_t{0});
  } catch (const json::exception& e) {
    return make_error(fmt::format("bad result record: {}", e.what()));
  }
  return r;
}

Expected<std::vector<SampleRecord>> read_results(const std::string& path, int64_t* bad_lines) {
  std::vector<SampleRecord> out;
  if (bad_lines) *bad_lines = 0;
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  std::ifstream in(path);
  if (!in) return make_error(fmt::format("{}: cannot open the results file", path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      if (bad_lines) ++*bad_lines;
      continue;
    }
    auto r = SampleRecord::from_json(j);
    if (!r) {
      if (bad_lines) ++*bad_lines;
      continue;
    }
    out.push_back(std::move(*r));
  }
  return out;
}

// ---------------------------------------------------------------- summary

Summary summarize(const std::vector<SampleRecord>& records, double threshold) {
  Summary s;
  s.threshold = threshold;
  std::map<std::string, const SampleRecord*> last;  // key -> latest record
  for (const auto& r : records) last[r.key()] = &r;
  struct Acc {
    std::string rope, attn, press, query;
    int64_t n = 0, n_prompt = 0, n_gen = 0, rss = 0, kv = 0;
    double score = 0, t_prefill = 0, t_decode = 0;
  };
  using Key = std::tuple<std::string, std::string, std::string, int64_t>;  // model, method, task, length
  std::map<Key, Acc> cells;
  for (const auto& [k, r] : last) {
    Acc& a = cells[{r->model, r->method, r->task, r->length}];
    a.rope = r->rope, a.attn = r->attn, a.press = r->press, a.query = r->query;
    ++a.n;
    a.score += r->score;
    a.n_prompt += r->n_prompt;
    a.n_gen += r->n_gen;
    a.t_prefill += r->t_prefill;
    a.t_decode += r->t_decode;
    a.rss = std::max(a.rss, r->peak_rss);
    a.kv = std::max(a.kv, r->kv_bytes);
  }
  // The average over tasks: RULER's mean of the task means, with speeds over all samples.
  std::map<std::tuple<std::string, std::string, int64_t>, std::pair<Acc, int64_t>> avg;  // (acc, n tasks)
  for (const auto& [k, a] : cells) {
    auto& [b, ntask] = avg[{std::get<0>(k), std::get<1>(k), std::get<3>(k)}];
    b.rope = a.rope, b.attn = a.attn, b.press = a.press, b.query = a.query;
    b.n += a.n;
    b.score += a.score / static_cast<double>(a.n);
    b.n_prompt += a.n_prompt, b.n_gen += a.n_gen, b.t_prefill += a.t_prefill, b.t_decode += a.t_decode;
    b.rss = std::max(b.rss, a.rss), b.kv = std::max(b.kv, a.kv);
    ++ntask;
  }
  auto cell = [](const std::string& model, const std::string& method, const std::string& task, int64_t len,
                 const Acc& a, double score) {
    CellSummary c;
    c.model = model, c.method = method, c.rope = a.rope, c.attn = a.attn, c.press = a.press, c.task = task;
    c.query = a.query;
    c.length = len;
    c.n = a.n;
    c.score = score;
    c.prefill_tps = a.t_prefill > 0 ? static_cast<double>(a.n_prompt) / a.t_prefill : 0.0;
    c.decode_tps = a.t_decode > 0 ? static_cast<double>(a.n_gen) / a.t_decode : 0.0;
    c.peak_rss = a.rss, c.kv_bytes = a.kv;
    return c;
  };
  for (const auto& [k, a] : cells)
    s.cells.push_back(cell(std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), a, a.score / static_cast<double>(a.n)));
  for (const auto& [k, v] : avg)
    s.cells.push_back(cell(std::get<0>(k), std::get<1>(k), "average", std::get<2>(k), v.first,
                           v.first.score / static_cast<double>(v.second)));
  std::stable_sort(s.cells.begin(), s.cells.end(), [](const CellSummary& x, const CellSummary& y) {
    return std::tie(x.model, x.method, x.task, x.length) < std::tie(y.model, y.method, y.task, y.length);
  });
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<std::pair<int64_t, double>>> curves;
  for (const auto& c : s.cells) curves[{c.model, c.method, c.task}].emplace_back(c.length, c.score);
  for (const auto& [k, pts] : curves)
    s.effective.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), tasks::effective_length(pts, threshold)});
  return s;
}

namespace {

std::string csv(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

std::string slug(const std::string& s) {
  std::string o;
  for (char c : s) o += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return o;
}

}  // namespace

Status write_summary(const Summary& s, const std::string& out_dir) {
  {
    const std::string path = out_dir + "/summary.csv";
    std::ofstream f(path);
    if (!f) return make_error(fmt::format("{}: cannot write", path));
    f << "model,method,rope,attn,press,query,task,length,n,score,prefill_tps,decode_tps,peak_rss_mib,kv_mib\n";
    for (const auto& c : s.cells) {
      f << csv(c.model) << ',' << csv(c.method) << ',' << csv(c.rope) << ',' << csv(c.attn) << ',' << csv(c.press)
        << ',' << csv(c.query) << ',' << csv(c.task)
        << fmt::format(",{},{},{:.2f},{:.1f},{:.2f},{:.1f},{:.2f}\n", c.length, c.n, c.score, c.prefill_tps,
                       c.decode_tps, mib(c.peak_rss), mib(c.kv_bytes));
    }
    if (!f) return make_error(fmt::format("{}: write error", path));
  }
  {
    const std::string path = out_dir + "/effective_length.csv";
    std::ofstream f(path);
    if (!f) return make_error(fmt::format("{}: cannot write", path));
    f << "model,method,task,threshold,effective_length\n";
    for (const auto& e : s.effective)
      f << csv(e.model) << ',' << csv(e.method) << ',' << csv(e.task) << ',' << s.threshold << ',' << e.length << '\n';
    if (!f) return make_error(fmt::format("{}: write error", path));
  }
  {
    json j;
    j["threshold"] = s.threshold;
    j["cells"] = json::array();
    for (const auto& c : s.cells)
      j["cells"].push_back({{"model", c.model}, {"method", c.method}, {"rope", c.rope}, {"attn", c.attn},
                            {"press", c.press}, {"query", c.query}, {"task", c.task}, {"length", c.length}, {"n", c.n},
                            {"score", c.score}, {"prefill_tps", c.prefill_tps}, {"decode_tps", c.decode_tps},
                            {"peak_rss", c.peak_rss}, {"kv_bytes", c.kv_bytes}});
    j["effective_length"] = json::array();
    for (const auto& e : s.effective)
      j["effective_length"].push_back({{"model", e.model}, {"method", e.method}, {"task", e.task}, {"length", e.length}});
    const std::string path = out_dir + "/summary.json";
    std::ofstream f(path);
    if (!f) return make_error(fmt::format("{}: cannot write", path));
    f << j.dump(2) << '\n';
    if (!f) return make_error(fmt::format("{}: write error", path));
  }
  return ok_status();
}

namespace {

// "snapkv:ratio=0.5,query=aware" -> ("snapkv", 0.5); duo_attention's head_ratio and think's
// channel_ratio count as their ratio. Chains ("a+b"), "none" and presses without the key give
// nullopt.
std::optional<std::pair<std::string, double>> press_ratio(const std::string& press) {
  if (press.empty() || press == "none" || press.find('+') != std::string::npos) return std::nullopt;
  const size_t colon = press.find(':');
  if (colon == std::string::npos) return std::nullopt;
  const std::string name = press.substr(0, colon);
  const std::string want = name == "duo_attention" ? "head_ratio" : name == "think" ? "channel_ratio" : "ratio";
  std::stringstream keys(press.substr(colon + 1));
  for (std::string kv; std::getline(keys, kv, ',');) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || kv.substr(0, eq) != want) continue;
    try {
      size_t used = 0;
      const double r = std::stod(kv.substr(eq + 1), &used);
      if (used != kv.size() - eq - 1) return std::nullopt;
      return std::make_pair(name, r);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<RatioChart> ratio_charts(const Summary& s) {
  std::set<std::string> models;
  std::set<int64_t> lengths;
  for (const auto& c : s.cells) models.insert(c.model), lengths.insert(c.length);
  // (length, query) -> curve label -> (ratio -> score); the reference: (model, length) -> score.
  std::map<std::pair<int64_t, std::string>, std::map<std::string, std::map<double, double>>> curves;
  std::map<std::pair<std::string, int64_t>, double> reference;
  for (const auto& c : s.cells) {
    if (c.task != "average") continue;
    if (c.press == "none") {
      reference.emplace(std::make_pair(c.model, c.length), c.score);
      continue;
    }
    const auto pr = press_ratio(c.press);
    if (!pr) continue;
    const std::string label = (models.size() > 1 ? c.model + " · " : std::string()) + pr->first;
    curves[{c.length, c.query.empty() ? "aware" : c.query}][label][pr->second] = c.score;
  }
  std::vector<RatioChart> out;
  for (const auto& [key, by_label] : curves) {
    const auto& [length, query] = key;
    RatioChart rc;
    rc.stem = "accuracy_vs_ratio-" + query + (lengths.size() > 1 ? "-" + report::length_label(length) : "");
    report::Chart& ch = rc.chart;
    ch.title = fmt::format("Accuracy against press ratio, query-{} ({} tokens)", query, report::length_label(length));
    ch.x_label = "ratio (fraction of the KV cache removed)";
    ch.y_label = "score (average of the tasks)";
    ch.y_min = 0, ch.y_max = 100;
    if (models.size() == 1) {
      const auto it = reference.find({*models.begin(), length});
      if (it != reference.end()) ch.hline = it->second, ch.hline_label = fmt::format("no press {:.1f}", it->second);
    }
    bool any_curve = false;
    int k = 0;
    for (const auto& [label, points] : by_label) {
      report::Series se;
      se.label = label;
      for (const auto& [r, score] : points) se.x.push_back(r), se.y.push_back(score);
      any_curve = any_curve || se.x.size() >= 2;
      se.colour = k % 10;        // the palette's 10 colours, then dashes, then no markers
      se.dashed = (k / 10) % 2 == 1;
      se.markers = k < 20;
      ch.series.push_back(std::move(se));
      ++k;
    }
    if (any_curve) out.push_back(std::move(rc));
  }
  return out;
}

Status write_plots(const Summary& s, const std::string& out_dir) {
  // One curve per (model, method); the model's name is left out when there is only one.
  std::set<std::string> models;
  for (const auto& c : s.cells) models.insert(c.model);
  auto label = [&](const CellSummary& c) { return models.size() > 1 ? c.model + " · " + c.method : c.method; };
  std::map<std::string, std::vector<const CellSummary*>> avg;  // label -> average cells by length
  std::vector<std::string> order;
  std::set<std::string> tasks;
  for (const auto& c : s.cells) {
    if (c.task != "average") {
      tasks.insert(c.task);
      continue;
    }
    const std::string l = label(c);
    if (!avg.count(l)) order.push_back(l);
    avg[l].push_back(&c);
  }
  report::Chart acc;
  acc.title = fmt::format("Accuracy against length (average of {} task{})", tasks.size(), tasks.size() == 1 ? "" : "s");
  acc.x_label = "length (tokens)";
  acc.y_label = "score";
  acc.log2_x = true;
  acc.y_min = 0, acc.y_max = 100;
  acc.hline = s.threshold;
  acc.hline_label = fmt::format("threshold {:.1f}", s.threshold);
  report::Chart mem;
  mem.title = "Memory against length";
  mem.x_label = "length (tokens)";
  mem.y_label = "MiB (solid: peak RSS, dashed: KV cache)";
  mem.log2_x = true;
  mem.log10_y = true;
  report::Chart speed;
  speed.title = "Speed against length";
  speed.x_label = "length (tokens)";
  speed.y_label = "tokens/s (solid: prefill, dashed: decode)";
  speed.log2_x = true;
  speed.log10_y = true;
  int colour = 0;
  for (const auto& l : order) {
    report::Series a{l, {}, {}, false, colour}, rss{l + " RSS", {}, {}, false, colour}, kv{l + " KV", {}, {}, true, colour};
    report::Series pf{l + " prefill", {}, {}, false, colour}, dc{l + " decode", {}, {}, true, colour};
    for (const CellSummary* c : avg[l]) {
      const double x = static_cast<double>(c->length);
      a.x.push_back(x), a.y.push_back(c->score);
      rss.x.push_back(x), rss.y.push_back(mib(c->peak_rss));
      kv.x.push_back(x), kv.y.push_back(mib(c->kv_bytes));
      pf.x.push_back(x), pf.y.push_back(c->prefill_tps);
      dc.x.push_back(x), dc.y.push_back(c->decode_tps);
    }
    acc.series.push_back(a);
    mem.series.push_back(rss), mem.series.push_back(kv);
    speed.series.push_back(pf), speed.series.push_back(dc);
    ++colour;
  }
  LC_TRY(report::write_chart(acc, out_dir + "/accuracy_vs_length"));
  LC_TRY(report::write_chart(mem, out_dir + "/memory_vs_length"));
  LC_TRY(report::write_chart(speed, out_dir + "/speed_vs_length"));
  // Per task, one chart per (model, method).
  for (const auto& l : order) {
    report::Chart t;
    t.title = "Accuracy by task: " + l;
    t.x_label = "length (tokens)";
    t.y_label = "score";
    t.log2_x = true;
    t.y_min = 0, t.y_max = 100;
    std::map<std::string, report::Series> by_task;
    for (const auto& c : s.cells) {
      if (c.task == "average" || label(c) != l) continue;
      report::Series& se = by_task[c.task];
      se.label = c.task;
      se.x.push_back(static_cast<double>(c.length));
      se.y.push_back(c.score);
    }
    int k = 0;
    for (auto& [name, se] : by_task) {
      se.dashed = k >= 10;  // the palette has 10 colours; dashes tell the next 10 apart
      t.series.push_back(se);
      ++k;
    }
    LC_TRY(report::write_chart(t, out_dir + "/accuracy_by_task-" + slug(l)));
  }
  for (const auto& rc : ratio_charts(s)) LC_TRY(report::write_chart(rc.chart, out_dir + "/" + rc.stem));
  return ok_status();
}

// ---------------------------------------------------------------- the run

namespace {

struct Cell {
  std::string task;
  int64_t length;
  int depth;
  int64_t index;
};

}  // namespace

Expected<RunReport> run_matrix(const RunConfig& cfg_in) {
  RunConfig cfg = cfg_in;
  auto note = cfg.note ? cfg.note : [](const std::string& m) { fmt::print(stderr, "{}\n", m); };
  if (cfg.models.empty()) return make_error("bench run: no model given");
  if (cfg.lengths.empty()) return make_error("bench run: no length given");
  if (cfg.samples < 1) return make_error("bench run: --samples must be at least 1");
  for (int64_t l : cfg.lengths)
    if (l < 16 || l > (int64_t{1} << 30)) return make_error(fmt::format("bench run: length {} is out of range", l));
  for (int d : cfg.depths)
    if (d < 0 || d > 100) return make_error(fmt::format("bench run: depth {} is not a percentage in [0, 100]", d));
  if (cfg.methods.empty()) cfg.methods.push_back(MethodSetting{});
  {
    std::set<std::string> labels;
    for (const auto& m : cfg.methods)
      if (!labels.insert(m.label()).second)
        return make_error(fmt::format("bench run: two method settings are both called '{}'", m.label()));
  }
  // A setting pinned to a model (model=) runs on that model only; its model joins the run.
  auto same_file = [](const std::string& a, const std::string& b) {
    std::error_code e1, e2;
    const fs::path pa = fs::weakly_canonical(a, e1), pb = fs::weakly_canonical(b, e2);
    return e1 || e2 ? a == b : pa == pb;
  };
  auto runs_on = [&](const MethodSetting& m, const ModelRef& r) {
    return m.model.empty() || (!r.image && same_file(m.model, r.path));
  };
  for (const auto& m : cfg.methods) {
    if (m.model.empty()) continue;
    if (!fs::is_regular_file(m.model))
      return make_error(ErrorCode::kIo, fmt::format("bench run: method {}: model {} is not a file", m.label(), m.model));
    bool listed = false;
    for (const auto& r : cfg.models) listed = listed || runs_on(m, r);
    if (!listed) cfg.models.push_back({"", m.model, nullptr, 0});
  }
  // A model no setting runs on (the default model, when every setting names its own) is left out.
  std::erase_if(cfg.models, [&](const ModelRef& r) {
    return std::none_of(cfg.methods.begin(), cfg.methods.end(), [&](const MethodSetting& m) { return runs_on(m, r); });
  });
  LC_ASSIGN_OR_RETURN(std::vector<std::string> tasks, tasks::expand_task_names(cfg.tasks));
  std::sort(cfg.lengths.begin(), cfg.lengths.end());
  cfg.lengths.erase(std::unique(cfg.lengths.begin(), cfg.lengths.end()), cfg.lengths.end());
  if (cfg.n_ctx < -1 || (cfg.n_ctx > 0 && cfg.n_ctx < cfg.lengths.back()))
    return make_error(fmt::format("bench run: --ctx-size {} is below the longest length {} (0: grows as needed)",
                                  cfg.n_ctx, cfg.lengths.back()));

  std::error_code ec;
  fs::create_directories(cfg.out_dir, ec);
  if (ec) return make_error(fmt::format("{}: cannot create the output folder ({})", cfg.out_dir, ec.message()));
  const std::string results_path = cfg.out_dir + "/results.jsonl";
  int64_t bad = 0;
  LC_ASSIGN_OR_RETURN(std::vector<SampleRecord> previous, read_results(results_path, &bad));
  if (bad > 0) note(fmt::format("bench run: {} unreadable line(s) in {} ignored", bad, results_path));
  std::map<std::string, std::string> done;  // key -> input hash
  for (const auto& r : previous) done[r.key()] = r.input_hash;
  const RunShard& shard = cfg.shard;
  const bool distributed = shard.size > 1;
  if (distributed && (shard.rank < 0 || shard.rank >= shard.size || !shard.gather))
    return make_error(fmt::format("bench run: rank {} of {} has no way to hand its results over", shard.rank,
                                  shard.size));
  // A distributed run's ranks keep their records (with their place in the run's order) until
  // the end; rank 0 writes them all.
  std::vector<std::pair<int64_t, std::string>> kept;
  nlohmann::json resumed_keys = nlohmann::json::array();
  std::ofstream out;
  if (!distributed || shard.rank == 0) {
    out.open(results_path, std::ios::app);
    if (!out) return make_error(fmt::format("{}: cannot open for appending", results_path));
  }
  auto write_record = [&](int64_t order, const SampleRecord& rec) -> Status {
    if (distributed) {
      kept.emplace_back(order, rec.to_json().dump());
      return ok_status();
    }
    out << rec.to_json().dump() << '\n';
    out.flush();
    if (!out) return make_error(fmt::format("{}: write error", results_path));
    return ok_status();
  };

  // The cells of one (model, method): lengths ascending, so the cache only grows.
  std::vector<Cell> cells;
  for (int64_t len : cfg.lengths)
    for (const auto& t : tasks) {
      const tasks::TaskInfo* info = tasks::find_task(t);
      std::vector<int> depths = info->uses_depth && !cfg.depths.empty() ? cfg.depths : std::vector<int>{-1};
      for (int d : depths)
        for (int64_t i = 0; i < cfg.samples; ++i) cells.push_back({t, len, d, i});
    }
  int64_t pairs = 0;  // (model, setting) pairs that run
  for (const auto& r : cfg.models)
    for (const auto& m : cfg.methods) pairs += runs_on(m, r);
  const int64_t total_all = static_cast<int64_t>(cells.size()) * pairs;
  // This rank's share: places r, r + N, ...
  const int64_t total = distributed ? (total_all - shard.rank + shard.size - 1) / shard.size : total_all;
  int64_t order = -1;  // the place of the sample in the run's order
  RunReport rep;
  std::set<std::string> keys_in_matrix;
  std::set<std::string> short_noted;
  std::unique_ptr<Progress> prog;
  if (cfg.progress && (!distributed || shard.rank == 0)) prog = std::make_unique<Progress>("bench", total, "samples");
  int64_t n_done = 0;

  std::unique_ptr<Model> draft;
  if (!cfg.draft.empty()) {
    LC_ASSIGN_OR_RETURN(draft, Model::load(cfg.draft));
  }
  for (const ModelRef& mref : cfg.models) {
    std::unique_ptr<Model> model;
    if (mref.image) {
      LC_ASSIGN_OR_RETURN(model, Model::load_memory(mref.image, mref.image_size, mref.name.empty() ? "model" : mref.name));
    } else {
      LC_ASSIGN_OR_RETURN(model, Model::load(mref.path));
    }
    const std::string model_name = !mref.name.empty() ? mref.name : fs::path(mref.path).filename().string();
    ChatTemplate tmpl = ChatTemplate::kNone;
    if (cfg.chat_template == "auto") {
      tmpl = detect_chat_template(model->file(), model->tokenizer());
    } else {
      LC_ASSIGN_OR_RETURN(tmpl, chat_template_from_name(cfg.chat_template));
    }
    const tasks::PromptRenderer renderer(model->tokenizer(), tmpl);
    // Every setting is tried on this model before any work, so that a bad spec fails now.
    for (const MethodSetting& method : cfg.methods) {
      if (!runs_on(method, mref)) continue;
      ContextParams pp;
      pp.n_ctx = cfg.lengths.front();
      pp.n_batch = 16;
      pp.n_threads = 1;
      pp.kv_block = cfg.kv_block;
      pp.kv_type_k = cfg.kv_type_k, pp.kv_type_v = cfg.kv_type_v;
      pp.kv_spill = cfg.kv_spill;
      pp.model_name = model_name;
      pp.draft = draft.get();
      pp.draft_name = cfg.draft;
      auto probe = make_session_for(*model, method, pp);
      if (!probe) return probe.error();
      if (method.has_reader()) {
        auto r = readers::make_reader(method.reader);
        if (!r) return make_error(r.error().code, fmt::format("method {}: {}", method.label(), r.error().message));
      }
    }
    for (const MethodSetting& method : cfg.methods) {
      if (!runs_on(method, mref)) continue;
      const std::string mlabel = method.label();
      ContextParams cp;  // rope and attention come from the method setting
      cp.n_ctx = cfg.n_ctx < 0 ? cfg.lengths.back() : cfg.n_ctx;
      cp.n_batch = cfg.n_batch;
      cp.n_threads = cfg.n_threads;
      cp.kv_block = cfg.kv_block;
      cp.kv_type_k = cfg.kv_type_k, cp.kv_type_v = cfg.kv_type_v;
      cp.kv_budget = cfg.kv_budget;
      cp.kv_spill = cfg.kv_spill;
      cp.model_name = model_name;
      cp.draft = draft.get();
      cp.draft_name = cfg.draft;
      LC_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, make_session_for(*model, method, cp));
      const Context* ctx = &session->context();
      const QtttParams& qttt = session->params().qttt;
      const bool agnostic = ctx->press() && !ctx->press()->schedule().query_aware;
      const std::string query_mode = !ctx->press() ? "" : agnostic ? "agnostic" : "aware";
      for (const Cell& cell : cells) {
        if (++order % shard.size != shard.rank) continue;
        tasks::SampleSpec spec;
        spec.task = cell.task;
        spec.length = cell.length;
        spec.depth = cell.depth;
        spec.index = cell.index;
        spec.seed = cfg.seed;
        spec.opts = cfg.gen;
        auto sample = tasks::make_sample(renderer, spec);
        if (!sample) {
          if (sample.error().code != ErrorCode::kTooShort) return sample.error();
          ++rep.too_short;
          const std::string k = model_name + "|" + cell.task + "|" + std::to_string(cell.length);
          if (short_noted.insert(k).second) note("bench run: skipped: " + sample.error().message);
          if (prog) prog->update(++n_done);
          continue;
        }
        SampleRecord rec;
        rec.model = model_name;
        rec.method = mlabel;
        // An empty attention is the model's default (dense, or fixed); record which ran.
        rec.rope = method.rope, rec.attn = method.attn.empty() ? ctx->attention().spec() : method.attn;
        if ((rec.rope.empty() || rec.rope == "gguf") && ctx->rope_plan().logn())  // the model's own logn
          rec.rope = fmt::format("gguf+logn:orig={}", ctx->rope_plan().logn_l0());
        rec.press = method.press;
        rec.qttt = qttt.enabled() ? qttt.spec() : "";
        rec.query = query_mode;
        rec.task = cell.task;
        rec.metric = tasks::metric_name(tasks::find_task(cell.task)->metric);
        rec.chat_template = chat_template_name(tmpl);
        rec.length = cell.length;
        rec.depth = sample->spec.depth;
        rec.index = cell.index;
        rec.seed = sample->seed;
        rec.input_hash = sample->input_hash;
        rec.n_prompt = sample->n_prompt;
        rec.max_new_tokens = sample->max_new_tokens;
        rec.answers = sample->answers;
        rec.needle_depth = sample->needles.empty() ? -1.0 : sample->needles[0].depth;
        const std::string key = rec.key();
        keys_in_matrix.insert(key);
        auto it = done.find(key);
        if (it != done.end() && it->second == rec.input_hash) {
          if (distributed) resumed_keys.push_back({key, rec.input_hash});
          ++rep.resumed;
          if (prog) prog->update(++n_done);
          continue;
        }
        // The request: the sample's context, compressed (query-agnostic presses) or adapted to
        // (qTTT) before its question, then greedy decoding.
        SamplerParams sp;
        sp.temp = 0;  // greedy
        sp.top_k = 0, sp.top_p = 1, sp.min_p = 0, sp.repeat_penalty = 1;
        Sampler sampler(sp);
        if (method.has_reader()) {
          // A reading agent reads the context from a file in chunks and answers the question
          // (the text after the context in the user message) through its own templates.
          LC_ASSIGN_OR_RETURN(std::unique_ptr<readers::Reader> reader, readers::make_reader(method.reader));
          const size_t at = sample->user.find(sample->context);
          if (sample->context.empty() || at == std::string::npos)
            return make_error(fmt::format("bench run: task {} has no context a reader can read", cell.task));
          const std::string question = readers::trim(sample->user.substr(at + sample->context.size()));
          const std::string doc = cfg.out_dir + "/reader_document.txt";
          {
            std::ofstream f(doc, std::ios::binary | std::ios::trunc);
            f << sample->context;
            if (!f) return make_error(ErrorCode::kIo, fmt::format("{}: cannot write the reader's document", doc));
          }
          readers::SessionCaller caller(*session, sampler, tmpl);
          auto rr = readers::read_document(*reader, caller, readers::TemplateSource(), doc, question, {});
          fs::remove(doc, ec);
          if (!rr)
            return make_error(rr.error().code, fmt::format("bench run: method {}, task {} at length {}: {}", mlabel,
                                                           cell.task, cell.length, rr.error().message));
          rec.reader = reader->spec();
          rec.reader_calls = rr->stats.calls;
          rec.reader_chunks = rr->stats.chunks;
          rec.reader_candidates = rr->stats.candidates;
          rec.reader_prompt_tokens = rr->stats.prompt_tokens;
          rec.output = tasks::postprocess_prediction(rr->answer);
          rec.score = tasks::score_prediction(tasks::find_task(cell.task)->metric, rec.output, rec.answers);
          rec.n_gen = rr->stats.gen_tokens;
          rec.t_prefill = rr->stats.seconds;
          rec.peak_rss = peak_rss_bytes();
          LC_TRY(write_record(order, rec));
          done[key] = rec.input_hash;
          ++rep.run;
          if (prog) prog->update(++n_done);
          continue;
        }
        GenerateOptions go;
        go.n_predict = sample->max_new_tokens;
        go.qttt_seed = sample->seed;
        auto st = session->run(Prompt{sample->tokens, sample->n_context_tokens}, sampler, go, {});
        if (!st)
          return make_error(st.error().code, fmt::format("bench run: method {}, task {} at length {}: {}", mlabel,
                                                         cell.task, cell.length,
                                                         st.error().message));
        if (st->qttt_ran) {
          rec.t_qttt = st->qttt.seconds;
          rec.qttt_loss_before = st->qttt.loss_before;
          rec.qttt_loss_after = st->qttt.loss_after;
        }
        const std::string& text = st->text;
        rec.output = tasks::postprocess_prediction(text);
        rec.score = tasks::score_prediction(tasks::find_task(cell.task)->metric, rec.output, rec.answers);
        rec.n_gen = st->n_gen;
        rec.t_prefill = st->t_prompt;
        rec.t_decode = st->t_gen;
        rec.peak_rss = peak_rss_bytes();
        // The blocks holding tokens (what a press or a sparse method saves), and the memory the
        // cache has committed (blocks in use or pooled).
        const KvMemory mem = ctx->kv().memory();
        rec.kv_bytes = static_cast<int64_t>(mem.in_use_bytes);
        rec.kv_alloc_bytes = static_cast<int64_t>(mem.resident_bytes + mem.metadata_bytes);
        LC_TRY(write_record(order, rec));
        done[key] = rec.input_hash;
        ++rep.run;
        if (prog) prog->update(++n_done);
      }
    }
  }
  if (prog) prog->finish();
  if (distributed) {
    nlohmann::json mine{{"records", kept}, {"resumed", resumed_keys}, {"run", rep.run},
                        {"resumed_n", rep.resumed}, {"too_short", rep.too_short}};
    LC_ASSIGN_OR_RETURN(std::vector<std::string> all, shard.gather(mine.dump()));
    if (shard.rank != 0) return rep;
    if (static_cast<int>(all.size()) != shard.size)
      return make_error(fmt::format("bench run: {} of {} ranks' results arrived", all.size(), shard.size));
    std::vector<std::pair<int64_t, std::string>> records;
    rep = RunReport{};
    for (const std::string& payload : all) {
      nlohmann::json j = nlohmann::json::parse(payload, nullptr, false);
      if (j.is_discarded() || !j.contains("records"))
        return make_error("bench run: a rank's results arrived malformed");
      for (const auto& r : j["records"]) records.emplace_back(r[0].get<int64_t>(), r[1].get<std::string>());
      for (const auto& k : j["resumed"]) keys_in_matrix.insert(k[0].get<std::string>());
      rep.run += j["run"].get<int64_t>();
      rep.resumed += j["resumed_n"].get<int64_t>();
      rep.too_short += j["too_short"].get<int64_t>();
    }
    std::sort(records.begin(), records.end());
    for (const auto& [place, line] : records) {
      LC_ASSIGN_OR_RETURN(SampleRecord rec, SampleRecord::from_json(nlohmann::json::parse(line)));
      keys_in_matrix.insert(rec.key());
      done[rec.key()] = rec.input_hash;
      out << line << '\n';
    }
    out.flush();
    if (!out) return make_error(fmt::format("{}: write error", results_path));
  }
  out.close();

  // The summary covers this matrix, read back from the file (so resumed samples count).
  LC_ASSIGN_OR_RETURN(std::vector<SampleRecord> all, read_results(results_path, nullptr));
  std::vector<SampleRecord> mine;
  for (auto& r : all)
    if (keys_in_matrix.count(r.key()) && done[r.key()] == r.input_hash) mine.push_back(std::move(r));
  rep.summary = summarize(mine, cfg.threshold);
  LC_TRY(write_summary(rep.summary, cfg.out_dir));
  if (cfg.plots) LC_TRY(write_plots(rep.summary, cfg.out_dir));
  return rep;
}

RunConfig tiny_suite() {
  RunConfig c;
  c.tasks = {"all"};
  c.lengths = {512, 1024};
  c.depths = {50};
  c.samples = 1;
  c.gen.max_new_tokens = 8;
  return c;
}

RunConfig standard_suite() {
  RunConfig c;
  c.tasks = {"ruler", "passkey", "babilong", "dense"};
  c.lengths = {4096, 8192, 16384, 32768, 65536, 131072};
  c.samples = 10;
  return c;
}

}  // namespace lc::bench
