// Reads the real GGUF files under tests/data and checks them against MANIFEST.json, which was
// written by llama.cpp's gguf-py when the files were made.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <string>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace lc::gguf {
namespace {

namespace fs = std::filesystem;
const std::string kData = LONGCTX_TEST_DATA;

nlohmann::json load_manifest() {
  std::ifstream in(kData + "/golden/models/MANIFEST.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<uint8_t> b(static_cast<size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return b;
}

TEST(GgufGolden, EveryModelMatchesManifest) {
  const auto manifest = load_manifest();
  ASSERT_GE(manifest["models"].size(), 13u);
  for (const auto& [model, m] : manifest["models"].items()) {
    SCOPED_TRACE(model);
    const std::string path = kData + "/golden/" + m["file"].get<std::string>();
    auto f = File::open(path);
    ASSERT_TRUE(f) << f.error().message;
    const File& file = **f;
    EXPECT_EQ(file.file_size(), m["size"].get<size_t>());
    EXPECT_TRUE(file.version() == 2 || file.version() == 3);
    EXPECT_EQ(file.alignment(), 32u);

    const auto& mt = m["tensors"];
    ASSERT_EQ(file.tensors().size(), mt.size());
    for (size_t i = 0; i < mt.size(); ++i) {
      const auto& want = mt[i];
      const std::string name = want["name"];
      SCOPED_TRACE(name);
      const TensorInfo* t = file.find_tensor(name);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(file.tensors()[i].name, name);  // file order
      const auto type = dtype_from_name(want["type"].get<std::string>());
      ASSERT_TRUE(type.has_value()) << want["type"];
      EXPECT_EQ(t->type, *type);
      const auto& ne = want["ne"];
      ASSERT_EQ(static_cast<size_t>(t->n_dims), ne.size());
      int64_t n = 1;
      for (int d = 0; d < 4; ++d) {
        const int64_t expect = d < t->n_dims ? ne[d].get<int64_t>() : 1;
        EXPECT_EQ(t->ne[d], expect);
        n *= t->ne[d];
      }
      EXPECT_EQ(n, want["n_elements"].get<int64_t>());
      EXPECT_EQ(t->n_bytes, want["n_bytes"].get<size_t>());
      const TensorView v = t->view();
      EXPECT_EQ(v.n_elements(), n);
      EXPECT_EQ(v.row_size() * static_cast<size_t>(v.n_rows()), t->n_bytes);
      // Data lies inside the file and is aligned relative to the mapping start.
      ASSERT_NE(t->data, nullptr);
      EXPECT_EQ(t->offset % file.alignment(), 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % file.alignment(), 0u);
    }

    for (const auto& [key, want] : m["metadata"].items()) {
      SCOPED_TRACE(key);
      const Value* v = file.find(key);
      ASSERT_NE(v, nullptr);
      if (want.is_string()) {
        const std::string s = want;
        if (s.rfind("<array of ", 0) == 0) {
          EXPECT_EQ(v->type, ValueType::kArray);
          EXPECT_EQ(v->array_size(), std::stoul(s.substr(10)));
        } else {
          auto got = file.get_string(key);
          ASSERT_TRUE(got) << got.error().message;
          EXPECT_EQ(*got, s);
        }
      } else if (want.is_number_integer()) {
        auto got = file.get_i64(key);
        ASSERT_TRUE(got) << got.error().message;
        EXPECT_EQ(*got, want.get<int64_t>());
      } else if (want.is_number_float()) {
        ASSERT_TRUE(std::holds_alternative<double>(v->scalar));
        EXPECT_EQ(std::get<double>(v->scalar), want.get<double>());
      } else if (want.is_boolean()) {
        auto got = file.get_bool(key);
        ASSERT_TRUE(got) << got.error().message;
        EXPECT_EQ(*got, want.get<bool>());
      }
    }
  }
}

TEST(GgufGolden, Stories260KMetadata) {
  auto f = File::open(kData + "/golden/models/stories260K.gguf");
  ASSERT_TRUE(f) << f.error().message;
  const File& file = **f;
  EXPECT_EQ(*file.get_u32("llama.block_count"), 5u);
  EXPECT_EQ(*file.get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(*file.get_u32("llama.attention.head_count"), 8u);
  EXPECT_EQ(*file.get_u32("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(*file.get_u32("llama.feed_forward_length"), 172u);
  EXPECT_EQ(*file.get_u32("llama.context_length"), 128u);
  EXPECT_EQ(*file.get_u32("tokenizer.ggml.padding_token_id"), 4294967295u);
  EXPECT_FLOAT_EQ(*file.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*file.get_string("general.architecture"), "llama");
  EXPECT_EQ(*file.get_string("tokenizer.ggml.model"), "llama");
  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens) << tokens.error().message;
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[2], "</s>");
  auto scores = file.get_f32_array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores) << scores.error().message;
  EXPECT_EQ(scores->size(), 512u);
  auto types = file.get_i32_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types) << types.error().message;
  EXPECT_EQ(types->size(), 512u);
  EXPECT_EQ((*types)[0], 2);  // <unk> is UNKNOWN
  EXPECT_EQ((*types)[1], 3);  // <s> is CONTROL

  const TensorInfo* emb = file.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->ne[0], 64);
  EXPECT_EQ(emb->ne[1], 512);
  EXPECT_EQ(file.find_tensor("no.such.tensor"), nullptr);

