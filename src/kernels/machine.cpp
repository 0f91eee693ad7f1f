#include "kernels/machine.h"

#include <cpuid.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/simd.h"

namespace lc::kernels {

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t parse_cache_size(const std::string& s) {  // "32768K", "1M"
  if (s.empty()) return 0;
  int64_t v = 0;
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
  if (i < s.size() && (s[i] == 'K' || s[i] == 'k')) v <<= 10;
  else if (i < s.size() && (s[i] == 'M' || s[i] == 'm')) v <<= 20;
  return v;
}

// Times fn on every pool thread at once: the slowest thread's span is the call's time.
template <class F>
double time_parallel(ThreadPool& pool, F&& fn) {
  const double t0 = seconds_now();
  pool.run([&](int t) { fn(t); });
  return seconds_now() - t0;
}

}  // namespace

namespace {
// The largest data or unified cache the CPU's deterministic cache parameters describe (cpuid
// leaf 4 on Intel, 0x8000001D on AMD): ways x partitions x line size x sets.
int64_t cpuid_cache_bytes() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  const bool amd = b == 0x68747541;  // "Auth"enticAMD
  const unsigned leaf = amd ? 0x8000001Du : 4u;
  if (amd) {
    unsigned max_ext;
    if (!__get_cpuid(0x80000000u, &max_ext, &b, &c, &d) || max_ext < leaf) return 0;
  } else if (a < 4) {
    return 0;
  }
  int64_t best = 0;
  int best_level = 0;
  for (unsigned sub = 0; sub < 16; ++sub) {
    __cpuid_count(leaf, sub, a, b, c, d);
    const unsigned type = a & 31;
    if (type == 0) break;
    if (type == 2) continue;  // instruction cache
    const int level = static_cast<int>((a >> 5) & 7);
    const int64_t bytes = static_cast<int64_t>((b >> 22) + 1) * (((b >> 12) & 0x3ff) + 1) * ((b & 0xfff) + 1) *
                          (static_cast<int64_t>(c) + 1);
    if (level > best_level || (level == best_level && bytes > best)) best_level = level, best = bytes;
  }
  if (best == 0 && amd && __get_cpuid(0x80000006u, &a, &b, &c, &d)) {
    // Hypervisors often zero leaf 0x8000001D; the older leaf gives L3 in 512 KiB units, L2 in KiB.
    best = static_cast<int64_t>(d >> 18) * (512 << 10);
    if (best == 0) best = static_cast<int64_t>(c >> 16) << 10;
  }
  return best;
}
}  // namespace

int64_t last_level_cache_bytes() {
  int64_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lv(dir + "level"), ty(dir + "type"), sz(dir + "size");
    if (!lv || !sz) break;
    int level = 0;
    std::string type, size;
    lv >> level;
    ty >> type;
    sz >> size;
    if (type == "Instruction") continue;
    const int64_t b = parse_cache_size(size);
    if (level > best_level || (level == best_level && b > best)) best_level = level, best = b;
  }
  return best > 0 ? best : cpuid_cache_bytes();
}

std::string kernel_isa() {
#if defined(LC_AVX512)
  std::string s = "avx512";
#if defined(LC_VNNI)
  s += "+vnni";
#endif
#if defined(__AVX512BF16__)
  s += "+bf16";
#endif
  return s;
#else
  return "avx2";
#endif
}

// ---------------------------------------------------------------------------------------------
// Register-only loops. The multiplier and addend come in as arguments so that the compiler
// cannot fold them away; kPeakChains independent accumulators cover the instruction latency.

int peak_lanes_f32() {
#if defined(LC_AVX512)
  return 16;
#else
  return 8;
#endif
}
int peak_lanes_int32() { return peak_lanes_f32(); }

double peak_loop_f32(int64_t iters, float one, float half) {
#if defined(LC_AVX512)
  using V = __m512;
  const V a = _mm512_set1_ps(one), b = _mm512_set1_ps(half);
  V acc[kPeakChains];
  for (auto& v : acc) v = _mm512_setzero_ps();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm512_fmadd_ps(v, a, b);
  double s = 0;
  for (auto& v : acc) s += _mm512_reduce_add_ps(v);
  return s;
#else
  using V = __m256;
  const V a = _mm256_set1_ps(one), b = _mm256_set1_ps(half);
  V acc[kPeakChains];
  for (auto& v : acc) v = _mm256_setzero_ps();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm256_fmadd_ps(v, a, b);
  double s = 0;
  for (auto& v : acc) s += simd::hsum(v);
  return s;
#endif
}

double peak_loop_bf16(int64_t iters) {
#if defined(LC_AVX512) && defined(__AVX512BF16__)
  // 1.0 in bf16 is 0x3f80; every pair adds 1 x 1 + 1 x 1.
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));
  __m512 acc[kPeakChains];
  for (auto& v : acc) v = _mm512_setzero_ps();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm512_dpbf16_ps(v, a, a);
  double s = 0;
  for (auto& v : acc) s += _mm512_reduce_add_ps(v);
  return s;
