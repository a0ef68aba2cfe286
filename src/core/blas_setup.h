#pragma once
// OpenBLAS picks its kernels from the CPU model at load time. A model newer than the OpenBLAS
// build knows (Debian 12 ships 0.3.21; this machine reports Intel family 6 model 207) falls back
// to the generic "Prescott" kernels: measured here, sgemm 2048³ runs at 39 GFLOP/s instead of
// 295 with the SkylakeX kernels. choose_blas_kernels() re-runs OpenBLAS's own dispatch with
// OPENBLAS_CORETYPE set from the CPU's actual features, once, before mha's first BLAS call; and
// to MHA_CPU_TARGET's instruction set where that is set (mha/core/simd.h: AVX2 gives Haswell). It
// does nothing when OpenBLAS recognised the CPU and MHA_CPU_TARGET is not set, when the user set
// OPENBLAS_CORETYPE, or when the BLAS is not OpenBLAS.
namespace mha::detail {

void choose_blas_kernels();

}  // namespace mha::detail
