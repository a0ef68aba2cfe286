#include "mha/core/safetensors.h"

#include "mha/core/atomic_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

namespace mha::safetensors {

// Tensor bytes are copied between the file and memory as they are, which is only right when the
// host byte order matches the format's.
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; mha copies it unconverted");

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
// Insertion-ordered, so the header lists __metadata__ first and then tensors in data order,
// exactly as the reference writer does.
using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr size_t kHeaderSizeBytes = 8;

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr std::array<DTypeInfo, 10> kDTypes{{{DType::BOOL, "BOOL", 1},
                                             {DType::U8, "U8", 1},
                                             {DType::I8, "I8", 1},
                                             {DType::I16, "I16", 2},
                                             {DType::I32, "I32", 4},
                                             {DType::I64, "I64", 8},
                                             {DType::F16, "F16", 2},
                                             {DType::BF16, "BF16", 2},
                                             {DType::F32, "F32", 4},
                                             {DType::F64, "F64", 8}}};

const DTypeInfo& info(DType dtype) {
  for (const DTypeInfo& entry : kDTypes)
    if (entry.dtype == dtype) return entry;
  throw Error(detail::concat("safetensors: invalid DType value ", static_cast<int>(dtype)));
}

std::optional<DType> find_dtype(const std::string& name) {
  for (const DTypeInfo& entry : kDTypes)
    if (name == entry.name) return entry.dtype;
  return std::nullopt;
}

std::string known_dtype_names() {
  std::string names;
  for (const DTypeInfo& entry : kDTypes) names += (names.empty() ? "" : ", ") + std::string(entry.name);
  return names;
}

std::string describe_offsets(uint64_t begin, uint64_t end) {
  return detail::concat("[", begin, ", ", end, "]");
}

// Bytes that `shape` of `dtype` occupies. Throws when a dimension is negative, or when the element
// count overflows int64 (Tensor's count type) or the byte count overflows 64 bits, so no size
// computed here can wrap.
uint64_t byte_size(const Shape& shape, DType dtype, const std::string& where) {
  constexpr auto kMaxElements = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t elements = 1;
  for (int64_t d : shape) {
    check(d >= 0, where, ": shape ", mha::to_string(shape), " has a negative dimension");
    const auto dim = static_cast<uint64_t>(d);
    check(dim == 0 || elements <= kMaxElements / dim, where, ": shape ", mha::to_string(shape),
          " has more elements than fit in 64 bits");
    elements *= dim;
  }
  const uint64_t element_size = info(dtype).size;
  check(elements <= std::numeric_limits<uint64_t>::max() / element_size, where, ": shape ",
        mha::to_string(shape), " of ", to_string(dtype), " needs more bytes than fit in 64 bits");
  return elements * element_size;
}

// ---------------------------------------------------------------------------------------------
// F16 / BF16 <-> float, by bit manipulation.

// IEEE binary16 -> float. Every half value is exactly representable as a float.
float f16_to_float(uint16_t half) {
  const uint32_t sign = uint32_t{half & 0x8000u} << 16;
  const int exponent = (half >> 10) & 0x1F;
  uint32_t mantissa = half & 0x3FFu;
  constexpr int kRebias = 127 - 15;
  uint32_t bits = 0;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, or NaN with its payload kept
  } else if (exponent != 0) {
    bits = sign | (static_cast<uint32_t>(exponent + kRebias) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // ±0
  } else {
    // Subnormal m·2^-24 is a normal float: shift the leading one up to the implicit-bit position
    // (bit 10) and lower the exponent by the same amount.
    const int shift = std::countl_zero(mantissa) - 21;
    mantissa = (mantissa << shift) & 0x3FFu;
    bits = sign | (static_cast<uint32_t>(1 - shift + kRebias) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

// bfloat16 is the upper half of a float.
float bf16_to_float(uint16_t bf16) { return std::bit_cast<float>(uint32_t{bf16} << 16); }

// Rounds a double to a 16-bit IEEE-style format with the given field widths: round to nearest,
// ties to even, overflow to ±inf, gradual underflow to subnormals, NaN stays NaN. Rounding once
// from double is correct for float inputs too, since float -> double is exact.
uint16_t round_to_16_bit_float(double value, int exponent_bits, int mantissa_bits) {
  const auto bits = std::bit_cast<uint64_t>(value);
  const auto sign = static_cast<uint32_t>(bits >> 63) << (exponent_bits + mantissa_bits);
  const uint32_t infinity = ((1u << exponent_bits) - 1) << mantissa_bits;
  constexpr uint64_t kDoubleMantissaMask = (uint64_t{1} << 52) - 1;
  if (std::isnan(value)) {
    // Keep the top of the payload and set the quiet bit, so the result cannot become inf.
    const auto payload = static_cast<uint32_t>((bits & kDoubleMantissaMask) >> (52 - mantissa_bits));
    return static_cast<uint16_t>(sign | infinity | (1u << (mantissa_bits - 1)) | payload);
  }
  if (std::isinf(value)) return static_cast<uint16_t>(sign | infinity);
  const int biased_exponent = static_cast<int>((bits >> 52) & 0x7FF);
  // Double subnormals (and zeros) lie far below half the smallest subnormal of either target.
  if (biased_exponent == 0) return static_cast<uint16_t>(sign);

  // |value| = significand · 2^(biased_exponent − 1075).
  const uint64_t significand = (bits & kDoubleMantissaMask) | (uint64_t{1} << 52);
  const int bias = (1 << (exponent_bits - 1)) - 1;
  // Exponent of the target binade; values below the smallest normal share the subnormal spacing.
  const int binade = std::max(biased_exponent - 1023, 1 - bias);
  // Count |value| in units of the target spacing 2^(binade − mantissa_bits).
  const int shift = binade - mantissa_bits - (biased_exponent - 1075);
  if (shift >= 64) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
  uint64_t units = significand >> shift;
  const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (remainder > half || (remainder == half && (units & 1) != 0)) ++units;
  // Encodings grow monotonically with magnitude, so a carry out of the mantissa lands on the
  // next binade (or on inf) by itself; anything past inf is clamped to inf.
  const uint64_t magnitude = (static_cast<uint64_t>(binade + bias - 1) << mantissa_bits) + units;
  return static_cast<uint16_t>(sign | std::min<uint64_t>(magnitude, infinity));
}

uint16_t double_to_f16(double value) { return round_to_16_bit_float(value, 5, 10); }
uint16_t double_to_bf16(double value) { return round_to_16_bit_float(value, 8, 7); }

// ---------------------------------------------------------------------------------------------
// Element conversions shared by to_tensor and from_tensor.

template <class T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32";
  else static_assert(!sizeof(T), "unsupported element type");
}

// Streams int8/uint8 as numbers rather than characters.
template <class V>
auto printable(V value) {
  if constexpr (std::is_integral_v<V>) return static_cast<long long>(value);
  else return value;
}

// `value` as To, or nullopt when it does not fit: to bool only 0 and 1 convert; to an integer only
// finite whole numbers in range do. Conversions to floating point always succeed (rounding to
// nearest, overflowing to inf, as static_cast does on IEEE hosts).
template <class To, class From>
std::optional<To> convert_element(From value) {
  if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(value);
  } else if constexpr (std::is_same_v<To, bool>) {
    if (value == From{0}) return false;
    if (value == From{1}) return true;
    return std::nullopt;
  } else if constexpr (std::is_floating_point_v<From>) {
    const double whole = value;
    const double limit = std::ldexp(1.0, std::numeric_limits<To>::digits);  // exact power of two
    const double lowest = std::is_signed_v<To> ? -limit : 0.0;
    if (!(whole >= lowest && whole < limit) || std::trunc(whole) != whole) return std::nullopt;
    return static_cast<To>(whole);
  } else if constexpr (std::is_same_v<From, bool>) {
    return static_cast<To>(value);
  } else {
    if (!std::in_range<To>(value)) return std::nullopt;
    return static_cast<To>(value);
  }
}

// Decodes every element of `data`, stored as `Stored` and turned into a number by `decode`, into
// `out`.
template <class Stored, class T, class Decode>
void decode_elements(Tensor<T>& out, const TensorRef& data, const std::string& name, Decode decode) {
  for (int64_t i = 0; i < out.numel(); ++i) {
    Stored stored;
    std::memcpy(&stored, data.bytes.data() + static_cast<size_t>(i) * sizeof(Stored), sizeof(Stored));
    const auto value = decode(stored, i);
    const std::optional<T> converted = convert_element<T>(value);
    // Not check(): its arguments, to_string's std::string among them, would be built for every
    // element (a profile of `mha attention` found them at 5% of the run).
    if (!converted)
      throw Error(detail::concat("safetensors: tensor '", name, "': element ", i, " (", printable(value), ") of ",
                                 to_string(data.dtype), " does not fit ", type_name<T>()));
    out[i] = *converted;
  }
}

template <class Stored, class T, class Encode>
std::vector<std::byte> encode_elements(const Tensor<T>& tensor, Encode encode) {
  std::vector<std::byte> bytes(static_cast<size_t>(tensor.numel()) * sizeof(Stored));
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    const Stored stored = encode(tensor[i], i);
    std::memcpy(bytes.data() + static_cast<size_t>(i) * sizeof(Stored), &stored, sizeof(Stored));
  }
  return bytes;
}

// Encoder that stores each element as Stored, refusing values that do not fit.
template <class Stored, class T>
auto checked_encoder(DType dtype) {
  return [dtype](T value, int64_t i) {
    const std::optional<Stored> converted = convert_element<Stored>(value);
    if (!converted)  // not check(), which would build to_string(dtype) for every element
      throw Error(detail::concat("safetensors::from_tensor: element ", i, " (", printable(value), ") does not fit ",
                                 to_string(dtype)));
    return *converted;
  };
}

// ---------------------------------------------------------------------------------------------
// Header parsing.

// A JSON value in an error message, cut after 80 characters so that a huge malformed value is
// not echoed whole. It is a small handle, written out only if the message is built (check()
// formats its parts only on failure), so the success path does no work for it. The writer stops
// descending once 80 characters are out, so nesting depth costs no stack: nlohmann's dump()
// recurses once per level, and a header of 100 000 nested '[' (200 kB, well within the header
// limit) overflowed the stack.
struct Abbreviated {
  const Json& value;
};

Abbreviated abbreviate(const Json& value) { return {value}; }

void write_abbreviated(std::string& out, const Json& value, size_t limit) {
  if (out.size() > limit) return;
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      out += Json(key).dump();
      out += ':';
      write_abbreviated(out, item, limit);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    bool first = true;
    for (const Json& item : value) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      write_abbreviated(out, item, limit);
    }
    out += ']';
  } else {
    out += value.dump();  // a scalar: no nesting
  }
}

