#pragma once

#include <span>

// The GGUF image of models/longctx-2l.gguf (the project's retrieval model), compiled in.
std::span<const unsigned char> embedded_model();
inline constexpr const char* kEmbeddedModelName = "longctx-2l.gguf (embedded)";
