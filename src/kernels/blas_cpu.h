// OpenBLAS chooses its kernels once, when it is loaded, from the CPU's model number. On a model
// it does not know (seen on this project's 2-core virtual machines, which report "Intel(R)
// Xeon(R) Processor") it falls back to its Prescott kernels: SSE3 only, although the CPU has
// AVX2 and AVX-512. The trainer's and qTTT's GEMMs then run 2-2.4x slower (measured on
// `longctx train` at 1,024-token windows: 24.1 s Prescott, 12.5 s Haswell, 10.0 s SkylakeX
// for the same 8 steps). OPENBLAS_CORETYPE overrides the choice, but only before the library
// is loaded.
#pragma once

namespace lc::kernels {

// The kernels OpenBLAS runs in this process ("Haswell", "SkylakeX", "Prescott", ...).
const char* blas_core_name();

// An AVX-512 CPU taken for an AVX2 model loses as much: on this project's AMD Zen 4 machine
// (where Debian's OpenBLAS 0.3.21 picks Cooperlake by itself), F16 prefill through sgemm on the
// SmolLM2 shape (pp512, 2 threads) measured 653 tokens/s with OPENBLAS_CORETYPE=Haswell and
// 982 with SkylakeX, in one run.
//
// The OpenBLAS core name to ask for on this CPU: "SkylakeX" when the CPU has AVX-512 (F, BW,
// DQ, VL) and OpenBLAS chose non-AVX-512 kernels, "Haswell" when it fell back to Prescott on a
// CPU with AVX2 and FMA; null when OpenBLAS already runs AVX-512 kernels, when nothing better
// exists, or when OPENBLAS_CORETYPE is set.
const char* better_blas_core();
// The rule, for a chosen core name and the CPU's features.
const char* better_blas_core_for(const char* chosen, bool avx512, bool avx2_fma);

// If better_blas_core() names a core, sets OPENBLAS_CORETYPE to it and re-executes this
// program (/proc/self/exe) with the same arguments, so that the new process loads OpenBLAS
// with the faster kernels. Returns only if it did not re-execute (nothing better, or execv
// failed: the program goes on with the kernels it has).
void reexec_for_faster_blas(char** argv);

}  // namespace lc::kernels
