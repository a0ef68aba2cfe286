#pragma once
// Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017): 70 000 grey 28 × 28 pictures of clothes in 10
// classes, 60 000 for training and 10 000 for testing, read from the IDX files of Debian's
// `dataset-fashion-mnist` package (scripts/install_deps.sh installs it):
//   /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
// Uncompressed copies (the same names without .gz) are used when the .gz files are absent.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mha/core/tensor.h"

namespace mha::data {

inline constexpr int64_t kFashionMnistClasses = 10;
inline constexpr int64_t kFashionMnistSide = 28;

// Where Debian's package puts the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// The class names, in label order: "T-shirt/top", "Trouser", ..., "Ankle boot".
const std::array<std::string, 10>& fashion_mnist_class_names();

enum class Split { train, test };
std::string to_string(Split split);

// Images with their labels: images[i] is rows × columns bytes (0 = background, 255 = ink).
struct LabelledImages {
  int64_t count = 0, rows = 0, columns = 0;
  std::vector<uint8_t> pixels;  // (count, rows, columns) row-major
  std::vector<uint8_t> labels;  // (count), each < kFashionMnistClasses

  // The first `n` images (n <= count; a smaller data set for quick runs and tests).
  LabelledImages first(int64_t n) const;
};

// The file `dir`/<prefix>-images-idx3-ubyte[.gz] and the labels beside it, where prefix is
// "train" or "t10k". Checks every IDX rule (mha/data/idx.h), that the images are 28 × 28, that the
// labels are < 10 and that the two files hold the same number of items. A missing directory or
// file is an mha::Error that names it and says how to install the data set.
LabelledImages load_fashion_mnist(const std::string& dir, Split split);

// Both files of a split paired: the same checks, for any IDX pair (e.g. MNIST).
LabelledImages load_idx_pair(const std::string& images_path, const std::string& labels_path,
                             int num_classes);

// Images [begin, begin + count) of `data` as floats in [0, 1] (pixel / 255), shaped
// (count, rows, columns): each image is a sequence of `rows` tokens of `columns` features.
// `indices` (when non-empty) picks the images instead: image i of the batch is data[indices[begin + i]].
Tensor<float> image_batch(const LabelledImages& data, const std::vector<int64_t>& indices, int64_t begin,
                          int64_t count);
// The matching labels, as int64 class indices (count).
Tensor<int64_t> label_batch(const LabelledImages& data, const std::vector<int64_t>& indices, int64_t begin,
                            int64_t count);

}  // namespace mha::data
