#include "mha/data/fashion_mnist.h"

#include <filesystem>

#include "mha/core/error.h"
#include "mha/data/idx.h"

namespace mha::data {
namespace fs = std::filesystem;

const std::array<std::string, 10>& fashion_mnist_class_names() {
  static const std::array<std::string, 10> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

std::string to_string(Split split) { return split == Split::train ? "train" : "test"; }

LabelledImages LabelledImages::first(int64_t n) const {
  check(n >= 0 && n <= count, "LabelledImages::first: n: expected 0 to ", count, ", got ", n);
  LabelledImages out;
  out.count = n;
  out.rows = rows;
  out.columns = columns;
  out.pixels.assign(pixels.begin(), pixels.begin() + n * rows * columns);
  out.labels.assign(labels.begin(), labels.begin() + n);
  return out;
}

LabelledImages load_idx_pair(const std::string& images_path, const std::string& labels_path, int num_classes) {
  IdxImages images = read_idx_images(images_path);
  std::vector<uint8_t> labels = read_idx_labels(labels_path, num_classes);
  check(static_cast<int64_t>(labels.size()) == images.count, "IDX pair: ", images_path, " holds ", images.count,
        " images but ", labels_path, " holds ", labels.size(), " labels; expected the same count");
  LabelledImages out;
  out.count = images.count;
  out.rows = images.rows;
  out.columns = images.columns;
  out.pixels = std::move(images.pixels);
  out.labels = std::move(labels);
  return out;
}

LabelledImages load_fashion_mnist(const std::string& dir, Split split) {
  const std::string install_hint =
      " (install Debian's dataset-fashion-mnist package, e.g. with scripts/install_deps.sh, or pass the "
      "directory that holds the IDX files)";
  std::error_code error;
  check(fs::is_directory(dir, error), "Fashion-MNIST: data directory '", dir, "' does not exist", install_hint);
  const std::string prefix = split == Split::train ? "train" : "t10k";
  // The package ships .gz files; uncompressed copies with the plain names work too.
  auto find = [&](const std::string& stem) {
    const fs::path gz = fs::path(dir) / (stem + ".gz"), plain = fs::path(dir) / stem;
    if (fs::exists(gz, error)) return gz.string();
    if (fs::exists(plain, error)) return plain.string();
    throw Error("Fashion-MNIST: missing " + gz.string() + " (or " + plain.string() + ")" + install_hint);
  };
  const std::string images = find(prefix + "-images-idx3-ubyte"), labels = find(prefix + "-labels-idx1-ubyte");
  LabelledImages data = load_idx_pair(images, labels, static_cast<int>(kFashionMnistClasses));
  check(data.rows == kFashionMnistSide && data.columns == kFashionMnistSide, "Fashion-MNIST: ", dir, ": ",
        to_string(split), " images: expected 28 x 28, got ", data.rows, " x ", data.columns);
  return data;
}

namespace {
void check_range(const LabelledImages& data, const std::vector<int64_t>& indices, int64_t begin, int64_t count,
                 const char* what) {
  const int64_t available = indices.empty() ? data.count : static_cast<int64_t>(indices.size());
  check(begin >= 0 && count >= 0 && begin <= available - count, what, ": expected items [", begin, ", ",
        begin + count, ") inside [0, ", available, ")");
  check(static_cast<int64_t>(data.labels.size()) == data.count &&
            static_cast<int64_t>(data.pixels.size()) == data.count * data.rows * data.columns,
        what, ": the data set's pixels and labels do not match its count ", data.count);
}
int64_t item(const std::vector<int64_t>& indices, int64_t i, int64_t count, const char* what) {
  if (indices.empty()) return i;
  const int64_t index = indices[static_cast<size_t>(i)];
  check(index >= 0 && index < count, what, ": indices[", i, "]: expected 0 to ", count - 1, ", got ", index);
  return index;
}
}  // namespace

Tensor<float> image_batch(const LabelledImages& data, const std::vector<int64_t>& indices, int64_t begin,
                          int64_t count) {
  check_range(data, indices, begin, count, "image_batch");
  const int64_t size = data.rows * data.columns;
  Tensor<float> out({count, data.rows, data.columns});
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* src = data.pixels.data() + item(indices, begin + i, data.count, "image_batch") * size;
    float* dst = out.data() + i * size;
    for (int64_t p = 0; p < size; ++p) dst[p] = static_cast<float>(src[p]) / 255.0f;
  }
  return out;
}

Tensor<int64_t> label_batch(const LabelledImages& data, const std::vector<int64_t>& indices, int64_t begin,
                            int64_t count) {
  check_range(data, indices, begin, count, "label_batch");
  Tensor<int64_t> out({count});
  for (int64_t i = 0; i < count; ++i) out[i] = data.labels[static_cast<size_t>(item(indices, begin + i, data.count, "label_batch"))];
  return out;
}

}  // namespace mha::data
