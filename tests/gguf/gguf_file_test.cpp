// Writer round trips, getter semantics, and hostile files: every malformed input made by
// mutating a small valid file must give an Error naming the file and the problem.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace lc::gguf {
namespace {

constexpr const char* kName = "hostile.gguf";

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small file using every writer feature. The Q8_0 tensor comes first (34 bytes, padded to 64)
// and the last tensor is exactly 32 bytes, so the file ends without padding: every strict
// prefix of it is missing needed bytes.
Writer small_writer() {
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("general.alignment", 32);
  w.set_u32("llama.block_count", 5);
  w.set_i32("test.neg", -3);
  w.set_u64("test.big", uint64_t{1} << 40);
  w.set_f32("test.eps", 1e-5f);
  w.set_bool("test.flag", true);
  w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "a", "bc"});
  w.set_f32_array("tokenizer.ggml.scores", {0.f, -1.5f, 2.25f});
  w.set_i32_array("tokenizer.ggml.token_type", {2, 1, 1});
  w.set_string("key.aa", "x");
  w.set_string("key.bb", "y");
  std::vector<uint8_t> q(34, 0);
  q[0] = 0x00;
  q[1] = 0x3c;  // f16 scale 1.0
  for (int i = 0; i < 32; ++i) q[2 + i] = static_cast<uint8_t>(i);
  w.add_tensor("t.aa", DType::Q8_0, {32}, q);
  w.add_tensor("t.bb", DType::F32, {4, 2}, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  return w;
}

std::vector<uint8_t> small_file() { return small_writer().to_bytes(); }

Expected<std::unique_ptr<File>> parse(const std::vector<uint8_t>& b, size_t n = SIZE_MAX) {
  return File::parse(b.data(), std::min(n, b.size()), kName);
}

// Position of the first occurrence of a gguf string `s` (the bytes after its u64 length).
size_t find_str(const std::vector<uint8_t>& b, const std::string& s) {
  for (size_t i = 8; i + s.size() <= b.size(); ++i) {
    uint64_t len;
    std::memcpy(&len, b.data() + i - 8, 8);
    if (len == s.size() && std::memcmp(b.data() + i, s.data(), s.size()) == 0) return i;
  }
  ADD_FAILURE() << "string not found: " << s;
  return 0;
}

template <class T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// Expects parsing `b` to fail with a message naming the file and containing `phrase`.
void expect_error(const std::vector<uint8_t>& b, const std::string& phrase) {
  auto f = parse(b);
  ASSERT_FALSE(f) << "parsed, expected: " << phrase;
  const std::string& m = f.error().message;
  EXPECT_EQ(m.rfind(std::string(kName) + ": ", 0), 0u) << m;
  EXPECT_NE(m.find(phrase), std::string::npos) << "message: " << m << "\nexpected: " << phrase;
}

// Offsets inside a tensor info, from the tensor's name.
struct InfoAt {
  size_t n_dims, ne, type, offset;
};
InfoAt tensor_info(const std::vector<uint8_t>& b, const std::string& name) {
  const size_t p = find_str(b, name) + name.size();
  uint32_t nd;
  std::memcpy(&nd, b.data() + p, 4);
  return {p, p + 4, p + 4 + 8 * nd, p + 8 + 8 * nd};
}

