#include "bench/method.h"

#include <fmt/format.h>


namespace lc::bench {

namespace {
bool default_rope(const std::string& s) { return s.empty() || s == "gguf"; }
bool default_attn(const std::string& s) { return s.empty() || s == "dense"; }
bool default_press(const std::string& s) { return s.empty() || s == "none"; }
bool default_qttt(const std::string& s) { return s.empty() || s == "none"; }
}  // namespace

bool MethodSetting::has_reader() const { return !reader.empty() && reader != "none"; }

std::string MethodSetting::label() const {
  if (!name.empty()) return name;
  std::string s;
  auto add = [&](const std::string& part) {
    if (!s.empty()) s += " + ";
    s += part;
  };
  if (!default_rope(rope)) add("rope " + rope);
  if (!default_attn(attn)) add("attn " + attn);
  if (!default_press(press)) add("press " + press);
  if (!default_qttt(qttt)) add("qttt " + qttt);
  if (has_reader()) add("reader " + reader);
  return s.empty() ? "baseline" : s;
}

Expected<MethodSetting> parse_method(std::string_view text) {
  MethodSetting m;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(';', i);
    if (j == std::string_view::npos) j = text.size();
    std::string_view part = text.substr(i, j - i);
    i = j + 1;
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos)
      return make_error(fmt::format("method '{}': expected key=value parts (rope=, attn=, press=, qttt=, reader=, model=, name=) separated by ';'",
                                    text));
    const std::string key(part.substr(0, eq));
    const std::string val(part.substr(eq + 1));
    if (key == "rope") m.rope = val;
    else if (key == "attn") m.attn = val;
    else if (key == "press" || key == "kv-press") m.press = val;
    else if (key == "qttt") m.qttt = val;
    else if (key == "reader") m.reader = val;
    else if (key == "name") m.name = val;
    else if (key == "model") m.model = val;
    else
      return make_error(fmt::format("method '{}': unknown key '{}' (rope, attn, press, qttt, reader, model, name)",
                                    text, key));
  }
  if (m.model.empty() && text.find("model=") != std::string_view::npos)
    return make_error(fmt::format("method '{}': model= needs a GGUF path", text));
  return m;
}

Expected<std::unique_ptr<Session>> make_session_for(const Model& model, const MethodSetting& m,
                                                    const ContextParams& p) {
  // The rope, attention and press registries check the specs when the context is made.
  SessionParams sp;
  sp.ctx = p;
  sp.ctx.rope = default_rope(m.rope) ? "" : m.rope;
  sp.ctx.attn = m.attn;  // empty: the model's default attention
  sp.ctx.kv_press = default_press(m.press) ? "" : m.press;
  auto qp = qttt_params(m);
  if (!qp) return make_error(qp.error().code, fmt::format("method {}: {}", m.label(), qp.error().message));
  sp.qttt = *qp;
  auto s = Session::create(model, sp);
  if (!s) return make_error(s.error().code, fmt::format("method {}: {}", m.label(), s.error().message));
  return s;
}

Expected<QtttParams> qttt_params(const MethodSetting& m) { return parse_qttt(default_qttt(m.qttt) ? "" : m.qttt); }

}  // namespace lc::bench
