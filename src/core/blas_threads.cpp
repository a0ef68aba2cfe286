#include "mha/core/blas_threads.h"

#include <cblas.h>

namespace mha {

BlasThreading blas_threading() {
  switch (openblas_get_parallel()) {
    case 1: return BlasThreading::pthreads;
    case 2: return BlasThreading::openmp;
    default: return BlasThreading::sequential;
  }
}

std::string to_string(BlasThreading threading) {
  switch (threading) {
    case BlasThreading::pthreads: return "pthreads";
    case BlasThreading::openmp: return "openmp";
    case BlasThreading::sequential: break;
  }
  return "sequential";
}

SingleThreadedBlas::SingleThreadedBlas() {
  if (blas_threading() != BlasThreading::pthreads) return;
  saved_ = openblas_get_num_threads();
  if (saved_ != 1) openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (saved_ != 1) openblas_set_num_threads(saved_);
}

void keep_blas_single_threaded() {
  if (blas_threading() == BlasThreading::pthreads) openblas_set_num_threads(1);
}

}  // namespace mha
