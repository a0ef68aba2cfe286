#pragma once
// How many threads BLAS runs: a process-wide policy, kept here beside the BLAS kernel choice
// (src/core/blas_setup.h).
//
// Code that runs its own OpenMP threads and calls BLAS from inside them (the attention
// classifier's fused path: one single-threaded BLAS call per chunk, per thread) wants OpenBLAS
// single-threaded. Why not OpenBLAS's own threads: its workers spin for a while after each
// call, and so do OpenMP's after each parallel region; on a 2-core machine the two pools then
// take turns stealing each other's core (measured 2× slower than either alone).
namespace mha {

// OpenBLAS runs single-threaded while this lives; its previous thread count is restored after.
// Switching costs about a millisecond when OpenBLAS was multi-threaded, nothing when it was not.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

// Leaves OpenBLAS single-threaded from now on, so every SingleThreadedBlas after it is a no-op.
// A program that runs the fused classifier many times (the training loop, `mha eval`) calls
// this once.
void keep_blas_single_threaded();

}  // namespace mha
