// Dequantisation of llama.cpp-quantised tensors against the f32 source they were made from
// (tests/data/golden/models). A minimal, test-only GGUF reader: the real one lives in src/gguf,
// which the kernels tests may not link.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "core/fp16.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"

namespace lc::kernels {
namespace {

struct GgufTensor {
  DType type;
  int64_t ne[4] = {1, 1, 1, 1};
  const uint8_t* data;
  int64_t n() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class MiniGguf {
 public:
  explicit MiniGguf(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    bytes_.assign(std::istreambuf_iterator<char>(f), {});
    ok_ = bytes_.size() > 24 && std::memcmp(bytes_.data(), "GGUF", 4) == 0;
    if (!ok_) return;
    pos_ = 4;
    u32();  // version
    const uint64_t n_tensors = u64(), n_kv = u64();
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const uint32_t type = u32();
      if (key == "general.alignment" && type == 4) {
        alignment = u32();
        continue;
      }
      skip_value(type);
    }
    struct Info {
      std::string name;
      GgufTensor t;
      uint64_t off;
    };
    std::vector<Info> infos;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      Info in;
      in.name = str();
      const uint32_t nd = u32();
      for (uint32_t d = 0; d < nd; ++d) in.t.ne[d] = static_cast<int64_t>(u64());
      in.t.type = static_cast<DType>(u32());
      in.off = u64();
      infos.push_back(in);
    }
    const uint64_t base = (pos_ + alignment - 1) / alignment * alignment;
    for (auto& in : infos) {
      in.t.data = bytes_.data() + base + in.off;
      tensors_[in.name] = in.t;
    }
  }
  bool ok() const { return ok_; }
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }

 private:
  uint32_t u32() { uint32_t v; std::memcpy(&v, bytes_.data() + pos_, 4); pos_ += 4; return v; }
  uint64_t u64() { uint64_t v; std::memcpy(&v, bytes_.data() + pos_, 8); pos_ += 8; return v; }
  std::string str() {
    const uint64_t n = u64();
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void skip_value(uint32_t type) {
    static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // by GGUF value type
    if (type == 8) {
      str();
    } else if (type == 9) {
      const uint32_t et = u32();
      const uint64_t n = u64();
      for (uint64_t i = 0; i < n; ++i) skip_value(et);
    } else {
      pos_ += sizes[type];
    }
  }
  std::vector<uint8_t> bytes_;
  size_t pos_ = 0;
  bool ok_ = false;
  std::map<std::string, GgufTensor> tensors_;
};

const std::string kModels = std::string(LONGCTX_TEST_DATA) + "/golden/models/";

// Largest |error| of each element relative to a bound derived from its own block: the
// quantisation step (Q8_0/Q4_0: d; k-quants: the group's effective scale d*sc).
double step_of(DType t, const uint8_t* row, int64_t i) {
  const auto& tr = traits(t);
  const uint8_t* blk = row + (i / tr.block_size) * tr.block_bytes;
  uint16_t h;
  switch (t) {
    case DType::Q8_0: case DType::Q4_0:
      std::memcpy(&h, blk, 2);
      return std::fabs(fp16_to_fp32_ref(h));
    case DType::Q4_K: case DType::Q5_K: {
      std::memcpy(&h, blk, 2);
      int sc, mn;
      k4_scale_min(blk + 4, static_cast<int>(i % 256) / 32, sc, mn);
      return std::fabs(fp16_to_fp32_ref(h)) * sc;
    }
    case DType::Q6_K: {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(blk);
      return std::fabs(fp16_to_fp32_ref(b->d) * b->scales[(i % 256) / 16]);
    }
    default:
      return 0;
  }
}

TEST(GgufFiles, QuantisedTensorsMatchF32Source) {
  MiniGguf src(kModels + "llama_quant_src_f32.gguf");
  if (!src.ok()) GTEST_SKIP() << "golden models missing";
  int checked = 0;
  for (const char* file : {"llama_quant_q8_0.gguf", "llama_quant_q4_0.gguf", "llama_quant_q4_k.gguf",
                           "llama_quant_q4_k_s.gguf", "llama_quant_q6_k.gguf"}) {
    MiniGguf q(kModels + file);
    ASSERT_TRUE(q.ok()) << file;
    for (const auto& [name, t] : q.tensors()) {
      if (t.type == DType::F32) continue;
      const auto it = src.tensors().find(name);
      ASSERT_NE(it, src.tensors().end()) << name;
      const GgufTensor& s = it->second;
      ASSERT_EQ(s.n(), t.n()) << name;
      const int64_t n_in = t.ne[0], rows = t.n() / n_in;
      std::vector<float> fast(static_cast<size_t>(n_in)), slow(static_cast<size_t>(n_in));
      double worst = 0, sq = 0, ref_sq = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = t.data + static_cast<size_t>(r) * row_bytes(t.type, n_in);
        dequantize_row(t.type, row, fast.data(), n_in);
        ASSERT_TRUE(ref::dequantize_row(t.type, row, slow.data(), n_in));
        const float* orig = reinterpret_cast<const float*>(s.data) + r * n_in;
        for (int64_t i = 0; i < n_in; ++i) {
          ASSERT_EQ(fast[i], slow[i]) << file << " " << name;
          const double err = std::fabs(fast[i] - orig[i]);
          const double step = step_of(t.type, row, i);
          // Q8_0 rounds to nearest: half a step (+ the f16 rounding of d). Q4_0 clamps the
          // +amax end: one step. The k-quants' scale search and quantised mins: 1.5 steps (a
          // wrong layout is off by many steps).
          const double bound = t.type == DType::Q8_0   ? 0.5 * step * 1.13
                               : t.type == DType::Q4_0 ? 1.0 * step * 1.01
                                                       : 1.5 * step;
          worst = std::max(worst, err / std::max(bound, 1e-30));
          ASSERT_LE(err, bound + 1e-7) << file << " " << name << " [" << r << "," << i << "] "
                                       << dtype_name(t.type) << " got " << fast[i] << " want " << orig[i];
          sq += err * err;
          ref_sq += static_cast<double>(orig[i]) * orig[i];
        }
      }
      // And overall the tensor is a faithful copy (relative RMS error of a few percent at most).
      RecordProperty(std::string(file) + ":" + name + ":worst_err_over_bound", std::to_string(worst));
      EXPECT_LT(std::sqrt(sq / ref_sq), t.type == DType::Q8_0 ? 0.01 : 0.1) << file << " " << name;
      ++checked;
    }
  }
  EXPECT_GE(checked, 5 * 16);
}

// The spot check the brief names: Q8_0 attn_q within d/2 of the f32 source.
TEST(GgufFiles, Q8_0AttnQWithinHalfStep) {
  MiniGguf src(kModels + "llama_quant_src_f32.gguf"), q(kModels + "llama_quant_q8_0.gguf");
  if (!src.ok() || !q.ok()) GTEST_SKIP() << "golden models missing";
  const auto& t = q.tensors().at("blk.0.attn_q.weight");
  const auto& s = src.tensors().at("blk.0.attn_q.weight");
  ASSERT_EQ(t.type, DType::Q8_0);
  std::vector<float> y(static_cast<size_t>(t.n()));
  dequantize_row(t.type, t.data, y.data(), t.n());
  const auto* b = reinterpret_cast<const BlockQ8_0*>(t.data);
  const auto* x = reinterpret_cast<const float*>(s.data);
  for (int64_t i = 0; i < t.n(); ++i) {
    const float d = fp16_to_fp32_ref(b[i / 32].d);
    // d is the f16 of amax/127: |x - q*d| <= d/2 + |q| * |d - amax/127| <= d/2 + 127 d 2^-11
    ASSERT_LE(std::fabs(y[i] - x[i]), d * (0.5f + 127.0f / 2048.0f)) << i;
  }
}

}  // namespace
}  // namespace lc::kernels
