#include "readers/reader.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "readers/document.h"
#include "readers/readers_impl.h"

namespace lc::readers {

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return std::string(s);
}

std::string extract_boxed(std::string_view reply) {
  const size_t at = reply.rfind("\\boxed{");
  if (at == std::string_view::npos) return trim(reply);
  size_t i = at + 7;
  int depth = 1;
  const size_t start = i;
  for (; i < reply.size(); ++i) {
    if (reply[i] == '{') ++depth;
    if (reply[i] == '}' && --depth == 0) return trim(reply.substr(start, i - start));
  }
  return trim(reply.substr(start));  // unclosed: what follows the brace
}

Fit fit_window(int64_t window_key, int64_t chunk_key, int64_t memory_key, int64_t model_window) {
  Fit f;
  f.window = window_key > 0 ? window_key : model_window;
  f.chunk = chunk_key > 0 ? chunk_key : f.window * 5000 / 8192;
  f.memory = memory_key > 0 ? memory_key : f.window * 1024 / 8192;
  return f;
}

int64_t ReaderEnv::count_tokens(std::string_view text) const {
  return static_cast<int64_t>(model_.tokenizer().encode(text, false, false).size());
}

Expected<std::string> ReaderEnv::call(const Template& t, const std::map<std::string, std::string>& values,
                                      int64_t max_tokens, int64_t chunk) {
  LC_TRY(budget());
  CallRecord rec;
  rec.step = t.name;
  rec.chunk = chunk;
  auto reply = model_.call(render(t, values), t.prefix, max_tokens, t.stop, rec.cost);
  if (!reply) return make_error(reply.error().code, fmt::format("reader step {}: {}", t.name, reply.error().message));
  ++stats_.calls;
  stats_.prompt_tokens += rec.cost.n_prompt;
  stats_.gen_tokens += rec.cost.n_gen;
  rec.reply = *reply;
  if (log_) log_(rec);
  return reply;
}

Expected<std::vector<std::string>> ReaderEnv::call_batch(const Template& t,
                                                         const std::vector<std::map<std::string, std::string>>& values,
                                                         int64_t max_tokens, int64_t first_chunk) {
  if (values.size() == 1) {
    LC_ASSIGN_OR_RETURN(std::string r, call(t, values[0], max_tokens, first_chunk));
    return std::vector<std::string>{std::move(r)};
  }
  if (stats_.calls + static_cast<int64_t>(values.size()) > max_calls_) LC_TRY(budget_error());
  std::vector<std::string> users;
  for (const auto& v : values) users.push_back(render(t, v));
  std::vector<CallCost> costs;
  auto replies = model_.call_batch(users, t.prefix, max_tokens, t.stop, costs);
  if (!replies) return make_error(replies.error().code, fmt::format("reader step {}: {}", t.name, replies.error().message));
  for (size_t i = 0; i < replies->size(); ++i) {
    ++stats_.calls;
    stats_.prompt_tokens += costs[i].n_prompt;
    stats_.gen_tokens += costs[i].n_gen;
    if (log_) log_(CallRecord{t.name, first_chunk + static_cast<int64_t>(i), (*replies)[i], costs[i]});
  }
  return replies;
}

Status ReaderEnv::budget() const {
  if (stats_.calls < max_calls_) return ok_status();
  return budget_error();
}

Status ReaderEnv::budget_error() const {
  return make_error(ErrorCode::kTooShort,
                    fmt::format("reader: reached its cap of {} model calls (calls=) before the read ended; "
                                "raise calls= or use larger chunks",
                                max_calls_));
}

Status ReaderEnv::record(const CallRecord& rec, bool model_call) {
  if (model_call) {
    ++stats_.calls;
    stats_.prompt_tokens += rec.cost.n_prompt;
    stats_.gen_tokens += rec.cost.n_gen;
  }
  if (log_) log_(rec);
  return ok_status();
}

namespace {

constexpr const char* kCheckpointFormat = "longctx-reader-checkpoint-1";

nlohmann::json stats_json(const ReadStats& s) {
  return {{"chunks", s.chunks},         {"calls", s.calls},         {"doc_tokens", s.doc_tokens},
          {"prompt_tokens", s.prompt_tokens}, {"gen_tokens", s.gen_tokens}, {"candidates", s.candidates}};
}

Status write_checkpoint(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return make_error(ErrorCode::kIo, fmt::format("--checkpoint: cannot write {}", tmp));
    out << j.dump() << '\n';
    if (!out) return make_error(ErrorCode::kIo, fmt::format("--checkpoint: write error on {}", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return make_error(ErrorCode::kIo, fmt::format("--checkpoint: cannot rename {} to {}: {}", tmp, path, ec.message()));
  return ok_status();
}

Expected<nlohmann::json> read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, fmt::format("--resume: cannot open checkpoint {}", path));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kCheckpointFormat)
    return make_error(ErrorCode::kBadFile, fmt::format("--resume: {} is not a reader checkpoint", path));
  return j;
}

}  // namespace