TEST(GgufWriter, RoundTrip) {
  const auto b = small_file();
  EXPECT_EQ(b.size() % 32, 0u);
  auto f = parse(b);
  ASSERT_TRUE(f) << f.error().message;
  const File& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.path(), kName);
  EXPECT_EQ(file.keys().front(), "general.architecture");
  EXPECT_EQ(file.keys().size(), 12u);
  EXPECT_EQ(*file.get_string("general.architecture"), "llama");
  EXPECT_EQ(*file.get_u32("llama.block_count"), 5u);
  EXPECT_EQ(*file.get_i64("test.neg"), -3);
  EXPECT_EQ(*file.get_i64("test.big"), int64_t{1} << 40);
  EXPECT_EQ(*file.get_f32("test.eps"), 1e-5f);
  EXPECT_EQ(*file.get_bool("test.flag"), true);
  EXPECT_EQ(*file.get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string>{"<unk>", "a", "bc"}));
  EXPECT_EQ(*file.get_f32_array("tokenizer.ggml.scores"), (std::vector<float>{0.f, -1.5f, 2.25f}));
  EXPECT_EQ(*file.get_i32_array("tokenizer.ggml.token_type"), (std::vector<int32_t>{2, 1, 1}));
  EXPECT_EQ(file.find("tokenizer.ggml.token_type")->array_size(), 3u);
  EXPECT_EQ(file.find("tokenizer.ggml.token_type")->elem_type, ValueType::kI32);
  EXPECT_TRUE(file.find("tokenizer.ggml.scores")->ints.empty());

  ASSERT_EQ(file.tensors().size(), 2u);
  const auto& a = file.tensors()[0];
  EXPECT_EQ(a.name, "t.aa");
  EXPECT_EQ(a.type, DType::Q8_0);
  EXPECT_EQ(a.n_dims, 1);
  EXPECT_EQ(a.n_bytes, 34u);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.data[1], 0x3c);
  const auto* t = file.find_tensor("t.bb");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->offset, 64u);
  EXPECT_EQ(t->n_dims, 2);
  EXPECT_EQ(t->ne[0], 4);
  EXPECT_EQ(t->ne[1], 2);
  EXPECT_EQ(t->ne[2], 1);
  const TensorView v = t->view();
  EXPECT_EQ(v.n_rows(), 2);
  float x;
  std::memcpy(&x, v.row(1) + 4, 4);
  EXPECT_EQ(x, 6.f);
}

TEST(GgufWriter, LaterSetReplacesInPlace) {
  Writer w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_string("a", "now a string");
  const auto b = w.to_bytes();
  auto f = parse(b);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*(*f)->get_string("a"), "now a string");
}

TEST(GgufWriter, CustomAlignment) {
  Writer w;
  w.set_u32("general.alignment", 64);
  w.add_tensor("x", DType::F32, {3}, f32_bytes({1, 2, 3}));
  w.add_tensor("y", DType::F32, {1}, f32_bytes({4}));
  const auto b = w.to_bytes();
  auto f = parse(b);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->tensors()[1].offset, 64u);
  EXPECT_EQ(b.size() % 64, 0u);
}

TEST(GgufWriter, InvalidInputIsReported) {
  {
    Writer w;
    w.add_tensor("x", DType::F32, {3}, f32_bytes({1, 2}));
    EXPECT_FALSE(w.status());
    EXPECT_NE(w.status().message().find("'x'"), std::string::npos);
    EXPECT_FALSE(w.write("/tmp/never-written.gguf"));
  }
  {
    Writer w;
    w.add_tensor("q", DType::Q8_0, {16}, std::vector<uint8_t>(17));
    EXPECT_NE(w.status().message().find("block size"), std::string::npos);
  }
  {
    Writer w;
    w.add_tensor("x", DType::F32, {1}, f32_bytes({1}));
    w.add_tensor("x", DType::F32, {1}, f32_bytes({1}));
    EXPECT_NE(w.status().message().find("duplicate"), std::string::npos);
  }
  {
    Writer w;
    w.add_tensor("x", DType::F32, {1, 1, 1, 1, 1}, f32_bytes({1}));
    EXPECT_FALSE(w.status());
  }
  {
    Writer w;
    w.set_u32("general.alignment", 24);
    EXPECT_FALSE(w.status());
  }
}

TEST(GgufWriter, WriteAndOpen) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/gguf_write_test_" + std::to_string(::getpid()) + ".gguf";
  Writer w = small_writer();
  ASSERT_TRUE(w.write(path));
  auto f = File::open(path);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ(*(*f)->get_u32("llama.block_count"), 5u);
  std::filesystem::remove(path);

  auto bad = w.write("/nonexistent-dir/x/y.gguf");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("/nonexistent-dir/x/y.gguf"), std::string::npos) << bad.message();
  const std::string empty = dir + "/gguf_empty_test_" + std::to_string(::getpid()) + ".gguf";
  { std::FILE* fp = std::fopen(empty.c_str(), "wb"); ASSERT_NE(fp, nullptr); std::fclose(fp); }
  auto e = File::open(empty);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().message, empty + ": not a GGUF file (only 0 bytes)");
  std::filesystem::remove(empty);
  auto missing = File::open("/nonexistent-dir/none.gguf");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("/nonexistent-dir/none.gguf"), std::string::npos);
}