std::ostream& operator<<(std::ostream& stream, const Abbreviated& abbreviated) {
  constexpr size_t kMaxLength = 80;
  std::string text;
  write_abbreviated(text, abbreviated.value, kMaxLength);
  if (text.size() > kMaxLength) text = text.substr(0, kMaxLength) + "...";
  return stream << text;
}

std::optional<uint64_t> as_non_negative_integer(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return value.get<uint64_t>();  // "-0"
  return std::nullopt;
}

// Containers a valid header nests: the header object, a tensor entry or __metadata__, a shape
// or data_offsets array.
constexpr int kMaxHeaderNesting = 3;

// Parses the header text, rejecting duplicate keys in any object (nlohmann would silently keep
// the last one, so two readers could disagree about the same file) and nesting deeper than a
// header has (refused as it opens, so a header of nested brackets builds no deep tree).
Json parse_header_json(std::string_view text) {
  check(!text.empty(), "safetensors: header is empty, expected a JSON object starting with '{'");
  const auto first = static_cast<unsigned char>(text.front());
  check(first == '{', "safetensors: header must start with '{', got ",
        (first >= 0x20 && first < 0x7F) ? detail::concat("'", text.front(), "'")
                                         : detail::concat("byte ", static_cast<int>(first)));
  // nlohmann treats a NUL byte as end of input, which would let anything after it through; a raw
  // NUL is never valid JSON, so reject it up front.
  check(text.find('\0') == std::string_view::npos, "safetensors: header contains a NUL byte at offset ",
        text.find('\0'), ", which is not valid JSON");

  struct OpenObject {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<OpenObject> open_objects;
  int open_containers = 0;
  const auto open_container = [&] {
    check(++open_containers <= kMaxHeaderNesting, "safetensors: header nests objects or arrays more than ",
          kMaxHeaderNesting, " deep (header object, tensor entry, shape), which no valid header does");
  };
  const Json::parser_callback_t check_structure = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_container();
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        --open_containers;
        open_objects.pop_back();
        break;
      case Json::parse_event_t::array_start:
        open_container();
        break;
      case Json::parse_event_t::array_end:
        --open_containers;
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        OpenObject& object = open_objects.back();
        if (!object.keys.insert(key).second) {
          if (open_objects.size() == 1) throw Error("safetensors: duplicate key '" + key + "' in the header");
          throw Error("safetensors: duplicate key '" + key + "' inside '" +
                      open_objects[open_objects.size() - 2].last_key + "'");
        }
        object.last_key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check_structure);
  } catch (const Json::exception& e) {
    throw Error(std::string("safetensors: header is not valid JSON: ") + e.what());
  }
}