  // Getter errors name the file, the key and the types.
  auto bad = file.get_u32("general.architecture");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("stories260K.gguf: metadata key 'general.architecture' is a "
                                     "string, expected an integer"),
            std::string::npos)
      << bad.error().message;
  auto missing = file.get_u32("llama.no_such_key");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("stories260K.gguf: missing metadata key "
                                         "'llama.no_such_key'"),
            std::string::npos);
}

TEST(GgufGolden, VocabFilesParse) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(kData + "/vocab")) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().string());
    auto f = File::open(e.path().string());
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_TRUE((*f)->tensors().empty());
    auto tokens = (*f)->get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens) << tokens.error().message;
    EXPECT_GT(tokens->size(), 0u);
    auto model = (*f)->get_string("tokenizer.ggml.model");
    EXPECT_TRUE(model) << model.error().message;
    ++n;
  }
  EXPECT_GE(n, 10);
}

// Re-writing a parsed file with the Writer (keys in file order, exact value types, tensors in
// order) reproduces gguf-py's layout byte for byte.
TEST(GgufGolden, RewriteIsByteIdentical) {
  for (const char* name : {"llama_gqa_f32.gguf", "stories260K.gguf", "llama_quant_q4_k.gguf"}) {
    SCOPED_TRACE(name);
    const std::string path = kData + "/golden/models/" + name;
    auto f = File::open(path);
    ASSERT_TRUE(f) << f.error().message;
    const File& file = **f;
    Writer w;
    for (const auto& key : file.keys()) w.set_value(key, *file.find(key));
    for (const auto& t : file.tensors())
      w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                   std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    ASSERT_TRUE(w.status()) << w.status().message();
    const auto bytes = w.to_bytes();
    const auto orig = read_all(path);
    if (file.version() == 3) {
      EXPECT_TRUE(bytes == orig) << "sizes " << bytes.size() << " vs " << orig.size();
    }

    // Whatever the version, the re-read file has the same metadata and tensors.
    auto g = File::parse(bytes.data(), bytes.size(), "rewrite.gguf");
    ASSERT_TRUE(g) << g.error().message;
    EXPECT_EQ((*g)->keys(), file.keys());
    for (const auto& [key, v] : file.metadata()) {
      const Value* u = (*g)->find(key);
      ASSERT_NE(u, nullptr) << key;
      EXPECT_EQ(u->type, v.type) << key;
      EXPECT_EQ(u->elem_type, v.elem_type) << key;
      EXPECT_EQ(u->scalar, v.scalar) << key;
      EXPECT_EQ(u->strings, v.strings) << key;
      EXPECT_EQ(u->ints, v.ints) << key;
      EXPECT_EQ(u->numbers.size(), v.numbers.size()) << key;
      if (!v.numbers.empty()) {  // bitwise: NaN payloads and -0 must survive too
        EXPECT_EQ(std::memcmp(u->numbers.data(), v.numbers.data(), v.numbers.size() * 8), 0)
            << key;
      }
    }
    ASSERT_EQ((*g)->tensors().size(), file.tensors().size());
    for (size_t i = 0; i < file.tensors().size(); ++i) {
      const auto& a = file.tensors()[i];
      const auto& b = (*g)->tensors()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.type, b.type);
      EXPECT_EQ(a.n_bytes, b.n_bytes);
      if (a.n_bytes > 0) {
        EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
      }
    }
  }
}

}  // namespace
}  // namespace lc::gguf
