#pragma once
// The SIMD targets every Highway-dispatched kernel of mha is compiled for. Each such .cpp (and
// simd.cpp, which lists the targets for mha/core/simd.h) includes this first, before any Highway
// header: HWY_TARGETS, fixed per translation unit, is derived from HWY_DISABLED_TARGETS, so one
// definition here keeps the kernels and the list of targets the same.
//
// Scalable-vector targets (SVE, RVV) are left out: the cpu_flash micro-kernel keeps its
// accumulators in an array of vectors, which sizeless vector types do not allow. Fixed-width
// targets cover x86 (AVX-512, AVX2, SSE4, SSSE3) and Arm (NEON), with portable scalar code as the
// fallback.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
