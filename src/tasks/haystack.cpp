#include "tasks/haystack.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "tasks/text.h"

namespace lc::tasks {

namespace fs = std::filesystem;

const std::vector<std::string>& noise_sentences() {
  static const std::vector<std::string> v = {"The grass is green.", "The sky is blue.",
                                             "The sun is yellow.", "Here we go.",
                                             "There and back again."};
  return v;
}

const std::string& noise_block() {
  static const std::string b = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
  return b;
}

namespace {
std::mutex g_mu;
std::string g_dir;  // guarded by g_mu

std::vector<fs::path> candidate_dirs() {
  std::vector<fs::path> out;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_dir.empty()) out.emplace_back(g_dir);
  }
  if (const char* e = std::getenv("LONGCTX_DATA_DIR"); e && *e) out.emplace_back(e);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path d = exe.parent_path();
    for (int up = 0; up < 3 && !d.empty(); ++up, d = d.parent_path()) out.push_back(d / "data" / "haystack");
  }
  // The source tree: this file is src/tasks/haystack.cpp.
  out.push_back(fs::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "haystack");
  return out;
}
}  // namespace

void set_data_dir(std::string dir) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_dir = std::move(dir);
}

Expected<std::string> find_data_file(const std::string& name) {
  std::string tried;
  for (const fs::path& d : candidate_dirs()) {
    const fs::path p = d / name;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
    tried += "\n  " + p.string();
  }
  return make_error(fmt::format("haystack file {} not found (use --data-dir or LONGCTX_DATA_DIR); tried:{}",
                                name, tried));
}

Expected<const std::vector<std::string>*> essay_words() {
  static std::mutex mu;
  static std::vector<std::string> words;
  std::lock_guard<std::mutex> lk(mu);
  if (!words.empty()) return &words;
  LC_ASSIGN_OR_RETURN(std::string path, find_data_file("opticks.txt"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(fmt::format("{}: cannot open the essay haystack", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::vector<std::string> w = split_words(ss.str());
  if (w.size() < 1000) return make_error(ErrorCode::kBadFile, fmt::format("{}: the essay haystack is truncated ({} words; expected Newton's Opticks, data/haystack/README.md)", path, w.size()));
  words = std::move(w);
  return &words;
}

size_t essay_sentence_start(const std::vector<std::string>& words, size_t w) {
  const size_t n = words.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (w + k) % n;
    const std::string& prev = words[(i + n - 1) % n];
    const char c = prev.back();
    if (c == '.' || c == '!' || c == '?') return i;
  }
  return 0;
}

std::vector<std::string> essay_sentences(const std::vector<std::string>& words, size_t start,
                                         size_t n_words) {
  std::vector<std::string> out;
  std::string cur;
  const size_t n = words.size();
  for (size_t k = 0; k < n_words; ++k) {
    const std::string& w = words[(start + k) % n];
    if (!cur.empty()) cur += ' ';
    cur += w;
    const char c = w.back();
    if (c == '.' || c == '!' || c == '?') {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace lc::tasks
