// The IDX reader on small hand-made files (valid, gzip'd, and each kind of damage), and on the
// real Fashion-MNIST files when Debian's package is installed.
#include "mha/data/idx.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/temp_dir.h"
#include "mha/data/fashion_mnist.h"

namespace {

namespace fs = std::filesystem;
using mha::testing::throws_error;
using Bytes = std::vector<uint8_t>;

void put_u32(Bytes& b, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<uint8_t>(v >> shift));
}

// An IDX images file: magic 0x803, sizes, then count·rows·cols pixels (i + 3·k mod 256).
Bytes images_file(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes b;
  put_u32(b, 0x803);
  put_u32(b, count);
  put_u32(b, rows);
  put_u32(b, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) b.push_back(static_cast<uint8_t>(i * 3 % 256));
  return b;
}

Bytes labels_file(const std::vector<uint8_t>& labels) {
  Bytes b;
  put_u32(b, 0x801);
  put_u32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

Bytes gzip(const Bytes& raw) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&s, raw.size()) + 32);
  s.next_in = const_cast<Bytef*>(raw.data());
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

TEST(Idx, ParsesImagesAndLabels) {
  const Bytes file = images_file(3, 2, 4);
  const mha::data::IdxImages images = mha::data::parse_idx_images(file, "x");
  EXPECT_EQ(images.count, 3);
  EXPECT_EQ(images.rows, 2);
  EXPECT_EQ(images.columns, 4);
  ASSERT_EQ(images.pixels.size(), 24u);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(images.pixels[i], i * 3 % 256);
  EXPECT_EQ(mha::data::parse_idx_labels(labels_file({0, 9, 3}), "y", 10), (std::vector<uint8_t>{0, 9, 3}));
}

TEST(Idx, ReadsGzippedAndPlainFiles) {
  const mha::testing::TempDir dir("mha_idx_test");
  const Bytes raw = images_file(5, 3, 3);
  const auto plain = mha::data::read_idx_images(dir.write("plain-idx3-ubyte", raw));
  const auto zipped = mha::data::read_idx_images(dir.write("zipped-idx3-ubyte.gz", gzip(raw)));
  EXPECT_EQ(plain.pixels, zipped.pixels);
  EXPECT_EQ(zipped.count, 5);
  EXPECT_EQ(mha::data::read_idx_labels(dir.write("l.gz", gzip(labels_file({1, 2}))), 10),
            (std::vector<uint8_t>{1, 2}));
}

TEST(Idx, RefusesWrongMagicNumbers) {
  EXPECT_TRUE(throws_error([] { mha::data::parse_idx_images(labels_file({1, 2}), "f.idx"); },
                           {"f.idx", "not an IDX images file", "0x00000803", "got 0x00000801", "labels file?"}));
  EXPECT_TRUE(throws_error([] { mha::data::parse_idx_labels(images_file(1, 1, 1), "g", 10); },
                           {"g", "not an IDX labels file", "0x00000801", "got 0x00000803", "images file?"}));
  Bytes floats = images_file(1, 1, 1);
  floats[2] = 0x0D;  // element type float
  EXPECT_TRUE(throws_error([&] { mha::data::parse_idx_images(floats, "h"); },
                           {"got 0x00000D03", "element type 0x0D", "only 0x08"}));
  EXPECT_TRUE(throws_error([&] { mha::data::parse_idx_images(gzip(images_file(1, 1, 1)), "z"); },
                           {"z", "still gzip-compressed"}));
  EXPECT_TRUE(throws_error([] { mha::data::parse_idx_images(Bytes{0, 0}, "tiny"); },
                           {"tiny", "at least a 4-byte magic number", "2 bytes"}));
}

