// `gguf`: the model's own rope exactly as llama.cpp computes it from the GGUF metadata (base,
// linear or YaRN scaling, rope_freqs divisors). This is what an empty spec means.
#include "rope/rope_method.h"

namespace lc::rope_detail {
namespace {

Expected<std::unique_ptr<RopeScaling>> make(const RopeArgs& args, const RopeModelInfo& info) {
  return std::unique_ptr<RopeScaling>(
      new StaticRopeScaling(make_llama_cpp_rope(info.gguf), args.canonical("gguf")));
}

}  // namespace

const RopeMethodDef& method_gguf() {
  static const RopeMethodDef def{
      "gguf", "the model's own rope from its GGUF metadata, as llama.cpp computes it (default)",
      "the model's own metadata (rope.freq_base, rope.scaling.*), computed as llama.cpp's ggml_rope_ext does",
      {}, &make};
  return def;
}

}  // namespace lc::rope_detail
