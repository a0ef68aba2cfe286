// safetensors: the header, a JSON object, parsed and checked against every rule of the format
// into the index of the tensors (read_index), and written from a File (header_text).
#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "safetensors_format.h"

namespace mha::safetensors::format {
namespace {

using Json = nlohmann::json;
// Insertion-ordered, so the header lists __metadata__ first and then tensors in data order,
// exactly as the reference writer does.
using OrderedJson = nlohmann::ordered_json;

std::string describe_offsets(uint64_t begin, uint64_t end) {
  return detail::concat("[", begin, ", ", end, "]");
}

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

}  // namespace mha::safetensors::format