TEST(GgufWriter, EmptyFileAndEmptyTensor) {
  Writer w;
  const auto b = w.to_bytes();
  EXPECT_EQ(b.size(), 32u);  // header (24) padded
  auto f = parse(b);
  ASSERT_TRUE(f) << f.error().message;
  // A tokenizer-only file may end right after its metadata, without padding.
  auto g = parse(b, 24);
  ASSERT_TRUE(g) << g.error().message;

  Writer z;
  z.add_tensor("empty", DType::F32, {0, 4}, {});
  const auto zb = z.to_bytes();
  auto h = parse(zb);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ((*h)->tensors()[0].n_bytes, 0u);
}

TEST(GgufWriter, LargeTokenizerLoadsFast) {
  constexpr size_t n = 150000;
  std::vector<std::string> tokens(n);
  std::vector<float> scores(n);
  std::vector<int32_t> types(n, 1);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = "tok" + std::to_string(i);
    scores[i] = -static_cast<float>(i);
  }
  Writer w;
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  const auto b = w.to_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  auto f = parse(b);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_LT(s, 2.0);  // generous: sanitizer builds are slow; typical is a few ms
  auto got = (*f)->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, tokens);
  EXPECT_EQ((*f)->get_f32_array("tokenizer.ggml.scores")->back(), -149999.f);
}

// ---------------------------------------------------------------------------------------------
// Getter semantics