TEST(Idx, RefusesTruncatedHeadersAndData) {
  Bytes header_cut = images_file(2, 2, 2);
  header_cut.resize(10);
  EXPECT_TRUE(throws_error([&] { mha::data::parse_idx_images(header_cut, "a"); },
                           {"a", "truncated IDX header", "expected 16 bytes", "got 10"}));
  Bytes data_cut = images_file(2, 2, 2);
  data_cut.pop_back();
  EXPECT_TRUE(throws_error([&] { mha::data::parse_idx_images(data_cut, "b"); },
                           {"b", "truncated IDX images file", "header says 8 bytes", "holds 7"}));
  Bytes labels_cut = labels_file({1, 2, 3});
  labels_cut.pop_back();
  EXPECT_TRUE(throws_error([&] { mha::data::parse_idx_labels(labels_cut, "c", 10); },
                           {"truncated IDX labels file", "header says 3 bytes", "holds 2"}));
}

TEST(Idx, RefusesTrailingBytesAndZeroSizes) {
  Bytes extra = images_file(1, 2, 2);
  extra.push_back(7);
  extra.push_back(7);
  EXPECT_TRUE(throws_error([&] { mha::data::parse_idx_images(extra, "d"); },
                           {"d", "2 unexpected trailing bytes", "4 bytes of IDX data"}));
  EXPECT_TRUE(throws_error([] { mha::data::parse_idx_images(images_file(1, 0, 2), "e"); },
                           {"e", "size of dimension 1", "expected >= 1, got 0"}));
  // Sizes whose product is absurd are refused before anything is allocated.
  Bytes huge;
  put_u32(huge, 0x803);
  for (int i = 0; i < 3; ++i) put_u32(huge, 0xFFFFFFFFu);
  EXPECT_TRUE(throws_error([&] { mha::data::parse_idx_images(huge, "huge"); }, {"huge", "more than"}));
}

TEST(Idx, RefusesLabelsOutOfRange) {
  EXPECT_TRUE(throws_error([] { mha::data::parse_idx_labels(labels_file({1, 10, 2}), "l", 10); },
                           {"l", "label 1", "[0, 10)", "got 10"}));
  EXPECT_TRUE(throws_error([] { mha::data::parse_idx_labels(labels_file({1}), "l", 0); },
                           {"num_classes", "got 0"}));
}

TEST(Idx, RefusesDamagedGzip) {
  const mha::testing::TempDir dir("mha_idx_test");
  const Bytes zipped = gzip(images_file(20, 5, 5));
  Bytes cut(zipped.begin(), zipped.begin() + static_cast<long>(zipped.size() / 2));
  EXPECT_TRUE(throws_error([&] { mha::data::read_idx_images(dir.write("cut.gz", cut)); },
                           {"cut.gz", "truncated gzip data"}));
  Bytes corrupt = zipped;
  corrupt[corrupt.size() - 6] ^= 0xFF;  // inside the CRC32 / length trailer
  EXPECT_TRUE(throws_error([&] { mha::data::read_idx_images(dir.write("crc.gz", corrupt)); },
                           {"crc.gz", "corrupt gzip data"}));
  Bytes trailing = zipped;
  trailing.push_back(0);
  EXPECT_TRUE(throws_error([&] { mha::data::read_idx_images(dir.write("tail.gz", trailing)); },
                           {"tail.gz", "1 unexpected bytes after the end of the gzip stream"}));
}

TEST(Idx, RefusesMissingFiles) {
  const mha::testing::TempDir dir("mha_idx_test");
  const std::string missing = (dir.path() / "nope.gz").string();
  EXPECT_TRUE(throws_error([&] { mha::data::read_idx_images(missing); }, {missing, "no such file"}));
  EXPECT_TRUE(throws_error([&] { mha::data::read_idx_images(dir.path().string()); }, {"expected a file"}));
  // A FIFO would block the open until another process writes to it: refused instead.
  const fs::path fifo = dir.path() / "pipe.gz";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(throws_error([&] { mha::data::read_idx_labels(fifo.string(), 10); },
                           {fifo.string(), "expected a regular file, got a FIFO"}));
}

