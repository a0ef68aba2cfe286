#include "mha/core/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../support/assertions.h"

namespace {

using mha::testing::error_of;

template <class T>
std::vector<T> values_of(const mha::Tensor<T>& tensor) {
  return {tensor.values().begin(), tensor.values().end()};
}


TEST(Tensor, ConstructionAndAccess) {
  const mha::FloatTensor filled({2, 3}, 1.5f);
  EXPECT_EQ(filled.shape(), (mha::Shape{2, 3}));
  EXPECT_EQ(filled.dim(), 2);
  EXPECT_EQ(filled.numel(), 6);
  EXPECT_EQ(filled.size(-1), 3);
  EXPECT_EQ(filled.size(0), 2);
  EXPECT_EQ(values_of(filled), std::vector<float>(6, 1.5f));
  EXPECT_THROW(filled.size(2), mha::Error);
  EXPECT_THROW(filled.size(-3), mha::Error);

  const mha::FloatTensor scalar(mha::Shape{}, 4.0f);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.defined());
  EXPECT_FALSE(mha::FloatTensor().defined());
  EXPECT_TRUE(mha::FloatTensor({0, 3}).defined());

  EXPECT_NE(error_of([] { mha::FloatTensor({2, 2}, {1.0f, 2.0f, 3.0f}); }).find("needs 4 values, got 3"),
            std::string::npos);
}

