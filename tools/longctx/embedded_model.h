#pragma once

#include <span>

// The GGUF image of models/stories260K.gguf, compiled in.
std::span<const unsigned char> embedded_model();
inline constexpr const char* kEmbeddedModelName = "stories260K.gguf (embedded)";