std::map<std::string, std::string> read_metadata(const Json& value) {
  check(value.is_object(), "safetensors: __metadata__ must be an object mapping strings to strings, got ",
        abbreviate(value));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, entry] : value.items()) {
    check(entry.is_string(), "safetensors: __metadata__ entry '", key, "' must be a string, got ",
          abbreviate(entry));
    metadata.emplace(key, entry.get<std::string>());
  }
  return metadata;
}

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Validates one tensor entry on its own: fields, dtype, shape, offsets and their agreement.
Entry read_entry(const std::string& name, const Json& value) {
  const std::string where = "safetensors: tensor '" + name + "'";
  check(value.is_object(), where, ": expected an object with dtype, shape and data_offsets, got ",
        abbreviate(value));
  for (const auto& [key, field] : value.items())
    check(key == "dtype" || key == "shape" || key == "data_offsets", where, ": unexpected field '", key,
          "' (expected exactly dtype, shape and data_offsets)");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    check(value.contains(field), where, ": missing field '", field, "'");

  Entry entry;
  entry.name = name;

  const Json& dtype = value.at("dtype");
  check(dtype.is_string(), where, ": dtype must be a string, got ", abbreviate(dtype));
  const std::optional<DType> known = find_dtype(dtype.get<std::string>());
  check(known.has_value(), where, ": unknown dtype ", abbreviate(dtype), " (known: ", known_dtype_names(), ")");
  entry.dtype = *known;

  const Json& shape = value.at("shape");
  check(shape.is_array(), where, ": shape must be an array of non-negative integers, got ", abbreviate(shape));
  for (const Json& dim : shape) {
    const std::optional<uint64_t> size = as_non_negative_integer(dim);
    check(size.has_value() && *size <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where,
          ": shape must be an array of non-negative integers, got ", abbreviate(shape));
    entry.shape.push_back(static_cast<int64_t>(*size));
  }

  const Json& offsets = value.at("data_offsets");
  const bool is_pair = offsets.is_array() && offsets.size() == 2;
  const std::optional<uint64_t> begin = is_pair ? as_non_negative_integer(offsets[0]) : std::nullopt;
  const std::optional<uint64_t> end = is_pair ? as_non_negative_integer(offsets[1]) : std::nullopt;
  check(begin.has_value() && end.has_value(), where,
        ": data_offsets must be [begin, end] with non-negative integers, got ", abbreviate(offsets));
  entry.begin = *begin;
  entry.end = *end;
  check(entry.end >= entry.begin, where, ": data_offsets ", describe_offsets(entry.begin, entry.end),
        " are reversed (end < begin)");

  const uint64_t needed = byte_size(entry.shape, entry.dtype, where);
  check(entry.end - entry.begin == needed, where, ": data_offsets ", describe_offsets(entry.begin, entry.end),
        " hold ", entry.end - entry.begin, " bytes but shape ", mha::to_string(entry.shape), " of ",
        to_string(entry.dtype), " needs ", needed);
  return entry;
}

