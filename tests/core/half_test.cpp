// bfloat16 and float16 storage: the scalar conversions against hand-derived bit patterns
// (rounding ties to even, overflow, subnormals, NaN, infinities, signed zero), and the bulk
// conversions of every SIMD target against the scalar ones, bit for bit, over every 16-bit
// pattern and a sweep of float bit patterns; the conversions from double, rounded once.
#include "mha/core/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mha/core/random.h"
#include "mha/core/simd.h"

namespace mha {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

TEST(BFloat16, HandDerivedValues) {
  EXPECT_EQ(to_bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bfloat16(-2.0f).bits, 0xc000);
  EXPECT_EQ(to_bfloat16(0.0f).bits, 0x0000);
  EXPECT_EQ(to_bfloat16(-0.0f).bits, 0x8000);
  // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties to even (1); 1 + 3·2⁻⁸ ties up to 1 + 2⁻⁶.
  EXPECT_EQ(to_bfloat16(from_bits(0x3f808000)).bits, 0x3f80);
  EXPECT_EQ(to_bfloat16(from_bits(0x3f818000)).bits, 0x3f82);
  EXPECT_EQ(to_bfloat16(from_bits(0x3f808001)).bits, 0x3f81);  // just above halfway: up
  EXPECT_EQ(to_bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds to inf
  EXPECT_EQ(to_bfloat16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(to_bfloat16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  const bfloat16 nan = to_bfloat16(from_bits(0x7f800001));  // a signalling NaN whose payload is below bit 16
  EXPECT_TRUE(std::isnan(to_float(nan)));
  EXPECT_EQ(to_float(bfloat16{0x4049}), 3.140625f);  // 0x4049: 1.5703125 · 2
}

TEST(Float16, HandDerivedValues) {
  EXPECT_EQ(to_float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_float16(-2.0f).bits, 0xc000);
  EXPECT_EQ(to_float16(65504.0f).bits, 0x7bff);  // the largest finite
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7c00);  // halfway to 65536: ties to even, which is inf
  EXPECT_EQ(to_float16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -24)).bits, 0x0001);  // the smallest subnormal
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -25)).bits, 0x0000);  // half of it: ties to even (0)
  EXPECT_EQ(to_float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);        // halfway: even
  EXPECT_EQ(to_float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);    // halfway: even (up)
  EXPECT_EQ(to_float16(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(to_float(to_float16(std::nanf("")))));
  EXPECT_EQ(to_float(float16{0x3555}), 0.333251953125f);
  EXPECT_EQ(to_float(float16{0x0001}), std::ldexp(1.0f, -24));
}

// to_float(float16) works on the bits (the compiler's conversion is a libgcc call without F16C):
// the compiler's bits for every one of the 65536 patterns, NaN payloads included.
TEST(Float16, ToFloatMatchesTheCompilersFloat16) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float16 x{static_cast<uint16_t>(bits)};
    mha::detail::CompilerFloat16 h;
    std::memcpy(&h, &x.bits, sizeof h);
    ASSERT_EQ(bits_of(to_float(x)), bits_of(static_cast<float>(h))) << std::hex << bits;
  }
}

// From double, rounded once: a double just above a tie would round to even through float.
TEST(HalfFromDouble, RoundsOnceFromTheDouble) {
  EXPECT_EQ(to_float16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)).bits, 0x3c01);
  EXPECT_EQ(to_float16(static_cast<float>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40))).bits, 0x3c00);
  EXPECT_EQ(to_bfloat16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)).bits, 0x3f81);
  EXPECT_EQ(to_bfloat16(static_cast<float>(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40))).bits, 0x3f80);
  EXPECT_EQ(to_float16(65520.0).bits, 0x7c00);  // halfway to 65536: ties to even, which is inf
  EXPECT_EQ(to_float16(1e300).bits, 0x7c00);
  EXPECT_EQ(to_bfloat16(-1e300).bits, 0xff80);
  EXPECT_EQ(to_float16(-1e-300).bits, 0x8000);  // far below the smallest subnormal: signed zero
  EXPECT_EQ(to_float16(std::ldexp(3.0, -26)).bits, 0x0001);  // 0.75 of the smallest subnormal: up
  EXPECT_EQ(to_float16(-std::numeric_limits<double>::infinity()).bits, 0xfc00);
  EXPECT_TRUE(std::isnan(to_float(to_float16(std::nan("")))));
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(std::numeric_limits<double>::signaling_NaN()))));
}

