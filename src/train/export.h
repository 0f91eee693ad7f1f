// Writes a trained model as a `llama` GGUF (f32 weights, the tokenizer copied from the
// vocabulary GGUF) that lc::Model and llama.cpp load.
#pragma once

#include <string>

#include "core/status.h"
#include "gguf/gguf.h"
#include "train/transformer.h"

namespace lc::train {

Status export_gguf(const Transformer<float>& model, const gguf::File& vocab, const std::string& path,
                   const std::string& name = "longctx trained model");

}  // namespace lc::train
