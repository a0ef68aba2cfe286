#pragma once
// Random numbers. Two kinds, both seeded and reproducible:
//  - philox4x32: a counter-based generator (Salmon et al., "Parallel random numbers: as easy as
//    1, 2, 3", SC'11). The value for a counter depends only on (key, counter), so dropout can
//    draw the bit for element (batch·head, row, column) in any order, on any thread and any
//    backend, and get the same mask.
//  - Generator: a sequential stream (for parameter initialisation), built on the same Philox.
#include <array>
#include <cmath>
#include <cstdint>

namespace mha {

using PhiloxCounter = std::array<uint32_t, 4>;

// Philox4x32-10: 10 rounds, the constants from the paper (and Random123 / PyTorch's CUDA RNG).
inline PhiloxCounter philox4x32(PhiloxCounter ctr, uint64_t seed) {
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * ctr[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// Uniform in [0, 1) from the top 24 bits of a 32-bit word (exactly representable in float).
inline double uniform_from_bits(uint32_t bits) { return (bits >> 8) * (1.0 / 16777216.0); }

// Dropout keep decision for one attention probability: element (row, column) of the score
// matrix of `batch_head` (= b·Hq + h). Kept when u >= p, so P(keep) = 1 − p.
inline bool dropout_keep(uint64_t seed, uint64_t batch_head, uint32_t row, uint32_t column, double p) {
  const PhiloxCounter r = philox4x32(
      {column, row, static_cast<uint32_t>(batch_head), static_cast<uint32_t>(batch_head >> 32)}, seed);
  return uniform_from_bits(r[0]) >= p;
}

// A sequential stream of uniform and normal numbers (Philox in counter mode).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }

  uint32_t next_u32() {
    if (buffered_ == 0) {
      block_ = philox4x32({static_cast<uint32_t>(counter_), static_cast<uint32_t>(counter_ >> 32), 0x6d6861u, 0},
                          seed_);
      ++counter_;
      buffered_ = 4;
    }
    return block_[static_cast<size_t>(4 - buffered_--)];
  }
  // Two draws, the first in the high half. Each draw is its own statement: the operands of
  // `a() << 32 | b()` are unsequenced, so a compiler may make the draws in either order and the
  // stream would then depend on the compiler.
  uint64_t next_u64() {
    const uint64_t high = next_u32();
    const uint64_t low = next_u32();
    return high << 32 | low;
  }
  // Uniform in [low, high), computed in double from 53 random bits.
  double uniform(double low = 0.0, double high = 1.0) {
    const uint64_t first = next_u32();  // sequenced, as in next_u64
    const uint64_t second = next_u32();
    const uint64_t bits = (first << 21) ^ (second >> 11);
    return low + (high - low) * (static_cast<double>(bits) * (1.0 / 9007199254740992.0));
  }
  // Standard normal by Box-Muller.
  double normal(double mean = 0.0, double stddev = 1.0) {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
  PhiloxCounter block_{};
  int buffered_ = 0;
};

}  // namespace mha
