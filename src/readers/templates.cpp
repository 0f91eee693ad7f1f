#include "readers/templates.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace lc::readers {
namespace {

std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == '\\') {
      out += '\\';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }

}  // namespace

Expected<Template> parse_template(std::string_view name, std::string_view text,
                                  const std::vector<std::string>& required) {
  Template t;
  t.name = std::string(name);
  // Directive and comment lines first, the body is the rest.
  std::string body;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    const size_t end = eol == std::string_view::npos ? text.size() : eol;
    std::string_view line = text.substr(pos, end - pos);
    const size_t next = eol == std::string_view::npos ? text.size() : eol + 1;
    if (line.substr(0, 2) == "#!") {
      std::string_view d = line.substr(2);
      if (d.substr(0, 9) == " prefix: ") {
        t.prefix = unescape(d.substr(9));
      } else if (d.substr(0, 7) == " stop: ") {
        std::string s = unescape(d.substr(7));
        if (s.empty()) return make_error(fmt::format("reader template {}: empty stop string", name));
        t.stop.push_back(std::move(s));
      }
      pos = next;
      continue;
    }
    body.append(line);
    if (eol != std::string_view::npos) body += '\n';
    pos = next;
  }
  std::string lit;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '{' && i + 1 < body.size() && body[i + 1] == '{') {
      lit += '{';
      ++i;
    } else if (c == '}' && i + 1 < body.size() && body[i + 1] == '}') {
      lit += '}';
      ++i;
    } else if (c == '{') {
      size_t j = i + 1;
      while (j < body.size() && name_char(body[j])) ++j;
      if (j >= body.size() || body[j] != '}' || j == i + 1)
        return make_error(fmt::format("reader template {}: '{{' at byte {} opens no placeholder (write '{{{{' "
                                      "for a literal brace)", name, i));
      std::string ph = body.substr(i + 1, j - i - 1);
      if (std::find(required.begin(), required.end(), ph) == required.end()) {
        std::string list;
        for (const auto& r : required) list += (list.empty() ? "{" : ", {") + r + "}";
        return make_error(fmt::format("reader template {}: unknown placeholder {{{}}} (this step fills {})", name,
                                      ph, list));
      }
      t.parts.push_back(std::move(lit));
      lit.clear();
      t.parts.push_back(ph);
      if (std::find(t.placeholders.begin(), t.placeholders.end(), ph) == t.placeholders.end())
        t.placeholders.push_back(ph);
      i = j;
    } else if (c == '}') {
      return make_error(fmt::format("reader template {}: lone '}}' at byte {} (write '}}}}' for a literal brace)",
                                    name, i));
    } else {
      lit += c;
    }
  }
  t.parts.push_back(std::move(lit));
  for (const auto& r : required)
    if (std::find(t.placeholders.begin(), t.placeholders.end(), r) == t.placeholders.end())
      return make_error(fmt::format("reader template {}: missing placeholder {{{}}}", name, r));
  return t;
}

std::string render(const Template& t, const std::map<std::string, std::string>& values) {
  std::string out;
  for (size_t i = 0; i < t.parts.size(); ++i) {
    if (i % 2 == 0) {
      out += t.parts[i];
    } else {
      auto it = values.find(t.parts[i]);
      LC_CHECK(it != values.end());
      out += it->second;
    }
  }
  return out;
}

Expected<Template> TemplateSource::load(std::string_view name, const std::vector<std::string>& required) const {
  if (dir_.empty()) {
    const auto& b = builtin_templates();
    auto it = b.find(std::string(name));
    if (it == b.end()) return make_error(fmt::format("reader template {}: not compiled in", name));
    return parse_template(name, it->second, required);
  }
  const std::string path = dir_ + "/" + std::string(name) + ".txt";
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(fmt::format("--reader-prompts: cannot open {} (the template of step {})", path, name));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(fmt::format("--reader-prompts: read error on {}", path));
  return parse_template(name, ss.str(), required);
}

}  // namespace lc::readers
