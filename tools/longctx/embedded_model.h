#pragma once

#include <span>

// The GGUF image of models/longctx-2l.gguf (the project's retrieval model), compiled in.
std::span<const unsigned char> embedded_model();
inline constexpr const char* kEmbeddedModelName = "longctx-2l.gguf (embedded)";

// The GGUF image of models/longctx-2l-reader.gguf (the project's model trained further on the
// readers' protocols), compiled in: the default model of `longctx read`.
std::span<const unsigned char> embedded_reader_model();
inline constexpr const char* kEmbeddedReaderModelName = "longctx-2l-reader.gguf (embedded)";
