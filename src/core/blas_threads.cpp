#include "mha/core/blas_threads.h"

#include <cblas.h>

namespace mha {

SingleThreadedBlas::SingleThreadedBlas() : saved_(openblas_get_num_threads()) {
  if (saved_ != 1) openblas_set_num_threads(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (saved_ != 1) openblas_set_num_threads(saved_);
}

void keep_blas_single_threaded() { openblas_set_num_threads(1); }

}  // namespace mha