TEST(GgufGetters, TypesAndRanges) {
  Writer w;
  w.set_string("s", "str");
  w.set_i32("neg", -1);
  w.set_u64("huge", uint64_t{1} << 63);
  w.set_u64("u40", uint64_t{1} << 40);
  w.set_u32("u", 7);
  w.set_f32("f", 2.5f);
  w.set_bool("b", true);
  w.set_string_array("sa", {"x"});
  w.set_f32_array("fa", {1.5f});
  w.set_i32_array("ia", {-2, 3});
  Value u32arr;
  u32arr.type = ValueType::kArray;
  u32arr.elem_type = ValueType::kU32;
  u32arr.numbers = {1, 4294967295.0};
  u32arr.ints = {1, 4294967295};
  w.set_value("ua", u32arr);
  Value u64arr = u32arr;
  u64arr.elem_type = ValueType::kU64;
  u64arr.ints = {1, static_cast<int64_t>(UINT64_MAX)};
  u64arr.numbers = {1, 1.8446744073709552e19};
  w.set_value("u64a", u64arr);
  Value u8 ;
  u8.type = ValueType::kU8;
  u8.scalar = uint64_t{200};
  w.set_value("u8", u8);
  ASSERT_TRUE(w.status()) << w.status().message();
  const auto bytes = w.to_bytes();
  auto f = File::parse(bytes.data(), bytes.size(), "x.gguf");
  ASSERT_TRUE(f) << f.error().message;
  const File& file = **f;

  auto msg = [](const auto& e) { return e ? std::string("<ok>") : e.error().message; };
  EXPECT_EQ(msg(file.get_u32("s")), "x.gguf: metadata key 's' is a string, expected an integer");
  EXPECT_EQ(msg(file.get_u32("missing")), "x.gguf: missing metadata key 'missing'");
  EXPECT_NE(msg(file.get_u32("neg")).find("does not fit in u32"), std::string::npos);
  EXPECT_NE(msg(file.get_u32("u40")).find("does not fit in u32"), std::string::npos);
  EXPECT_NE(msg(file.get_u32("huge")).find("does not fit"), std::string::npos);
  EXPECT_NE(msg(file.get_i64("huge")).find("does not fit in i64"), std::string::npos);
  EXPECT_EQ(*file.get_u32("u8"), 200u);
  EXPECT_EQ(*file.get_i64("neg"), -1);
  EXPECT_EQ(*file.get_i64("u40"), int64_t{1} << 40);
  EXPECT_EQ(msg(file.get_u32("f")), "x.gguf: metadata key 'f' is an f32, expected an integer");
  EXPECT_EQ(msg(file.get_u32("b")), "x.gguf: metadata key 'b' is a bool, expected an integer");
  EXPECT_EQ(*file.get_f32("u"), 7.f);
  EXPECT_EQ(*file.get_f32("neg"), -1.f);
  EXPECT_EQ(*file.get_f32("f"), 2.5f);
  EXPECT_EQ(msg(file.get_f32("b")), "x.gguf: metadata key 'b' is a bool, expected a number");
  EXPECT_EQ(msg(file.get_f32("s")), "x.gguf: metadata key 's' is a string, expected a number");
  EXPECT_EQ(*file.get_bool("b"), true);
  EXPECT_EQ(msg(file.get_bool("u")), "x.gguf: metadata key 'u' is a u32, expected a bool");
  EXPECT_EQ(msg(file.get_string("u")), "x.gguf: metadata key 'u' is a u32, expected a string");
  EXPECT_EQ(msg(file.get_string("sa")),
            "x.gguf: metadata key 'sa' is an array of string, expected a string");
  EXPECT_EQ(msg(file.get_string_array("fa")),
            "x.gguf: metadata key 'fa' is an array of f32, expected an array of strings");
  EXPECT_EQ(msg(file.get_f32_array("sa")),
            "x.gguf: metadata key 'sa' is an array of string, expected a numeric array");
  EXPECT_EQ(msg(file.get_i32_array("fa")),
            "x.gguf: metadata key 'fa' is an array of f32, expected an integer array");
  EXPECT_EQ(msg(file.get_i32_array("s")),
            "x.gguf: metadata key 's' is a string, expected an integer array");
  EXPECT_EQ(*file.get_f32_array("ia"), (std::vector<float>{-2.f, 3.f}));
  EXPECT_EQ(*file.get_i32_array("ia"), (std::vector<int32_t>{-2, 3}));
  EXPECT_NE(msg(file.get_i32_array("ua")).find("4294967295 at index 1 does not fit in i32"),
            std::string::npos) << msg(file.get_i32_array("ua"));
  EXPECT_NE(msg(file.get_i32_array("u64a")).find("18446744073709551615 at index 1"),
            std::string::npos) << msg(file.get_i32_array("u64a"));
  EXPECT_EQ(file.find("ua")->array_size(), 2u);

  EXPECT_EQ(*file.get_u32_or("missing", 9), 9u);
  EXPECT_EQ(*file.get_u32_or("u", 9), 7u);
  EXPECT_FALSE(file.get_u32_or("s", 9));  // present with the wrong type: still an error
  EXPECT_EQ(*file.get_f32_or("missing", 0.5f), 0.5f);
  EXPECT_EQ(*file.get_bool_or("missing", true), true);
  EXPECT_FALSE(file.get_bool_or("u", true));
  EXPECT_EQ(*file.get_string_or("missing", "d"), "d");
  EXPECT_EQ(*file.get_string_or("s", "d"), "str");
}

// ---------------------------------------------------------------------------------------------
// Hostile files

TEST(GgufHostile, EveryPrefixIsAnError) {
  const auto b = small_file();
  for (size_t n = 0; n < b.size(); ++n) {
    auto f = parse(b, n);
    ASSERT_FALSE(f) << "prefix of " << n << " bytes parsed";
    ASSERT_EQ(f.error().message.rfind(std::string(kName) + ": ", 0), 0u) << f.error().message;
  }
  EXPECT_TRUE(parse(b));
  auto null = File::parse(nullptr, 0, kName);
  EXPECT_FALSE(null);
}

TEST(GgufHostile, TruncationMessages) {
  const auto b = small_file();
  expect_error({b.begin(), b.begin() + 2}, "not a GGUF file");
  expect_error({b.begin(), b.begin() + 6}, "truncated");
  expect_error({b.begin(), b.begin() + 30}, "truncated");
  const size_t key = find_str(b, "llama.block_count");
  expect_error({b.begin(), b.begin() + static_cast<long>(key) + 3}, "truncated or corrupt");
  expect_error({b.begin(), b.begin() + static_cast<long>(key) + 19}, "truncated");
  expect_error({b.begin(), b.end() - 1}, "extends past the end of the file");
}

