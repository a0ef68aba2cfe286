#pragma once
// The IDX file format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/, "FILE
// FORMATS"), optionally gzip'd, as the data-set packages ship it.
//
// Layout (all integers big-endian):
//   bytes 0-1  zero
//   byte  2    element type: 0x08 = unsigned byte (the only type these data sets use)
//   byte  3    number of dimensions
//   then one 32-bit size per dimension, then the elements, row-major, with nothing after them.
// Images are 3-D (count, rows, columns), magic 0x00000803; labels are 1-D (count), magic
// 0x00000801.
//
// Every reader checks the magic number, the sizes (each >= 1, product within limits), the data
// length (a truncated file and one with trailing bytes are both errors) and, for labels, the
// range; errors are mha::Error messages that name the file and say what was expected and found.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mha::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension

// The most bytes a (decompressed) IDX file may hold: far above any MNIST-style set (Fashion-MNIST's
// training images are 47 MB) and a bound on what a corrupt or hostile size field can allocate.
inline constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 32;

// count images of rows × columns pixels, row-major: pixel (i, r, c) is
// pixels[(i · rows + r) · columns + c].
struct IdxImages {
  int64_t count = 0, rows = 0, columns = 0;
  std::vector<uint8_t> pixels;
};

// The bytes of a file; gzip'd files (first bytes 1f 8b) are decompressed, and a damaged or
// truncated gzip stream, or bytes after it, is an error. `path` names the file in errors.
std::vector<uint8_t> read_maybe_gzipped_file(const std::string& path);
// The same for bytes already in memory; `name` is used in error messages.
std::vector<uint8_t> gunzip_if_gzipped(std::span<const uint8_t> bytes, const std::string& name);

// Parse a whole (decompressed) IDX file image. `name` is used in error messages.
IdxImages parse_idx_images(std::span<const uint8_t> bytes, const std::string& name);
// num_classes > 0: every label must be < num_classes.
std::vector<uint8_t> parse_idx_labels(std::span<const uint8_t> bytes, const std::string& name,
                                      int num_classes);

// Read (and decompress when gzip'd) then parse.
IdxImages read_idx_images(const std::string& path);
std::vector<uint8_t> read_idx_labels(const std::string& path, int num_classes);

}  // namespace mha::data