// bfloat16 from double goes through float rounded toward odd: around every kind of bfloat16 tie
// (normal, subnormal, at the top of a binade, negative), a double just above rounds up, just
// below rounds down, the tie itself to even, whatever float's own rounding would do there.
TEST(HalfFromDouble, Bfloat16IsCorrectlyRoundedAroundTies) {
  Generator gen(12);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t exponent = i < 100 ? 0u : static_cast<uint32_t>(gen.uniform() * 254);  // subnormals too
    const uint32_t mantissa = static_cast<uint32_t>(gen.uniform() * 0x7f);
    const uint16_t lo = static_cast<uint16_t>((i & 1) << 15 | exponent << 7 | mantissa);
    const uint16_t hi = static_cast<uint16_t>(lo + 1);  // the next bfloat16 away from zero
    const double a = to_float(bfloat16{lo}), b = to_float(bfloat16{hi});
    const double tie = (a + b) / 2, step = std::abs(b - a);  // exact in double
    const uint16_t even = (lo & 1) == 0 ? lo : hi;
    for (double delta : {step * 1e-9, step * 0x1p-30, step / 4})
      ASSERT_EQ(to_bfloat16(tie + (a < b ? delta : -delta)).bits, hi) << std::hex << lo << " + " << delta;
    for (double delta : {step * 1e-9, step * 0x1p-30, step / 4})
      ASSERT_EQ(to_bfloat16(tie - (a < b ? delta : -delta)).bits, lo) << std::hex << lo << " - " << delta;
    ASSERT_EQ(to_bfloat16(tie).bits, even) << std::hex << lo;
    ASSERT_EQ(to_bfloat16(a).bits, lo) << std::hex << lo;
  }
}

// to_bfloat16(double) rounds bfloat16's normal range inline from the double's bits and the rest
// through float rounded toward odd: the second method, valid everywhere, gives the first's bits on
// random doubles of every binade around bfloat16's (mantissas of all 52 bits, ties, one bit off a
// tie) and at the edges between the two (2⁻¹²⁶, the largest bfloat16, the tie to inf, 2¹²⁸).
TEST(HalfFromDouble, TheInlineRoundingMatchesTheRoundingToOdd) {
  Generator gen(13);
  std::vector<double> values = {0x1p-126, std::nextafter(0x1p-126, 0.0), 0x1.fep127, 0x1.ffp127,
                                std::nextafter(0x1.ffp127, 0.0), std::nextafter(0x1.ffp127, 1e300), 0x1p128,
                                std::nextafter(0x1p128, 0.0), 0x1.02p-126, 0x1.01p-126, 1.0, 0x1.01p0};
  for (int i = 0; i < 200000; ++i) {
    const int exponent = -140 + static_cast<int>(gen.uniform() * 272);
    auto mantissa = static_cast<uint64_t>(gen.uniform() * 0x1p24) << 28 | static_cast<uint64_t>(gen.uniform() * 0x1p24) << 4;
    if (i % 4 == 1) mantissa = (mantissa & ~((uint64_t{1} << 45) - 1)) | (uint64_t{1} << 44);  // a tie
    if (i % 4 == 2) mantissa = (mantissa & ~((uint64_t{1} << 45) - 1)) | (uint64_t{1} << 44) | 1u;  // just above
    values.push_back(std::ldexp(1.0 + static_cast<double>(mantissa) * 0x1p-52, exponent));
  }
  for (const double v : values)
    for (const double x : {v, -v}) {
      const uint16_t inline_bits = mha::to_bfloat16(x).bits;
      ASSERT_EQ(inline_bits, mha::to_bfloat16_outside_normal_range(x).bits) << std::hexfloat << x;
    }
}