TEST(GgufHostile, BadHeader) {
  const auto good = small_file();
  auto b = good;
  b[0] = 'X';
  expect_error(b, "not a GGUF file");
  b = good;
  poke<uint32_t>(b, 4, 1);
  expect_error(b, "GGUF version 1 is not supported");
  poke<uint32_t>(b, 4, 4);
  expect_error(b, "unsupported GGUF version 4");
  poke<uint32_t>(b, 4, 0x03000000);
  expect_error(b, "big-endian");
  b = good;
  poke<uint32_t>(b, 4, 2);  // v2 has the same layout
  EXPECT_TRUE(parse(b));
  b = good;
  poke<uint64_t>(b, 8, uint64_t{1} << 60);
  expect_error(b, "tensor count 1152921504606846976 is impossible");
  b = good;
  poke<uint64_t>(b, 16, uint64_t{1} << 60);
  expect_error(b, "metadata count 1152921504606846976 is impossible");
  b = good;
  poke<uint64_t>(b, 16, UINT64_MAX);
  expect_error(b, "metadata count");
  b = good;
  poke<uint64_t>(b, 8, 3);  // one more tensor than present
  expect_error(b, "");
  b = good;
  poke<uint64_t>(b, 16, 13);  // one more kv than present: reads tensor infos as kvs
  expect_error(b, "");
}

TEST(GgufHostile, BadMetadata) {
  const auto good = small_file();
  const size_t arch = find_str(good, "general.architecture") + 20;  // at value type
  auto b = good;
  poke<uint64_t>(b, arch + 4, uint64_t{1} << 62);
  expect_error(b, "string length 4611686018427387904");
  expect_error(b, "past the end of the file");
  b = good;
  poke<uint64_t>(b, find_str(good, "general.architecture") - 8, uint64_t{1} << 62);
  expect_error(b, "string length");
  b = good;
  poke<uint32_t>(b, arch, 13);
  expect_error(b, "metadata key 'general.architecture' has unknown value type 13");
  b = good;
  poke<uint32_t>(b, arch, 0xffffffffu);
  expect_error(b, "unknown value type 4294967295");

  const size_t tok = find_str(good, "tokenizer.ggml.tokens") + 21;  // at value type (array)
  b = good;
  poke<uint64_t>(b, tok + 8, uint64_t{1} << 60);
  expect_error(b, "array of 1152921504606846976 string elements extends past the end");
  b = good;
  poke<uint64_t>(b, tok + 8, 1000);
  expect_error(b, "");
  b = good;
  poke<uint32_t>(b, tok + 4, 9);
  expect_error(b, "metadata key 'tokenizer.ggml.tokens' is a nested array");
  b = good;
  poke<uint32_t>(b, tok + 4, 77);
  expect_error(b, "array of unknown value type 77");
  const size_t scores = find_str(good, "tokenizer.ggml.scores") + 21;
  b = good;
  poke<uint64_t>(b, scores + 8, uint64_t{1} << 62);
  expect_error(b, "array of 4611686018427387904 f32 elements extends past the end");
  const size_t flag = find_str(good, "test.flag") + 9;
  b = good;
  b[flag + 4] = 2;
  expect_error(b, "invalid bool byte 2");

  b = good;
  b[find_str(good, "key.bb") + 4] = 'a';
  b[find_str(good, "key.bb") + 5] = 'a';
  expect_error(b, "duplicate metadata key 'key.aa'");

  const size_t align = find_str(good, "general.alignment") + 17;
  for (uint32_t a : {0u, 3u, 48u, 1u << 31}) {
    b = good;
    poke<uint32_t>(b, align + 4, a);
    expect_error(b, "bad general.alignment " + std::to_string(a));
  }
  b = good;
  poke<uint32_t>(b, align, static_cast<uint32_t>(ValueType::kI32));
  poke<int32_t>(b, align + 4, -32);
  expect_error(b, "bad general.alignment -32");
  b = good;
  poke<uint32_t>(b, align, static_cast<uint32_t>(ValueType::kF32));
  expect_error(b, "metadata key 'general.alignment' is an f32, expected an integer");
  b = good;
  poke<uint32_t>(b, align + 4, 16);  // valid, but the tensor data no longer starts where written
  auto f = parse(b);
  if (!f) {
    EXPECT_NE(f.error().message.find(kName), std::string::npos);
  }
}

