#include "mha/core/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace {

// Known-answer vectors for Philox4x32-10 from Random123 (kat_vectors). Our key is a 64-bit seed
// with k0 = low 32 bits, k1 = high 32 bits.
TEST(Philox, KnownAnswerZero) {
  EXPECT_EQ(mha::philox4x32({0, 0, 0, 0}, 0),
            (mha::PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
}

TEST(Philox, KnownAnswerAllOnes) {
  EXPECT_EQ(mha::philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffffffffffffull),
            (mha::PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
}

TEST(Philox, KnownAnswerPi) {
  // Key {k0 = 0xa4093822, k1 = 0x299f31d0}.
  EXPECT_EQ(mha::philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0x299f31d0a4093822ull),
            (mha::PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformFromBitsCoversHalfOpenInterval) {
  EXPECT_EQ(mha::uniform_from_bits(0), 0.0);
  EXPECT_EQ(mha::uniform_from_bits(0xffffffffu), 1.0 - 1.0 / 16777216.0);
  EXPECT_EQ(mha::uniform_from_bits(0x80000000u), 0.5);
}

TEST(Dropout, KeepFractionIsOneMinusP) {
  for (double p : {0.1, 0.5, 0.9}) {
    int64_t kept = 0;
    int64_t total = 0;
    for (uint64_t batch_head = 0; batch_head < 4; ++batch_head)
      for (uint32_t row = 0; row < 128; ++row)
        for (uint32_t column = 0; column < 256; ++column, ++total)
          kept += mha::dropout_keep(1234, batch_head, row, column, p) ? 1 : 0;
    // Binomial standard deviation of the fraction is at most 0.5 / sqrt(131072) ≈ 0.0014.
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(total), 1.0 - p, 0.01) << "p = " << p;
  }
}

TEST(Dropout, EdgeProbabilitiesAndDeterminism) {
  for (uint32_t column = 0; column < 1000; ++column) {
    EXPECT_TRUE(mha::dropout_keep(7, 3, 5, column, 0.0));
    EXPECT_FALSE(mha::dropout_keep(7, 3, 5, column, 1.0));
    EXPECT_EQ(mha::dropout_keep(7, 3, 5, column, 0.5), mha::dropout_keep(7, 3, 5, column, 0.5));
  }
  // Different seeds give different masks.
  int differences = 0;
  for (uint32_t column = 0; column < 1000; ++column)
    differences += mha::dropout_keep(1, 0, 0, column, 0.5) != mha::dropout_keep(2, 0, 0, column, 0.5);
  EXPECT_GT(differences, 400);
}

// The mean and the variance (of the population) of `count` draws of draw().
struct Moments {
  double mean, variance;
};

template <class Draw>
Moments moments(int count, Draw draw) {
  double sum = 0;
  double sum_squares = 0;
  for (int i = 0; i < count; ++i) {
    const double x = draw();
    sum += x;
    sum_squares += x * x;
  }
  const double mean = sum / count;
  return {mean, sum_squares / count - mean * mean};
}

TEST(Generator, UniformMoments) {
  mha::Generator generator(42);
  int outside = 0;  // draws outside [0, 1)
  const Moments m = moments(200000, [&] {
    const double u = generator.uniform();
    outside += u < 0.0 || u >= 1.0;
    return u;
  });
  ASSERT_EQ(outside, 0);
  EXPECT_NEAR(m.mean, 0.5, 0.005);
  EXPECT_NEAR(m.variance, 1.0 / 12.0, 0.002);

  mha::Generator ranged(3);
  for (int i = 0; i < 1000; ++i) {
    const double u = ranged.uniform(-2.0, 3.0);
    ASSERT_GE(u, -2.0);
    ASSERT_LT(u, 3.0);
  }
}

TEST(Generator, NormalMoments) {
  mha::Generator generator(7);
  const Moments m = moments(200000, [&] { return generator.normal(1.0, 2.0); });
  EXPECT_NEAR(m.mean, 1.0, 0.03);
  EXPECT_NEAR(std::sqrt(m.variance), 2.0, 0.03);
}

TEST(Generator, SameSeedSameStream) {
  mha::Generator a(99);
  mha::Generator b(99);
  mha::Generator c(100);
  int same_as_other_seed = 0;
  for (int i = 0; i < 100; ++i) {
    const uint32_t x = a.next_u32();
    EXPECT_EQ(x, b.next_u32());
    same_as_other_seed += x == c.next_u32();
  }
  EXPECT_LT(same_as_other_seed, 3);
  EXPECT_EQ(a.seed(), 99u);
}

// The draws that make a 64-bit number or a uniform come in a fixed order, the first draw in the
// high bits, whatever the compiler (they were the unsequenced operands of one expression).
TEST(Generator, MultiDrawValuesTakeTheDrawsInOrder) {
  mha::Generator draws(7), wide(7), uniform(7);
  for (int i = 0; i < 10; ++i) {
    const uint64_t first = draws.next_u32();
    const uint64_t second = draws.next_u32();
    EXPECT_EQ(wide.next_u64(), first << 32 | second);
  }
  mha::Generator draws_again(7);
  for (int i = 0; i < 10; ++i) {
    const uint64_t first = draws_again.next_u32();
    const uint64_t second = draws_again.next_u32();
    EXPECT_EQ(uniform.uniform(), static_cast<double>((first << 21) ^ (second >> 11)) / 9007199254740992.0);
  }
}

}  // namespace