Expected<ReadResult> read_document(Reader& reader, ModelCaller& model, const TemplateSource& templates,
                                   const std::string& path, const std::string& question, const ReadOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (trim(question).empty()) return make_error(ErrorCode::kInvalidArgument, "reader: the question is empty");
  ReaderEnv env(model, templates, reader.max_calls());
  env.set_document(path);
  if (opt.log) env.set_log(opt.log);
  LC_TRY(reader.prepare(env, question));
  LC_ASSIGN_OR_RETURN(ChunkStream doc, ChunkStream::open(path, model.tokenizer(), reader.chunk_tokens()));

  nlohmann::json ck = {{"format", kCheckpointFormat}, {"reader", reader.spec()},  {"question", question},
                       {"document", path},            {"doc_bytes", doc.bytes_total()}};
  int64_t skip = 0;
  if (opt.resume && !opt.checkpoint.empty() && std::filesystem::exists(opt.checkpoint)) {
    LC_ASSIGN_OR_RETURN(nlohmann::json j, read_checkpoint(opt.checkpoint));
    for (const char* k : {"reader", "question", "doc_bytes"})
      if (j[k] != ck[k])
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("--resume: checkpoint {} was made with another {} ({} there, {} now)",
                                      opt.checkpoint, k, j[k].dump(), ck[k].dump()));
    try {
      skip = j.at("chunks_done").get<int64_t>();
      LC_TRY(reader.restore(j.at("state").get<std::vector<std::string>>()));
      const auto& s = j.at("stats");
      ReadStats& st = env.stats();
      st.calls = s.at("calls").get<int64_t>();
      st.prompt_tokens = s.at("prompt_tokens").get<int64_t>();
      st.gen_tokens = s.at("gen_tokens").get<int64_t>();
      st.candidates = s.at("candidates").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      return make_error(ErrorCode::kBadFile, fmt::format("--resume: checkpoint {} is malformed: {}", opt.checkpoint, e.what()));
    }
    env.stats().resumed_chunks = skip;
  }

  // Chunks go to the reader `batch()` at a time (one for readers whose calls depend on the
  // previous chunk's); the checkpoint follows each group.
  const auto batch = static_cast<size_t>(std::max<int64_t>(1, reader.batch()));
  std::vector<std::string> group;
  int64_t group_first = 0;
  auto read_group = [&]() -> Status {
    if (group.empty()) return ok_status();
    LC_TRY(group.size() == 1 ? reader.read_chunk(env, question, group_first, group[0])
                             : reader.read_chunks(env, question, group_first, group));
    const int64_t done = group_first + static_cast<int64_t>(group.size());
    group.clear();
    if (!opt.checkpoint.empty()) {
      ck["chunks_done"] = done;
      ck["state"] = reader.state();
      ck["stats"] = stats_json(env.stats());
      LC_TRY(write_checkpoint(opt.checkpoint, ck));
    }
    return ok_status();
  };
  for (;;) {
    if (opt.cancel != nullptr && opt.cancel->load(std::memory_order_relaxed))
      return make_error(ErrorCode::kCancelled, "reader: cancelled");
    LC_ASSIGN_OR_RETURN(Chunk c, doc.next());
    if (c.n_tokens == 0) break;
    ReadStats& st = env.stats();
    st.chunks = c.index + 1;
    st.doc_tokens = doc.tokens_read();
    if (c.index >= skip) {
      if (group.empty()) group_first = c.index;
      group.push_back(std::move(c.text));
      if (group.size() >= batch) LC_TRY(read_group());
    }
    if (opt.progress && group.empty()) opt.progress(doc.bytes_read(), doc.bytes_total());
  }
  const bool pending = !group.empty();
  LC_TRY(read_group());
  if (pending && opt.progress) opt.progress(doc.bytes_read(), doc.bytes_total());
  if (env.stats().chunks < skip)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("--resume: checkpoint {} is past the end of the document ({} chunks done, {} now)",
                                  opt.checkpoint, skip, env.stats().chunks));
  LC_ASSIGN_OR_RETURN(ReadResult r, reader.finish(env, question));
  r.stats = env.stats();
  r.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace lc::readers
