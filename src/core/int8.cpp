// quantize_int8 (mha/core/int8.h).
#include "mha/core/int8.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mha {

float quantize_int8(const float* x, size_t n, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (size_t e = 0; e < n; ++e) {
    finite = finite && std::isfinite(x[e]);
    amax = std::max(amax, std::abs(x[e]));
  }
  if (!finite) {
    std::fill_n(q, n, int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float scale = amax / 127.0f;
  for (size_t e = 0; e < n; ++e) {
    const double r = scale > 0 ? std::nearbyint(static_cast<double>(x[e]) / scale) : 0.0;
    q[e] = static_cast<int8_t>(std::clamp(r, -127.0, 127.0));
  }
  return scale;
}

}  // namespace mha