// The tensors, sorted by offset, must tile the data buffer exactly: no gap, no overlap, no
// trailing bytes. (Each entry is already known to end inside the buffer.)
void check_tiling(std::vector<Entry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    check(entry.begin >= covered, "safetensors: tensor '", entry.name, "': data_offsets ",
          describe_offsets(entry.begin, entry.end), " overlap tensor '", previous ? previous->name : "",
          "' at ", previous ? describe_offsets(previous->begin, previous->end) : "");
    check(entry.begin == covered, "safetensors: tensor '", entry.name, "': data_offsets ",
          describe_offsets(entry.begin, entry.end), " leave a gap: bytes [", covered, ", ", entry.begin,
          ") of the data buffer belong to no tensor");
    covered = entry.end;
    previous = &entry;
  }
  check(covered == data_size, "safetensors: the data buffer has ", data_size, " bytes but the tensors cover ",
        covered, " (trailing bytes after the last tensor)");
}

}  // namespace

std::string to_string(DType dtype) { return info(dtype).name; }

DType dtype_from_string(const std::string& name) {
  const std::optional<DType> dtype = find_dtype(name);
  check(dtype.has_value(), "safetensors: unknown dtype '", name, "' (known: ", known_dtype_names(), ")");
  return *dtype;
}

size_t dtype_size(DType dtype) { return info(dtype).size; }

