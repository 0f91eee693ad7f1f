// The run matrix: models x method settings x tasks x lengths x depths x samples, greedy
// decoding, RULER scoring, and the reports: one JSON line per sample (results.jsonl), a
// summary per cell (summary.csv, summary.json, effective_length.csv) and plots (SVG + PNG).
// A re-run with the same output folder skips the samples already in results.jsonl.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/method.h"
#include "tasks/score.h"
#include "tasks/tasks.h"
#include "core/dtype.h"
#include "core/status.h"
#include "report/plot.h"

namespace lc::bench {

struct ModelRef {
  std::string name;            // in reports; default: the file name
  std::string path;            // GGUF file, or empty with `image`
  const uint8_t* image = nullptr;  // a GGUF image in memory that outlives the run
  size_t image_size = 0;
};

// A distributed run (`mpirun -np N longctx bench run`): rank r of N evaluates the samples whose
// place in the run's order is r modulo N. At the end every rank calls gather once with its
// payload; rank 0 gets every rank's, in rank order (the others an empty list), writes the
// records into results.jsonl in the run's order, so that the file is the one a single process
// writes (timing and memory fields aside), and writes the reports. The others write nothing.
struct RunShard {
  int rank = 0, size = 1;
  std::function<Expected<std::vector<std::string>>(const std::string& mine)> gather;
};

struct RunConfig {
  std::vector<ModelRef> models;
  std::vector<MethodSetting> methods;  // empty: the baseline only
  std::vector<std::string> tasks = {"ruler"};  // task names or groups
  std::vector<int64_t> lengths = {4096};
  std::vector<int> depths;             // percent; empty: RULER's random draw from 40 depths
  int64_t samples = 1;
  uint64_t seed = 42;
  tasks::GenOptions gen;
  double threshold = tasks::kDefaultThreshold;
  std::string out_dir = "bench-out";
  int64_t n_batch = 512;
  // Context size of every session (-c): -1 = the longest length (a sample that overruns it is an
  // error); 0 = grows as needed (a press that appends tokens, e.g. kvzip's reconstruction
  // passes); N = at least the longest length.
  int64_t n_ctx = -1;
  int n_threads = 0;
  // The paged KV cache of every context (--kv-block, --kv-type-k/-v, --kv-budget, --kv-spill).
  int64_t kv_block = 64;
  DType kv_type_k = DType::F32, kv_type_v = DType::F32;
  int64_t kv_budget = 0;   // bytes; 0: no cap
  std::string kv_spill;    // folder for the spill file; empty: none
  std::string chat_template = "auto";  // auto (from the GGUF), none, llama3, chatml, ...
  std::string draft;                   // --draft: draft model for speckv / specpc (same vocabulary)
  bool plots = true;
  bool progress = true;                // a progress line on a terminal
  std::function<void(const std::string&)> note;  // messages for the user (default: stderr)
  RunShard shard;                      // one process of a distributed run (default: the only one)
};

// Reads a JSON config ({"models": [...], "methods": [{"rope":..,"attn":..,"press":..,"qttt":..,"name":..}],
// "tasks": [...], "lengths": [4096, "8K"], "depths": [...], "samples": N, "seed": N,
// "threshold": X, "max_new_tokens": N, "observations": N, "chat_template": "auto",
// "batch": N, "ctx_size": N, "threads": N, "out": "dir", "draft": "draft.gguf", "kv_block": N, "kv_type_k":
// "f16", "kv_type_v": "f16", "kv_budget": "2G", "kv_spill": "dir"}) over `cfg`: fields present
// replace the defaults.
Status apply_config_json(const nlohmann::json& j, RunConfig& cfg);
Status load_config_file(const std::string& path, RunConfig& cfg);

// One sample's line in results.jsonl.
struct SampleRecord {
  std::string model, method, rope, attn, press, task, metric, chat_template;
  std::string qttt;                    // the qTTT spec, "" when off
  // "aware" (compressed after the whole prompt), "agnostic" (after the context, before the
  // question) or "" (no press): the two are reported apart (METHODS.md §2).
  std::string query;
  int64_t length = 0, index = 0;
  int depth = -1;
  uint64_t seed = 0;
  std::string input_hash;
  int64_t n_prompt = 0, max_new_tokens = 0, n_gen = 0;
  std::vector<std::string> answers;
  std::string output;
  double score = 0;
  double t_prefill = 0, t_decode = 0;  // seconds
  int64_t peak_rss = 0;                // bytes: the process's high-water mark so far
  int64_t kv_bytes = 0;                // bytes of the KV blocks holding tokens at the end
  int64_t kv_alloc_bytes = 0;          // bytes the cache has committed (pooled blocks, metadata)
  double needle_depth = -1;            // where the queried needle landed, 0..1 (-1: none)
  // qTTT: seconds of the whole adaptation (not in t_prefill), and the loss of its first span
  // before and after.
  double t_qttt = 0, qttt_loss_before = 0, qttt_loss_after = 0;
  // A reader's run: its spec, model calls, chunks, chunks that gave a candidate (mapreduce), and
  // the tokens prefilled over all calls (n_gen: generated over all calls; t_prefill: the whole
  // read's wall time).
  std::string reader;
  int64_t reader_calls = 0, reader_chunks = 0, reader_candidates = 0, reader_prompt_tokens = 0;
  std::string key() const;             // model|method|task|length|depth|index
  nlohmann::json to_json() const;
  static Expected<SampleRecord> from_json(const nlohmann::json& j);
};

// Reads results.jsonl; a malformed line (an interrupted write) is skipped and counted.
Expected<std::vector<SampleRecord>> read_results(const std::string& path, int64_t* bad_lines = nullptr);

struct CellSummary {
  std::string model, method, rope, attn, press, task;  // task "average": mean over the tasks
  std::string query;                                   // press mode: aware, agnostic or empty
  int64_t length = 0;
  int64_t n = 0;
  double score = 0;
  double prefill_tps = 0, decode_tps = 0;
  int64_t peak_rss = 0, kv_bytes = 0;
};
struct EffectiveLength {
  std::string model, method, task;
  int64_t length = 0;
};
struct Summary {
  std::vector<CellSummary> cells;        // sorted by model, method, task, length
  std::vector<EffectiveLength> effective;
  double threshold = tasks::kDefaultThreshold;
};

// The last record of each key counts (a re-run sample replaces the older line).
Summary summarize(const std::vector<SampleRecord>& records, double threshold);
Status write_summary(const Summary& s, const std::string& out_dir);  // CSV + JSON
Status write_plots(const Summary& s, const std::string& out_dir);

// Accuracy against KV-press ratio, the kvpress evaluation's picture: one chart per (length,
// query mode), one curve per press over the cells whose press is a single press with `ratio=`
// (duo_attention: `head_ratio=`), x the ratio, y the average score; the press-free cell (`none`)
// of the same model and length is the reference line. Chains and presses without a ratio are left
// out. Only charts with a curve of two ratios or more are returned; `stem` is the file name
// (accuracy_vs_ratio-aware, with -<length> added when the summary has several lengths).
struct RatioChart {
  std::string stem;
  report::Chart chart;
};
std::vector<RatioChart> ratio_charts(const Summary& s);

struct RunReport {
  int64_t run = 0;            // samples evaluated now
  int64_t resumed = 0;        // samples found in results.jsonl and skipped
  int64_t too_short = 0;      // cells skipped: the task does not fit the length
  Summary summary;
};

Expected<RunReport> run_matrix(const RunConfig& cfg);

// The small built-in suite: every task at two short lengths, 1 sample, on the given model.
RunConfig tiny_suite();
// The standard suite: the RULER tasks plus passkey, BABILong and dense tasks, 4K to 128K.
RunConfig standard_suite();

}  // namespace lc::bench
