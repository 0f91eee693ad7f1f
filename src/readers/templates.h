// Reader prompt templates: one text file per step (data/readers/<name>.txt), compiled into the
// binary and replaceable with --reader-prompts DIR.
//
// A template is the user message of one model call. Lines that start with "#!" are comments,
// or directives: "#! prefix: TEXT" opens the reply with TEXT (the start of the assistant's
// turn), "#! stop: TEXT" ends the reply at TEXT (several allowed); "\n" in TEXT is a newline.
// "{name}" is a placeholder, "{{" and "}}" are literal braces. A template must use every
// placeholder its step passes and no other, so a typo is an error when the template is loaded,
// not a silent hole in the prompt.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lc::readers {

struct Template {
  std::string name;                 // "memagent_update"
  std::vector<std::string> parts;   // literal text, then a placeholder name, alternately
  std::string prefix;               // opens the reply
  std::vector<std::string> stop;    // the reply ends before the first of these
  std::vector<std::string> placeholders;  // in order of first use, each once
};

// Parses a template's text. `required`: the placeholders the step fills; each must appear and
// no other may.
Expected<Template> parse_template(std::string_view name, std::string_view text,
                                  const std::vector<std::string>& required);

// The user message with every placeholder replaced by its value (values are not parsed again,
// so a document holding "{chunk}" stays as it is).
std::string render(const Template& t, const std::map<std::string, std::string>& values);

// Where templates come from: the files compiled in (dir empty) or DIR/<name>.txt.
class TemplateSource {
 public:
  explicit TemplateSource(std::string dir = {}) : dir_(std::move(dir)) {}
  Expected<Template> load(std::string_view name, const std::vector<std::string>& required) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// The compiled-in template texts, by name (generated from data/readers/*.txt at configure time).
const std::map<std::string, std::string>& builtin_templates();

}  // namespace lc::readers