#else
  (void)iters;
  return 0;
#endif
}

double peak_loop_int8(int64_t iters) {
#if defined(LC_AVX512) && defined(LC_VNNI)
  const __m512i a = _mm512_set1_epi8(1);
  __m512i acc[kPeakChains];
  for (auto& v : acc) v = _mm512_setzero_si512();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm512_dpbusd_epi32(v, a, a);
  double s = 0;
  for (auto& v : acc) s += static_cast<double>(_mm512_reduce_add_epi32(v));
  return s;
#else
  // The AVX2 kernels' sequence: maddubs (u8 x s8 -> pairs summed to i16), madd with ones
  // (-> i32), add.
  const __m256i a = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
  __m256i acc[kPeakChains];
  for (auto& v : acc) v = _mm256_setzero_si256();
  __m256i x = a;
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) {
      // An empty asm that "changes" x: the products are not loop-invariant to the compiler, so
      // each chain computes its own (no instruction is emitted for it).
      asm volatile("" : "+x"(x));
      v = _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(x, a), ones));
    }
  double s = 0;
  for (auto& v : acc) s += static_cast<double>(simd::hsum_i32(v));
  return s;
#endif
}

double read_sum(const float* x, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_loadu_ps(x + i + 8 * k));
  double s = simd::hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += x[i];
  return s;
}

void triad(float* a, const float* b, const float* c, float s, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_fmadd_ps(sv, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

Bandwidth measure_bandwidth(ThreadPool& pool, int64_t bytes, int reps) {
  const int nt = pool.size();
  const int64_t n = std::max<int64_t>(bytes / 4 / (64 * nt) * (64 * nt), 64 * nt);
  Buffer<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)), c(static_cast<size_t>(n));
  auto part = [&](int t, int64_t& lo, int64_t& hi) {
    lo = n * t / nt;
    hi = n * (t + 1) / nt;
  };
  // Each thread writes the part it will read, so that a NUMA machine places pages near it.
  pool.run([&](int t) {
    int64_t lo, hi;
    part(t, lo, hi);
    for (int64_t i = lo; i < hi; ++i) a[i] = 0, b[i] = 1.0f, c[i] = 2.0f;
  });
  std::vector<double> sums(static_cast<size_t>(nt));
  double best_read = 1e30, best_triad = 1e30;
  for (int r = 0; r < std::max(1, reps); ++r) {
    best_read = std::min(best_read, time_parallel(pool, [&](int t) {
      int64_t lo, hi;
      part(t, lo, hi);
      sums[static_cast<size_t>(t)] += read_sum(b.data() + lo, hi - lo);
    }));
    best_triad = std::min(best_triad, time_parallel(pool, [&](int t) {
      int64_t lo, hi;
      part(t, lo, hi);
      triad(a.data() + lo, b.data() + lo, c.data() + lo, 3.0f, hi - lo);
    }));
  }
  // The sums go somewhere, so the reads cannot be dropped.
  volatile double sink = 0;
  for (double s : sums) sink = sink + s;
  Bandwidth bw;
  bw.buffer_bytes = n * 4;
  bw.read_gbps = static_cast<double>(n) * 4 / best_read * 1e-9;
  bw.triad_gbps = static_cast<double>(n) * 12 / best_triad * 1e-9;
  return bw;
}

PeakOps measure_peak(ThreadPool& pool, int64_t iters) {
  const int nt = pool.size();
  std::vector<double> sink(static_cast<size_t>(nt));
  auto rate = [&](auto loop, double ops_per_step) {
    double best = 1e30;
    for (int r = 0; r < 3; ++r)
      best = std::min(best, time_parallel(pool, [&](int t) { sink[static_cast<size_t>(t)] += loop(); }));
    return ops_per_step * static_cast<double>(iters) * nt / best * 1e-9;
  };
  struct Sink {
    std::vector<double>& v;
    ~Sink() {
      volatile double s = 0;
      for (double x : v) s = s + x;
    }
  } keep{sink};
  const double chains = kPeakChains;
  PeakOps p;
  p.f32_gflops = rate([&] { return peak_loop_f32(iters, 1.0f, 0.5f); }, chains * peak_lanes_f32() * 2);
#if defined(LC_AVX512) && defined(__AVX512BF16__)
  p.bf16_gflops = rate([&] { return peak_loop_bf16(iters); }, chains * 32 * 2);
#endif
  p.int8_gops = rate([&] { return peak_loop_int8(iters); }, chains * peak_lanes_int32() * 4 * 2);
  return p;
}

}  // namespace lc::kernels