namespace {

// A file image's header, validated: its metadata and tensors (each with its bytes inside the
// image), checked against every rule of the format before any tensor is read.
struct Index {
  std::map<std::string, std::string> metadata;
  std::map<std::string, TensorRef> tensors;
};

Index read_index(std::span<const std::byte> bytes) {
  check(bytes.size() >= kHeaderSizeBytes, "safetensors: file is ", bytes.size(),
        " bytes, too short for the 8-byte header size");
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), sizeof(header_size));
  check(header_size <= kMaxHeaderSize, "safetensors: header size ", header_size, " exceeds the limit of ",
        kMaxHeaderSize, " bytes");
  // Compared against what follows the size field, so the sum below cannot overflow.
  check(header_size <= bytes.size() - kHeaderSizeBytes, "safetensors: header size ", header_size,
        " runs past the end of the file (", bytes.size() - kHeaderSizeBytes, " bytes follow the size field)");
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data()) + kHeaderSizeBytes,
                                     static_cast<size_t>(header_size));
  const std::span<const std::byte> data = bytes.subspan(kHeaderSizeBytes + static_cast<size_t>(header_size));

  const Json header = parse_header_json(header_text);
  Index index;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      index.metadata = read_metadata(value);
      continue;
    }
    Entry entry = read_entry(key, value);
    check(entry.end <= data.size(), "safetensors: tensor '", key, "': data_offsets ",
          describe_offsets(entry.begin, entry.end), " run past the end of the ", data.size(),
          "-byte data buffer (file truncated?)");
    entries.push_back(std::move(entry));
  }
  check_tiling(entries, data.size());

  for (Entry& entry : entries) {
    const auto tensor_bytes = data.subspan(static_cast<size_t>(entry.begin),
                                           static_cast<size_t>(entry.end - entry.begin));
    index.tensors.emplace(std::move(entry.name), TensorRef{entry.dtype, std::move(entry.shape), tensor_bytes});
  }
  return index;
}

// The tensor `name` of `tensors`, or an mha::Error listing the names there are.
template <class Tensors>
const typename Tensors::mapped_type& require_in(const Tensors& tensors, const std::string& name,
                                               const std::string& what) {
  const auto found = tensors.find(name);
  if (found != tensors.end()) return found->second;
  std::string names;
  for (const auto& [have, tensor] : tensors) names += (names.empty() ? "" : ", ") + have;
  throw Error(what + ": no tensor named '" + name + "' (have: " + (names.empty() ? "none" : names) + ")");
}

