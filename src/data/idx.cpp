#include "mha/data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "mha/core/error.h"

namespace mha::data {
namespace {

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string hex32(uint32_t v) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "0x%08X", v);
  return buffer;
}

// The header of an IDX file with `expected_dims` dimensions: checks the magic number and the
// length, returns the sizes.
std::vector<int64_t> parse_header(std::span<const uint8_t> bytes, const std::string& name, uint32_t magic,
                                  const char* kind) {
  const int dims = static_cast<int>(magic & 0xFF);
  check(bytes.size() >= 4, name, ": not an IDX ", kind, " file: expected at least a 4-byte magic number ",
        hex32(magic), ", got a file of ", bytes.size(), " bytes");
  const uint32_t got = big_endian_u32(bytes.data());
  if (got != magic) {
    std::string hint;
    if (bytes[0] == 0x1f && bytes[1] == 0x8b) hint = " (the data is still gzip-compressed)";
    else if (got == (magic ^ 0x2)) hint = std::string(" (an IDX ") + (dims == 3 ? "labels" : "images") + " file?)";
    else if ((got >> 16) == 0 && ((got >> 8) & 0xFF) != 0x08)
      hint = " (element type 0x" + hex32((got >> 8) & 0xFF).substr(8) + ", only 0x08 = unsigned byte is supported)";
    throw Error(name + ": not an IDX " + kind + " file: expected magic number " + hex32(magic) + " (unsigned byte, " +
                std::to_string(dims) + " dimension" + (dims == 1 ? "" : "s") + "), got " + hex32(got) + hint);
  }
  const size_t header_size = 4 + 4 * static_cast<size_t>(dims);
  check(bytes.size() >= header_size, name, ": truncated IDX header: expected ", header_size, " bytes (", dims,
        " sizes), got ", bytes.size());
  std::vector<int64_t> sizes(static_cast<size_t>(dims));
  uint64_t total = 1;
  for (int d = 0; d < dims; ++d) {
    const uint32_t size = big_endian_u32(bytes.data() + 4 + 4 * d);
    check(size >= 1, name, ": IDX size of dimension ", d, ": expected >= 1, got 0");
    sizes[static_cast<size_t>(d)] = size;
    total *= size;  // at most 3 factors below 2^32 each: checked against the limit after each step
    check(total <= kMaxIdxBytes, name, ": IDX sizes describe more than ", kMaxIdxBytes, " bytes of data");
  }
  const uint64_t data_size = bytes.size() - header_size;
  check(data_size >= total, name, ": truncated IDX ", kind, " file: the header says ", total,
        " bytes of data, the file holds ", data_size);
  check(data_size == total, name, ": ", data_size - total, " unexpected trailing bytes after the ", total,
        " bytes of IDX data the header describes");
  return sizes;
}

}  // namespace

std::vector<uint8_t> gunzip_if_gzipped(std::span<const uint8_t> bytes, const std::string& name) {
  if (bytes.size() < 2 || bytes[0] != 0x1f || bytes[1] != 0x8b) return {bytes.begin(), bytes.end()};
  z_stream stream{};
  // 15 + 16: a gzip wrapper (not zlib, not raw deflate) with the largest window.
  check(inflateInit2(&stream, 15 + 16) == Z_OK, name, ": cannot start gzip decompression");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&stream, inflateEnd);
  std::vector<uint8_t> out;
  size_t consumed = 0;
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    // zlib's counters are 32-bit: feed and drain in chunks.
    const size_t in_chunk = std::min<size_t>(bytes.size() - consumed, 1u << 30);
    stream.next_in = const_cast<Bytef*>(bytes.data() + consumed);
    stream.avail_in = static_cast<uInt>(in_chunk);
    const size_t before = out.size();
    check(before < kMaxIdxBytes, name, ": decompresses to more than ", kMaxIdxBytes, " bytes");
    out.resize(before + (1u << 20));
    stream.next_out = out.data() + before;
    stream.avail_out = 1u << 20;
    status = inflate(&stream, Z_NO_FLUSH);
    consumed += in_chunk - stream.avail_in;
    out.resize(before + ((1u << 20) - stream.avail_out));  // (what inflate wrote: GCC sees it is <= 1 MiB)
    if (status == Z_STREAM_END) break;
    // Z_BUF_ERROR: no progress was possible; with fresh output space that means the input ran out.
    if (status == Z_BUF_ERROR && consumed == bytes.size())
      throw Error(name + ": truncated gzip data: the compressed stream ends after " + std::to_string(consumed) +
                  " bytes, before its end marker");
    check(status == Z_OK, name, ": corrupt gzip data: ",
          stream.msg != nullptr ? std::string(stream.msg) : "zlib error " + std::to_string(status));
  }
  check(consumed == bytes.size(), name, ": ", bytes.size() - consumed,
        " unexpected bytes after the end of the gzip stream");
  return out;
}

std::vector<uint8_t> read_maybe_gzipped_file(const std::string& path) {
  std::error_code error;
  check(std::filesystem::exists(path, error), path, ": no such file");
  check(!std::filesystem::is_directory(path, error), path, ": expected a file, got a directory");
  // A FIFO or device would block the open, or never end.
  check(std::filesystem::is_regular_file(path, error), path, ": expected a regular file, got a FIFO, socket or device");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  check(file != nullptr, path, ": cannot open: ", std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    bytes.insert(bytes.end(), buffer, buffer + n);
    check(bytes.size() <= kMaxIdxBytes, path, ": larger than ", kMaxIdxBytes, " bytes");
  }
  check(!std::ferror(file.get()), path, ": read error: ", std::strerror(errno));
  return gunzip_if_gzipped(bytes, path);
}

IdxImages parse_idx_images(std::span<const uint8_t> bytes, const std::string& name) {
  const std::vector<int64_t> sizes = parse_header(bytes, name, kIdxImagesMagic, "images");
  IdxImages images;
  images.count = sizes[0];
  images.rows = sizes[1];
  images.columns = sizes[2];
  images.pixels.assign(bytes.begin() + 16, bytes.end());
  return images;
}

std::vector<uint8_t> parse_idx_labels(std::span<const uint8_t> bytes, const std::string& name, int num_classes) {
  check(num_classes > 0 && num_classes <= 256, name, ": num_classes: expected 1 to 256, got ", num_classes);
  parse_header(bytes, name, kIdxLabelsMagic, "labels");
  std::vector<uint8_t> labels(bytes.begin() + 8, bytes.end());
  for (size_t i = 0; i < labels.size(); ++i)
    check(labels[i] < num_classes, name, ": label ", i, ": expected a class in [0, ", num_classes, "), got ",
          int{labels[i]});
  return labels;
}

IdxImages read_idx_images(const std::string& path) { return parse_idx_images(read_maybe_gzipped_file(path), path); }

std::vector<uint8_t> read_idx_labels(const std::string& path, int num_classes) {
  return parse_idx_labels(read_maybe_gzipped_file(path), path, num_classes);
}

}  // namespace mha::data
