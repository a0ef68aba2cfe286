// Fuzz target: the IDX reader (MNIST's format, optionally gzip'd) on arbitrary bytes.
//
// The first byte chooses images (even) or labels (odd); for labels the second gives num_classes
// (0 to 255, so the invalid 0 occurs too). The rest is the file: decompressed when it starts
// like gzip, then parsed. Properties: each step returns or throws mha::Error, nothing else
// (the decompressed size is bounded by kMaxIdxBytes before it is allocated); what parses is
// consistent: count·rows·columns pixels, each of count, rows, columns at least 1; every label
// below num_classes.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fuzz.h"
#include "mha/core/error.h"
#include "mha/data/idx.h"

using mha::fuzz::finding;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mha::fuzz::FuzzInput in(data, size);
  const bool labels = in.flag();
  const int num_classes = labels ? in.byte() : 0;
  const size_t header = labels ? 2 : 1;
  const std::span<const uint8_t> file(data + std::min(header, size), size - std::min(header, size));
  try {
    const std::vector<uint8_t> bytes = mha::data::gunzip_if_gzipped(file, "fuzz");
    if (bytes.size() > mha::data::kMaxIdxBytes) finding("gunzip returned more than kMaxIdxBytes");
    if (labels) {
      const std::vector<uint8_t> parsed = mha::data::parse_idx_labels(bytes, "fuzz", num_classes);
      if (parsed.empty()) finding("parse_idx_labels accepted a file with no labels");
      for (uint8_t label : parsed)
        if (label >= num_classes)
          finding("label " + std::to_string(label) + " >= num_classes " + std::to_string(num_classes));
    } else {
      const mha::data::IdxImages images = mha::data::parse_idx_images(bytes, "fuzz");
      if (images.count < 1 || images.rows < 1 || images.columns < 1) finding("an image dimension below 1");
      const auto pixels = static_cast<uint64_t>(images.count) * static_cast<uint64_t>(images.rows) *
                          static_cast<uint64_t>(images.columns);
      if (images.pixels.size() != pixels) finding("pixel count differs from count·rows·columns");
    }
  } catch (const mha::Error& e) {
    mha::fuzz::check_printable_message(e.what());
  }
  return 0;
}