// A File holding its own copy of each tensor's bytes.
File owning_copy(const std::map<std::string, std::string>& metadata, const std::map<std::string, TensorRef>& tensors) {
  File file;
  file.metadata = metadata;
  for (const auto& [name, tensor] : tensors)
    file.tensors.emplace(name, TensorData{tensor.dtype, tensor.shape, {tensor.bytes.begin(), tensor.bytes.end()}});
  return file;
}

}  // namespace

File parse(std::span<const std::byte> bytes) {
  const Index index = read_index(bytes);
  return owning_copy(index.metadata, index.tensors);
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  check(!error && fs::exists(status), "safetensors: cannot load '", path, "': ",
        error ? error.message() : "no such file");
  check(!fs::is_directory(status), "safetensors: cannot load '", path, "': it is a directory");
  // A FIFO or device would block the open (or never end); only a regular file has a size to check.
  check(fs::is_regular_file(status), "safetensors: cannot load '", path,
        "': not a regular file (a FIFO, socket or device)");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "safetensors: cannot open '", path, "': ", std::strerror(errno));
  struct stat info {};
  const bool sized = ::fstat(fd, &info) == 0;
  const int stat_error = errno;
  if (sized && info.st_size > 0) {
    size_ = static_cast<size_t>(info.st_size);
    // MAP_POPULATE reads the whole file in one go (one fault-in of the page cache pages instead
    // of one fault per 4 KiB page as the tensors are decoded).
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    const int map_error = errno;
    ::close(fd);
    check(mapped != MAP_FAILED, "safetensors: cannot map '", path, "': ", std::strerror(map_error));
    data_ = static_cast<const std::byte*>(mapped);
  } else {
    ::close(fd);
    check(sized, "safetensors: cannot determine the size of '", path, "': ", std::strerror(stat_error));
  }
  try {
    Index index = read_index({data_, size_});
    metadata_ = std::move(index.metadata);
    tensors_ = std::move(index.tensors);
  } catch (const Error& e) {
    unmap();
    throw Error(std::string(e.what()) + " (in '" + path + "')");
  }
}

MappedFile::~MappedFile() { unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      metadata_(std::move(other.metadata_)),
      tensors_(std::move(other.tensors_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
  }
  return *this;
}

void MappedFile::unmap() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

const TensorRef& MappedFile::require(const std::string& name, const std::string& what) const {
  return require_in(tensors_, name, what);
}

template <class T>
Tensor<T> MappedFile::to_tensor(const std::string& name) const {
  return safetensors::to_tensor<T>(require(name, path_), name);
}

File load(const std::string& path) {
  const MappedFile mapped(path);
  return owning_copy(mapped.metadata(), mapped.tensors());
}

namespace {

// The header of `file` as written: JSON padded with spaces to a multiple of 8, after checking
// every tensor's byte count against its shape and dtype.
std::string header_text(const File& file) {
  OrderedJson header = OrderedJson::object();
  if (!file.metadata.empty()) {
    OrderedJson metadata = OrderedJson::object();
    for (const auto& [key, value] : file.metadata) metadata[key] = value;
    header[std::string(kMetadataKey)] = std::move(metadata);
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    check(name != kMetadataKey, "safetensors: '__metadata__' is reserved for metadata and cannot name a tensor");
    const std::string where = "safetensors: tensor '" + name + "'";
    const uint64_t size = byte_size(tensor.shape, tensor.dtype, where);
    check(tensor.bytes.size() == size, where, ": has ", tensor.bytes.size(), " bytes but shape ",
          mha::to_string(tensor.shape), " of ", to_string(tensor.dtype), " needs ", size);
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = to_string(tensor.dtype);
    entry["shape"] = tensor.shape;
    entry["data_offsets"] = OrderedJson::array({offset, offset + size});
    header[name] = std::move(entry);
    offset += size;
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const OrderedJson::exception& e) {
    throw Error(std::string("safetensors: tensor names and metadata must be valid UTF-8: ") + e.what());
  }
  // Padding to a multiple of 8 keeps the data buffer 8-byte aligned in the file.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  check(header_text.size() <= kMaxHeaderSize, "safetensors: header of ", header_text.size(),
        " bytes exceeds the limit of ", kMaxHeaderSize);
  return header_text;
}

}  // namespace

