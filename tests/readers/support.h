// What the reader tests share: the shipped model (for its real tokenizer), temporary files and
// filler documents with needles.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "model/model.h"

namespace lc::readers::test {

inline const std::string kRoot = std::string(LONGCTX_TEST_DATA) + "/../../";

inline const Model& shipped() {
  static std::unique_ptr<Model> m = [] {
    auto r = Model::load(kRoot + "models/longctx-2l.gguf");
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return std::move(*r);
  }();
  return *m;
}

inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("lc_reader_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

inline std::string write_temp(const std::string& name, const std::string& text) {
  const std::string p = temp_path(name);
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// `sentences` sentences of ten filler words (a fixed pseudo-random draw from `seed`), with the
// needle sentences given placed before the sentence of their index.
inline std::string make_doc(int sentences, const std::vector<std::pair<int, std::string>>& needles,
                            uint64_t seed = 12345) {
  static const char* words[] = {"the", "grass", "is", "green", "and", "sky", "blue", "sun", "warm", "river", "runs",
                                "past", "old", "mill", "under", "hill"};
  std::string doc;
  for (int s = 0; s < sentences; ++s) {
    for (const auto& [at, text] : needles)
      if (at == s) doc += text + " ";
    for (int w = 0; w < 10; ++w) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      doc += words[(seed >> 33) % 16];
      doc += w == 9 ? ". " : " ";
    }
  }
  return doc;
}

}  // namespace lc::readers::test