TEST(GgufHostile, BadTensorInfo) {
  const auto good = small_file();
  const InfoAt a = tensor_info(good, "t.aa");  // Q8_0 {32}
  const InfoAt bb = tensor_info(good, "t.bb");  // F32 {4, 2}
  auto b = good;
  poke<uint32_t>(b, a.n_dims, 5);
  expect_error(b, "tensor 't.aa' has 5 dimensions (must be 1 to 4)");
  poke<uint32_t>(b, a.n_dims, 0);
  expect_error(b, "tensor 't.aa' has 0 dimensions");
  b = good;
  poke<uint32_t>(b, a.type, 99);
  expect_error(b, "tensor 't.aa' has unknown or unsupported ggml type 99");
  poke<uint32_t>(b, a.type, 4);  // Q4_2: removed from ggml
  expect_error(b, "ggml type 4");
  b = good;
  poke<uint64_t>(b, a.ne, 16);
  expect_error(b, "tensor 't.aa': row length ne[0] = 16 is not a multiple of the q8_0 block size 32");
  b = good;
  poke<uint64_t>(b, bb.ne, UINT64_MAX);
  expect_error(b, "tensor 't.bb' has a negative dimension ne[0] = -1");
  b = good;
  poke<uint64_t>(b, bb.ne, uint64_t{1} << 32);
  poke<uint64_t>(b, bb.ne + 8, uint64_t{1} << 32);
  expect_error(b, "tensor 't.bb': element count overflows");
  b = good;
  poke<uint64_t>(b, bb.ne, uint64_t{1} << 62);
  poke<uint64_t>(b, bb.ne + 8, 1);
  expect_error(b, "tensor 't.bb': byte size overflows");
  b = good;
  poke<uint64_t>(b, bb.ne, uint64_t{1} << 40);
  expect_error(b, "tensor 't.bb' data [offset 64, 8796093022208 bytes] extends past the end of "
                  "the file (size " + std::to_string(good.size()));
  b = good;
  poke<uint64_t>(b, bb.ne, 0);  // empty tensor: fine
  EXPECT_TRUE(parse(b));
  b = good;
  poke<uint64_t>(b, bb.offset, 1 << 20);
  expect_error(b, "tensor 't.bb' data [offset 1048576, 32 bytes] extends past the end");
  poke<uint64_t>(b, bb.offset, uint64_t{1} << 63);
  expect_error(b, "extends past the end");
  poke<uint64_t>(b, bb.offset, UINT64_MAX - 31);
  expect_error(b, "extends past the end");
  poke<uint64_t>(b, bb.offset, 68);
  expect_error(b, "tensor 't.bb' data offset 68 is not a multiple of the alignment 32");
  poke<uint64_t>(b, bb.offset, 96);
  expect_error(b, "extends past the end");
  b = good;
  poke<uint64_t>(b, find_str(good, "t.aa") - 8, uint64_t{1} << 62);
  expect_error(b, "name of tensor 0: string length");
  b = good;
  b[find_str(good, "t.bb") + 2] = 'a';
  b[find_str(good, "t.bb") + 3] = 'a';
  expect_error(b, "duplicate tensor name 't.aa'");
}

// Every single-byte change of the small file parses or fails cleanly (sanitizers watch).
TEST(GgufHostile, ByteFlipsNeverCrash) {
  const auto good = small_file();
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t x : {0x01, 0x80, 0xff}) {
      auto b = good;
      b[i] ^= x;
      auto f = parse(b);
      if (!f) {
        ASSERT_EQ(f.error().message.rfind(std::string(kName) + ": ", 0), 0u) << f.error().message;
        continue;
      }
      for (const auto& t : (*f)->tensors()) {
        ASSERT_GE(t.data, b.data());
        ASSERT_LE(t.data + t.n_bytes, b.data() + b.size());
      }
    }
  }
}

}  // namespace
}  // namespace lc::gguf