std::vector<std::byte> serialize(const File& file) {
  const std::string header_text = safetensors::header_text(file);
  size_t data_size = 0;
  for (const auto& [name, tensor] : file.tensors) data_size += tensor.bytes.size();
  std::vector<std::byte> out(kHeaderSizeBytes + header_text.size() + data_size);
  std::byte* at = out.data();
  auto put = [&](const void* bytes, size_t size) {
    if (size > 0) std::memcpy(at, bytes, size);
    at += size;
  };
  const uint64_t header_size = header_text.size();
  put(&header_size, sizeof(header_size));
  put(header_text.data(), header_text.size());
  for (const auto& [name, tensor] : file.tensors) put(tensor.bytes.data(), tensor.bytes.size());
  return out;
}

void save(const File& file, const std::string& path) {
  // The header first: an invalid File must not touch the disk at all. Then the size, the header
  // and each tensor's bytes go to the file as they are, with no image of the whole file built.
  const std::string header = header_text(file);
  const uint64_t header_size = header.size();
  write_file_atomically(path, "safetensors", [&](std::FILE* out) {
    // errno is read after fwrite has failed: as two arguments of one check(), the order in which
    // they were evaluated was unspecified, and GCC read errno first (a stale "Success").
    auto write = [&](const void* bytes, size_t size) {
      if (size == 0) return;  // an empty tensor's bytes may be a null pointer, which fwrite must not get
      if (std::fwrite(bytes, 1, size, out) != size)
        throw Error(detail::concat("safetensors: cannot write '", path, "': ", std::strerror(errno)));
    };
    write(&header_size, sizeof(header_size));
    write(header.data(), header.size());
    for (const auto& [name, tensor] : file.tensors) write(tensor.bytes.data(), tensor.bytes.size());
  });
}

template <class T>
Tensor<T> to_tensor(const TensorRef& data, const std::string& name) {
  const std::string where = "safetensors: tensor '" + name + "'";
  const uint64_t needed = byte_size(data.shape, data.dtype, where);
  check(data.bytes.size() == needed, where, ": has ", data.bytes.size(), " bytes but shape ",
        mha::to_string(data.shape), " of ", to_string(data.dtype), " needs ", needed);
  auto out = Tensor<T>::uninitialized(data.shape);  // every element is written below
  // Stored as T itself (F32 into float, F64 into double): the bytes are the values.
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (data.dtype == (std::is_same_v<T, float> ? DType::F32 : DType::F64)) {
      if (needed > 0) std::memcpy(out.data(), data.bytes.data(), data.bytes.size());
      return out;
    }
  }
  const auto as_is = [](auto stored, int64_t) { return stored; };
  switch (data.dtype) {
    case DType::BOOL:
      decode_elements<uint8_t>(out, data, name, [&](uint8_t byte, int64_t i) {
        check(byte <= 1, where, ": BOOL element ", i, " is stored as byte ", static_cast<int>(byte),
              ", expected 0 or 1");
        return byte == 1;
      });
      break;
    case DType::U8: decode_elements<uint8_t>(out, data, name, as_is); break;
    case DType::I8: decode_elements<int8_t>(out, data, name, as_is); break;
    case DType::I16: decode_elements<int16_t>(out, data, name, as_is); break;
    case DType::I32: decode_elements<int32_t>(out, data, name, as_is); break;
    case DType::I64: decode_elements<int64_t>(out, data, name, as_is); break;
    case DType::F16:
      decode_elements<uint16_t>(out, data, name, [](uint16_t half, int64_t) { return f16_to_float(half); });
      break;
    case DType::BF16:
      decode_elements<uint16_t>(out, data, name, [](uint16_t bf16, int64_t) { return bf16_to_float(bf16); });
      break;
    case DType::F32: decode_elements<float>(out, data, name, as_is); break;
    case DType::F64: decode_elements<double>(out, data, name, as_is); break;
  }
  return out;
}