// A double that holds a float rounds as the float overloads round it (float → double is exact).
TEST(HalfFromDouble, AFloatRoundsAsTheFloatOverloads) {
  Generator gen(11);
  for (uint32_t exponent = 0; exponent < 256; ++exponent) {
    for (int j = 0; j < 64; ++j) {
      const uint32_t mantissa = static_cast<uint32_t>(gen.uniform() * 0x7fffff);
      const uint32_t sign = (j & 1) << 31;
      for (const float f : {from_bits(sign | exponent << 23 | mantissa),
                            from_bits(sign | exponent << 23 | (mantissa & ~0xffffu) | 0x8000u),    // bfloat16 halfway
                            from_bits(sign | exponent << 23 | (mantissa & ~0x1fffu) | 0x1000u)}) {  // float16 halfway
        ASSERT_EQ(to_bfloat16(static_cast<double>(f)).bits, to_bfloat16(f).bits) << std::hex << bits_of(f);
        ASSERT_EQ(to_float16(static_cast<double>(f)).bits, to_float16(f).bits) << std::hex << bits_of(f);
      }
    }
  }
}

// Every target's bulk conversion gives the scalar function's bits. Odd lengths exercise the
// scalar tails; the float sweep covers every exponent with random mantissas, the halfway cases
// and specials.
TEST(HalfConversions, EveryTargetMatchesScalar) {
  std::vector<bfloat16> all_bf16(65536 + 3);
  std::vector<float16> all_f16(65536 + 3);
  for (size_t i = 0; i < all_bf16.size(); ++i) all_bf16[i].bits = all_f16[i].bits = static_cast<uint16_t>(i);
  Generator gen(5);
  std::vector<float> floats;
  for (uint32_t exponent = 0; exponent < 256; ++exponent) {
    for (int j = 0; j < 64; ++j) {
      const uint32_t mantissa = static_cast<uint32_t>(gen.uniform() * 0x7fffff);
      const uint32_t sign = (j & 1) << 31;
      floats.push_back(from_bits(sign | exponent << 23 | mantissa));
      floats.push_back(from_bits(sign | exponent << 23 | (mantissa & ~0xffffu) | 0x8000u));  // bfloat16 halfway
      floats.push_back(from_bits(sign | exponent << 23 | (mantissa & ~0x1fffu) | 0x1000u));  // float16 halfway
    }
  }
  floats.push_back(std::nanf(""));
  floats.push_back(-std::numeric_limits<float>::infinity());
  for (const std::string& target : simd_targets()) {
    SCOPED_TRACE("target " + target);
    const ScopedSimdTarget pin(target);
    std::vector<float> out(all_bf16.size());
    convert(all_bf16.data(), out.data(), out.size());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(bits_of(out[i]), bits_of(to_float(all_bf16[i]))) << i;
    convert(all_f16.data(), out.data(), out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const float want = to_float(all_f16[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[i])) << i;
      } else {
        ASSERT_EQ(bits_of(out[i]), bits_of(want)) << i;
      }
    }
    std::vector<bfloat16> bf(floats.size());
    std::vector<float16> f16(floats.size());
    convert(floats.data(), bf.data(), floats.size());
    convert(floats.data(), f16.data(), floats.size());
    for (size_t i = 0; i < floats.size(); ++i) {
      ASSERT_EQ(bf[i].bits, to_bfloat16(floats[i]).bits) << floats[i];
      if (std::isnan(floats[i])) {
        ASSERT_TRUE(std::isnan(to_float(f16[i])));
      } else {
        ASSERT_EQ(f16[i].bits, to_float16(floats[i]).bits) << floats[i];
      }
    }
  }
}

}  // namespace
}  // namespace mha