TEST(FashionMnist, PairsImagesWithLabelsAndChecksCounts) {
  const mha::testing::TempDir dir("mha_idx_test");
  const std::string images = dir.write("i", images_file(3, 2, 2)), labels = dir.write("l", labels_file({0, 1}));
  EXPECT_TRUE(throws_error([&] { mha::data::load_idx_pair(images, labels, 10); },
                           {images, "3 images", labels, "2 labels", "same count"}));
  const auto pair = mha::data::load_idx_pair(images, dir.write("l3", labels_file({0, 1, 2})), 10);
  EXPECT_EQ(pair.count, 3);
  EXPECT_EQ(pair.labels, (std::vector<uint8_t>{0, 1, 2}));
}

TEST(FashionMnist, LoaderNamesTheMissingDirectoryAndFiles) {
  EXPECT_TRUE(throws_error([] { mha::data::load_fashion_mnist("/nonexistent/fm", mha::data::Split::train); },
                           {"/nonexistent/fm", "does not exist", "dataset-fashion-mnist"}));
  const mha::testing::TempDir dir("mha_idx_test");
  EXPECT_TRUE(throws_error([&] { mha::data::load_fashion_mnist(dir.path().string(), mha::data::Split::test); },
                           {"missing", "t10k-images-idx3-ubyte.gz", "dataset-fashion-mnist"}));
  // 28 x 28 is required.
  dir.write("train-images-idx3-ubyte.gz", gzip(images_file(2, 27, 28)));
  dir.write("train-labels-idx1-ubyte", labels_file({1, 2}));  // uncompressed is accepted too
  EXPECT_TRUE(throws_error([&] { mha::data::load_fashion_mnist(dir.path().string(), mha::data::Split::train); },
                           {"expected 28 x 28", "got 27 x 28"}));
}

TEST(FashionMnist, BatchesScalePixelsAndFollowTheOrder) {
  mha::data::LabelledImages d;
  d.count = 3;
  d.rows = 1;
  d.columns = 2;
  d.pixels = {0, 255, 51, 102, 1, 2};
  d.labels = {4, 5, 6};
  const auto x = mha::data::image_batch(d, {2, 0}, 0, 2);
  ASSERT_EQ(x.shape(), (mha::Shape{2, 1, 2}));
  EXPECT_EQ(x[0], 1.0f / 255.0f);
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_EQ(x[3], 1.0f);
  const auto y = mha::data::label_batch(d, {}, 1, 2);
  EXPECT_EQ(y[0], 5);
  EXPECT_EQ(y[1], 6);
  EXPECT_TRUE(throws_error([&] { mha::data::image_batch(d, {}, 2, 2); }, {"image_batch", "[2, 4)", "[0, 3)"}));
  EXPECT_TRUE(throws_error([&] { mha::data::label_batch(d, {0, 7}, 0, 2); }, {"indices[1]", "got 7"}));
}

// The real data set, when installed (scripts/install_deps.sh installs it).
TEST(FashionMnist, ReadsTheInstalledDataSet) {
  if (!fs::exists(std::string(mha::data::kDefaultFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Debian's dataset-fashion-mnist is not installed";
  const auto train = mha::data::load_fashion_mnist(mha::data::kDefaultFashionMnistDir, mha::data::Split::train);
  const auto test = mha::data::load_fashion_mnist(mha::data::kDefaultFashionMnistDir, mha::data::Split::test);
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.columns, 28);
  // Balanced classes: 6000 and 1000 of each.
  std::vector<int> train_counts(10), test_counts(10);
  for (uint8_t l : train.labels) ++train_counts[l];
  for (uint8_t l : test.labels) ++test_counts[l];
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(train_counts[static_cast<size_t>(k)], 6000) << k;
    EXPECT_EQ(test_counts[static_cast<size_t>(k)], 1000) << k;
  }
  // The well-known first labels of the training set: Ankle boot, T-shirt/top, T-shirt/top, Dress.
  EXPECT_EQ(train.labels[0], 9);
  EXPECT_EQ(train.labels[1], 0);
  EXPECT_EQ(train.labels[3], 3);
}

}  // namespace