template <class T>
TensorData from_tensor(const Tensor<T>& tensor) {
  if constexpr (std::is_same_v<T, float>) return from_tensor(tensor, DType::F32);
  else if constexpr (std::is_same_v<T, double>) return from_tensor(tensor, DType::F64);
  else if constexpr (std::is_same_v<T, bool>) return from_tensor(tensor, DType::BOOL);
  else if constexpr (std::is_same_v<T, int64_t>) return from_tensor(tensor, DType::I64);
  else if constexpr (std::is_same_v<T, int32_t>) return from_tensor(tensor, DType::I32);
  else static_assert(!sizeof(T), "unsupported element type");
}

// Any element type converts to any dtype: floating dtypes round (F16/BF16 to nearest even),
// integer and BOOL dtypes accept only values they hold exactly.
template <class T>
TensorData from_tensor(const Tensor<T>& tensor, DType dtype) {
  check(tensor.defined(), "safetensors::from_tensor: the tensor is undefined (default-constructed)");
  TensorData data{dtype, tensor.shape(), {}};
  // Stored as T itself (float as F32, double as F64): the values are the bytes.
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (dtype == (std::is_same_v<T, float> ? DType::F32 : DType::F64)) {
      // Constructed from the range: one pass (resize then memcpy wrote every byte twice).
      const auto* first = reinterpret_cast<const std::byte*>(tensor.data());
      data.bytes.assign(first, first + static_cast<size_t>(tensor.numel()) * sizeof(T));
      return data;
    }
  }
  const auto to_f16 = [](T value, int64_t) { return double_to_f16(static_cast<double>(value)); };
  const auto to_bf16 = [](T value, int64_t) { return double_to_bf16(static_cast<double>(value)); };
  switch (dtype) {
    case DType::BOOL: {
      const auto to_bool = checked_encoder<bool, T>(dtype);
      data.bytes = encode_elements<uint8_t>(tensor, [&](T value, int64_t i) {
        return static_cast<uint8_t>(to_bool(value, i));
      });
      break;
    }
    case DType::U8: data.bytes = encode_elements<uint8_t>(tensor, checked_encoder<uint8_t, T>(dtype)); break;
    case DType::I8: data.bytes = encode_elements<int8_t>(tensor, checked_encoder<int8_t, T>(dtype)); break;
    case DType::I16: data.bytes = encode_elements<int16_t>(tensor, checked_encoder<int16_t, T>(dtype)); break;
    case DType::I32: data.bytes = encode_elements<int32_t>(tensor, checked_encoder<int32_t, T>(dtype)); break;
    case DType::I64: data.bytes = encode_elements<int64_t>(tensor, checked_encoder<int64_t, T>(dtype)); break;
    case DType::F16: data.bytes = encode_elements<uint16_t>(tensor, to_f16); break;
    case DType::BF16: data.bytes = encode_elements<uint16_t>(tensor, to_bf16); break;
    case DType::F32: data.bytes = encode_elements<float>(tensor, checked_encoder<float, T>(dtype)); break;
    case DType::F64: data.bytes = encode_elements<double>(tensor, checked_encoder<double, T>(dtype)); break;
    default: throw Error(detail::concat("safetensors::from_tensor: invalid DType value ", static_cast<int>(dtype)));
  }
  return data;
}

template <class T>
Tensor<T> to_tensor(const TensorData& data, const std::string& name) {
  return to_tensor<T>(TensorRef{data.dtype, data.shape, data.bytes}, name);
}

const TensorData& require(const File& file, const std::string& name, const std::string& what) {
  return require_in(file.tensors, name, what);
}

#define MHA_INSTANTIATE(T)                                                       \
  template Tensor<T> to_tensor<T>(const TensorData&, const std::string&);        \
  template Tensor<T> to_tensor<T>(const TensorRef&, const std::string&);         \
  template Tensor<T> MappedFile::to_tensor<T>(const std::string&) const;         \
  template TensorData from_tensor<T>(const Tensor<T>&);                          \
  template TensorData from_tensor<T>(const Tensor<T>&, DType);
MHA_INSTANTIATE(float)
MHA_INSTANTIATE(double)
MHA_INSTANTIATE(bool)
MHA_INSTANTIATE(int64_t)
MHA_INSTANTIATE(int32_t)
#undef MHA_INSTANTIATE

}  // namespace mha::safetensors
