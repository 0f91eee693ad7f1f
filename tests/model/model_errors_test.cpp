// A model file that is valid GGUF but not a usable model gets an error naming the problem.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "gguf/gguf.h"
#include "model/context.h"
#include "model/model.h"

namespace lc {
namespace {

const std::string kModels = std::string(LONGCTX_TEST_DATA) + "/golden/models/";

// Re-writes a golden model with one change applied to its metadata or tensors.
std::string rewrite(const std::string& src, const std::string& out_name,
                    const std::function<void(gguf::Writer&, const gguf::File&)>& edit_meta,
                    const std::function<bool(const gguf::TensorInfo&, gguf::Writer&)>& edit_tensor) {
  auto f = gguf::File::open(kModels + src);
  EXPECT_TRUE(f.has_value());
  gguf::Writer w;
  for (const auto& [k, v] : (*f)->metadata()) {
    using gguf::ValueType;
    if (v.type == ValueType::kString) w.set_string(k, std::get<std::string>(v.scalar));
    else if (v.type == ValueType::kBool) w.set_bool(k, std::get<bool>(v.scalar));
    else if (v.type == ValueType::kF32 || v.type == ValueType::kF64) w.set_f32(k, *(*f)->get_f32(k));
    else if (v.type == ValueType::kArray && v.elem_type == ValueType::kString) w.set_string_array(k, v.strings);
    else if (v.type == ValueType::kArray && v.elem_type == ValueType::kF32) w.set_f32_array(k, *(*f)->get_f32_array(k));
    else if (v.type == ValueType::kArray) w.set_i32_array(k, *(*f)->get_i32_array(k));
    else if (v.type == ValueType::kI32 || v.type == ValueType::kI64 || v.type == ValueType::kI8 || v.type == ValueType::kI16)
      w.set_i32(k, static_cast<int32_t>(*(*f)->get_i64(k)));
    else w.set_u32(k, *(*f)->get_u32(k));
  }
  edit_meta(w, **f);
  for (const auto& t : (*f)->tensors()) {
    if (edit_tensor(t, w)) continue;
    std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    w.add_tensor(t.name, t.type, ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  }
  const std::string path = testing::TempDir() + out_name;
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

std::string load_error(const std::string& path) {
  auto m = Model::load(path);
  EXPECT_FALSE(m.has_value());
  return m.has_value() ? "" : m.error().message;
}

TEST(ModelErrors, MissingTensor) {
  const std::string p = rewrite("llama_gqa_f32.gguf", "missing.gguf", [](auto&, auto&) {},
                                [](const gguf::TensorInfo& t, gguf::Writer&) { return t.name == "blk.1.ffn_up.weight"; });
  const std::string e = load_error(p);
  EXPECT_NE(e.find("missing tensor 'blk.1.ffn_up.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing.gguf"), std::string::npos) << e;
}

TEST(ModelErrors, ShapeMismatch) {
  const std::string p = rewrite("llama_gqa_f32.gguf", "shape.gguf", [](auto&, auto&) {},
                                [](const gguf::TensorInfo& t, gguf::Writer& w) {
                                  if (t.name != "blk.0.attn_q.weight") return false;
                                  // Same bytes, rows and columns swapped: a transposed export.
                                  w.add_tensor(t.name, t.type, {t.ne[1] / 2, t.ne[0] * 2},
                                               std::vector<uint8_t>(t.data, t.data + t.n_bytes));
                                  return true;
                                });
  const std::string e = load_error(p);
  EXPECT_NE(e.find("'blk.0.attn_q.weight' has shape"), std::string::npos) << e;
}

TEST(ModelErrors, UnsupportedArchitecture) {
  const std::string p = rewrite("llama_gqa_f32.gguf", "arch.gguf",
                                [](gguf::Writer& w, auto&) { w.set_string("general.architecture", "mamba"); },
                                [](auto&, auto&) { return false; });
  const std::string e = load_error(p);
  EXPECT_NE(e.find("unsupported architecture 'mamba'"), std::string::npos) << e;
}

TEST(ModelErrors, BadHeadCounts) {
  const std::string p = rewrite("llama_gqa_f32.gguf", "heads.gguf",
                                [](gguf::Writer& w, auto&) { w.set_u32("llama.attention.head_count_kv", 3); },
                                [](auto&, auto&) { return false; });
  const std::string e = load_error(p);
  EXPECT_NE(e.find("head_count"), std::string::npos) << e;
}

TEST(ModelErrors, PromptLongerThanContext) {
  auto m = Model::load(kModels + "stories260K.gguf");
  ASSERT_TRUE(m.has_value());
  auto ctx = Context::create(**m, {16, 8, 1});
  ASSERT_TRUE(ctx.has_value());
  std::vector<int32_t> ids(17, 5);
  Status s = (*ctx)->decode(ids, Logits::kLast);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("do not fit"), std::string::npos) << s.message();
  std::vector<int32_t> bad = {1, 600};
  s = (*ctx)->decode(bad, Logits::kLast);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace lc

namespace lc {
namespace {

TEST(ModelErrors, BatchSizeOutOfRange) {
  auto m = Model::load(kModels + "stories260K.gguf");
  ASSERT_TRUE(m.has_value());
  for (int64_t b : {int64_t{0}, kMaxBatch + 1}) {
    ContextParams p;
    p.n_ctx = kMaxBatch + 8;
    p.n_batch = b;
    auto ctx = Context::create(**m, p);
    ASSERT_FALSE(ctx.has_value()) << b;
    EXPECT_NE(ctx.error().message.find("batch size"), std::string::npos) << ctx.error().message;
  }
}

}  // namespace
}  // namespace lc
