// Links against mha::mha (installed, or built as a subproject): a Tensor (code in libmha) and one
// gemm (which needs the BLAS that mha::mha's link interface brings along).
#include <cstdio>

#include "mha/core/gemm.h"
#include "mha/core/tensor.h"

int main() {
  mha::Tensor<float> a({2, 3}, 1.0f);
  mha::Tensor<float> b({3, 2}, 2.0f);
  mha::Tensor<float> c({2, 2}, 0.0f);
  if (a.numel() != 6) {
    std::fprintf(stderr, "numel: expected 6, got %lld\n", static_cast<long long>(a.numel()));
    return 1;
  }
  mha::gemm(mha::Transpose::no, mha::Transpose::no, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2,
            0.0f, c.data(), 2);
  for (int64_t i = 0; i < c.numel(); ++i) {
    if (c[i] != 6.0f) {
      std::fprintf(stderr, "gemm: c[%lld] = %g, expected 6\n", static_cast<long long>(i), c[i]);
      return 1;
    }
  }
  std::puts("mha consumer: ok");
  return 0;
}
