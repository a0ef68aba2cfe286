#pragma once
// How BLAS threads: a process-wide policy, kept here beside the BLAS kernel choice
// (src/core/blas_setup.h).
//
// One pool of threads. mha links OpenBLAS's OpenMP build where there is one (Debian's
// libopenblas-openmp-dev; see CMakeLists.txt): BLAS then runs on OpenMP's threads, the same pool
// as mha's own kernels, sized by OMP_NUM_THREADS, and a BLAS call made inside an OpenMP parallel
// region runs on the calling thread alone. Nothing needs switching: the two functions below do
// nothing with that build.
//
// Why it matters: OpenBLAS's pthreads build keeps a pool of its own, whose idle workers spin
// (sched_yield) for about 0.1 s after every call. Beside OpenMP's threads on a 2-core machine the
// two pools take turns stealing each other's core (measured 2× slower than either alone; one
// `mha attention` forward on 2048 tokens made ~3 400 sched_yield calls, against 15 with the OpenMP
// build). Where only the pthreads build exists, code that runs its own OpenMP threads and calls
// BLAS inside them (the attention classifier's fused path) switches OpenBLAS to one thread with
// SingleThreadedBlas.
#include <string>

namespace mha {

// How the linked OpenBLAS runs its threads (openblas_get_parallel()).
enum class BlasThreading { sequential, pthreads, openmp };
BlasThreading blas_threading();
std::string to_string(BlasThreading threading);

// With the pthreads build: OpenBLAS runs single-threaded while this lives, and its previous
// thread count is restored after (about a millisecond when it was multi-threaded). With the
// OpenMP build: nothing (OpenBLAS's openblas_set_num_threads would also set OpenMP's own thread
// count for the whole process, which is not what is meant).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_ = 1;
};

// With the pthreads build: leaves OpenBLAS single-threaded from now on, so that every
// SingleThreadedBlas after it is a no-op (a program that runs the fused classifier many times
// calls this once). With the OpenMP build: nothing.
void keep_blas_single_threaded();

}  // namespace mha