// Storage: 64-byte aligned; from 4 MiB on, 2 MiB aligned (huge pages, tensor.h); a tensor of no
// elements still has an address (it is defined).
TEST(Tensor, StorageAlignment) {
  const mha::Tensor<float> small({3}), large({int64_t{1} << 20}), empty({0, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % (uintptr_t{2} << 20), 0u);
  EXPECT_NE(empty.data(), nullptr);
  EXPECT_TRUE(empty.defined());
  for (float x : large.values()) ASSERT_EQ(x, 0.0f);
}

TEST(Tensor, CopyIsDeep) {
  mha::FloatTensor a({2}, {1.0f, 2.0f});
  mha::FloatTensor b = a;
  b[0] = 9.0f;
  EXPECT_EQ(a[0], 1.0f);
  a = b;
  EXPECT_EQ(a[0], 9.0f);
}

TEST(Tensor, ReshapeInfersMinusOne) {
  const mha::Tensor<int32_t> t({2, 3, 4}, 7);
  EXPECT_EQ(t.reshape({-1, 4}).shape(), (mha::Shape{6, 4}));
  EXPECT_EQ(t.reshape({2, -1}).shape(), (mha::Shape{2, 12}));
  EXPECT_EQ(t.reshape({24}).shape(), (mha::Shape{24}));
  const mha::FloatTensor values({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(values_of(values.reshape({3, 2})), values_of(values));  // same row-major data
  EXPECT_EQ(mha::FloatTensor({1}).reshape({}).shape(), mha::Shape{});
  EXPECT_EQ(mha::FloatTensor({0, 3}).reshape({3, 0}).shape(), (mha::Shape{3, 0}));
}

TEST(Tensor, ReshapeErrors) {
  const mha::FloatTensor t({2, 3});
  EXPECT_NE(error_of([&] { (void)t.reshape({4, 2}); }).find("cannot reshape [2, 3] (6 elements) to [4, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)t.reshape({-1, -1}); }).find("at most one -1"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)t.reshape({-1, 4}); }).find("cannot reshape [2, 3] to [-1, 4]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)t.reshape({-2, -3}); }).find("dimensions must be >= 0"), std::string::npos);
  EXPECT_THROW((void)mha::FloatTensor({0, 3}).reshape({-1, 0}), mha::Error);  // -1 is ambiguous
  // Requested dimensions whose product overflows int64 are refused by name; multiplying them
  // unchecked was undefined behaviour (the sanitizer build reports it).
  const mha::FloatTensor empty({0});
  EXPECT_NE(error_of([&] { (void)empty.reshape({-1, int64_t{1} << 40, int64_t{1} << 40}); })
                .find("reshape to [-1, 1099511627776, 1099511627776]: number of elements overflows 64 bits"),
            std::string::npos);
  EXPECT_NE(error_of([&] { (void)t.reshape({int64_t{1} << 62, 4, -1}); }).find("overflows 64 bits"), std::string::npos);
  EXPECT_EQ(empty.reshape({int64_t{1} << 40, int64_t{1} << 40, 0}).numel(), 0);  // a zero makes any product 0
}

TEST(Tensor, PermuteMatchesHandComputedExample) {
  // in[i][j][k] = 100 i + 10 j + k, shape [2, 3, 2]; permute(2, 0, 1) gives out[k][i][j].
  mha::Tensor<int32_t> in({2, 3, 2});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) in[(i * 3 + j) * 2 + k] = 100 * i + 10 * j + k;
  const mha::Tensor<int32_t> out = mha::permute(in, {2, 0, 1});
  EXPECT_EQ(out.shape(), (mha::Shape{2, 2, 3}));
  EXPECT_EQ(values_of(out), (std::vector<int32_t>{0, 10, 20, 100, 110, 120, 1, 11, 21, 101, 111, 121}));

  const mha::FloatTensor matrix({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(values_of(mha::permute(matrix, {1, 0})), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(values_of(mha::permute(matrix, {0, 1})), values_of(matrix));
  EXPECT_EQ(mha::permute(mha::FloatTensor({0, 2}), {1, 0}).shape(), (mha::Shape{2, 0}));
}

// Large enough to be copied in several chunks (one per thread): every permutation of a rank-4
// tensor, with in[a][b][c][d] = its flat index, against out[i] = in[index of i under the axes].
TEST(Tensor, PermuteOfLargeTensorsMatchesIndexArithmetic) {
  const mha::Shape shape{3, 70, 5, 67};  // 70 350 elements > one chunk of 65 536
  mha::Tensor<int32_t> in(shape);
  for (int64_t i = 0; i < in.numel(); ++i) in[i] = static_cast<int32_t>(i);
  std::vector<int> axes{0, 1, 2, 3};
  do {
    const mha::Tensor<int32_t> out = mha::permute(in, axes);
    mha::Shape expected_shape;
    for (int a : axes) expected_shape.push_back(shape[static_cast<size_t>(a)]);
    ASSERT_EQ(out.shape(), expected_shape);
    int64_t mismatches = 0;
    for (int64_t o = 0; o < out.numel(); ++o) {
      int64_t rest = o, in_index[4];
      for (int i = 3; i >= 0; --i) {
        in_index[axes[static_cast<size_t>(i)]] = rest % expected_shape[static_cast<size_t>(i)];
        rest /= expected_shape[static_cast<size_t>(i)];
      }
      const int64_t flat = ((in_index[0] * shape[1] + in_index[1]) * shape[2] + in_index[2]) * shape[3] + in_index[3];
      mismatches += out[o] != in[flat];
    }
    EXPECT_EQ(mismatches, 0) << "axes " << axes[0] << axes[1] << axes[2] << axes[3];
  } while (std::next_permutation(axes.begin(), axes.end()));
}

TEST(Tensor, PermuteErrors) {
  const mha::FloatTensor t({2, 3});
  EXPECT_THROW(mha::permute(t, {0}), mha::Error);
  EXPECT_THROW(mha::permute(t, {0, 0}), mha::Error);
  EXPECT_THROW(mha::permute(t, {0, 2}), mha::Error);
  EXPECT_THROW(mha::permute(t, {-1, 0}), mha::Error);
}

TEST(Tensor, UnsqueezeAndSqueeze) {
  const mha::FloatTensor t({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(mha::unsqueeze(t, 0).shape(), (mha::Shape{1, 2, 3}));
  EXPECT_EQ(mha::unsqueeze(t, 1).shape(), (mha::Shape{2, 1, 3}));
  EXPECT_EQ(mha::unsqueeze(t, 2).shape(), (mha::Shape{2, 3, 1}));
  EXPECT_EQ(mha::unsqueeze(t, -1).shape(), (mha::Shape{2, 3, 1}));
  EXPECT_EQ(values_of(mha::unsqueeze(t, 1)), values_of(t));
  EXPECT_THROW(mha::unsqueeze(t, 3), mha::Error);
  EXPECT_THROW(mha::unsqueeze(t, -4), mha::Error);

  const mha::FloatTensor u({2, 1, 3}, 0.0f);
  EXPECT_EQ(mha::squeeze(u, 1).shape(), (mha::Shape{2, 3}));
  EXPECT_EQ(mha::squeeze(u, -2).shape(), (mha::Shape{2, 3}));
  EXPECT_NE(error_of([&] { (void)mha::squeeze(u, 0); }).find("is not a size-1 dimension of shape [2, 1, 3]"),
            std::string::npos);
  EXPECT_THROW(mha::squeeze(u, 3), mha::Error);
}

TEST(Tensor, CheckedNumel) {
  EXPECT_EQ(mha::checked_numel({}), 1);
  EXPECT_EQ(mha::checked_numel({2, 3, 4}), 24);
  EXPECT_EQ(mha::checked_numel({0, 5}), 0);
  EXPECT_NE(error_of([] { mha::checked_numel({int64_t{1} << 40, int64_t{1} << 40}, "weights"); })
                .find("weights: number of elements overflows 64 bits"),
            std::string::npos);
  EXPECT_NE(error_of([] { mha::checked_numel({2, -1}, "bias"); }).find("bias: dimensions must be >= 0"),
            std::string::npos);
  EXPECT_THROW(mha::FloatTensor({std::numeric_limits<int64_t>::max(), 2}), mha::Error);
}

TEST(Tensor, ShapeHelpers) {
  EXPECT_EQ(mha::to_string(mha::Shape{2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(mha::to_string(mha::Shape{}), "[]");
  EXPECT_NO_THROW(mha::check_shape({2, 3}, {2, 3}, "x"));
  EXPECT_NE(error_of([] { mha::check_shape({2}, {2, 3}, "key"); }).find("key: expected shape [2, 3], got [2]"),
            std::string::npos);
}

TEST(Tensor, Cast) {
  const mha::BoolTensor flags({3}, {true, false, true});
  EXPECT_EQ(values_of(mha::cast<float>(flags)), (std::vector<float>{1, 0, 1}));
  const mha::DoubleTensor d({2}, {0.5, -1.25});
  EXPECT_EQ(values_of(mha::cast<float>(d)), (std::vector<float>{0.5f, -1.25f}));
}

}  // namespace

namespace {

TEST(TensorMove, MovedFromTensorIsEmpty) {
  mha::Tensor<float> a({2, 3}, 1.0f);
  mha::Tensor<float> b = std::move(a);
  EXPECT_EQ(b.numel(), 6);
  EXPECT_FALSE(a.defined());  // NOLINT(bugprone-use-after-move): the state after a move is the point
  EXPECT_EQ(a.numel(), 0);
  EXPECT_FALSE(mha::cast<double>(a).defined());
  mha::Tensor<float> c({4});
  c = std::move(b);
  EXPECT_EQ(c.shape(), (mha::Shape{2, 3}));
  EXPECT_FALSE(b.defined());  // NOLINT(bugprone-use-after-move)
}

TEST(TensorShape, ZeroDimensionMakesAnEmptyTensorWhateverTheOthers) {
  EXPECT_EQ(mha::checked_numel({int64_t{1} << 62, 4, 0, 2}), 0);
  EXPECT_NE(error_of([] { (void)mha::checked_numel({int64_t{1} << 62, 4, 2}); }).find("overflows 64 bits"),
            std::string::npos);
}

// expand is torch.expand(...).contiguous(): size-1 dimensions repeat.
TEST(TensorExpand, BroadcastsSizeOneDimensions) {
  const mha::Tensor<int32_t> column({2, 1}, {1, 2}), row({1, 3}, {10, 20, 30});
  EXPECT_EQ(values_of(mha::expand(column, {2, 3})), (std::vector<int32_t>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(values_of(mha::expand(row, {2, 3})), (std::vector<int32_t>{10, 20, 30, 10, 20, 30}));
  EXPECT_NE(error_of([&] { (void)mha::expand(row, {2, 4}); }).find("cannot broadcast shape [1, 3] to [2, 4]"),
            std::string::npos);
}

}  // namespace
