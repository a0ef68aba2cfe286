// safetensors: the dtypes, and tensors converted to and from their stored elements (to_tensor,
// from_tensor). The header is read and written in safetensors_header.cpp, files in
// safetensors_read.cpp and safetensors_write.cpp.
#include "mha/core/safetensors.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "mha/core/half.h"
#include "safetensors_format.h"

namespace mha::safetensors {

// Tensor bytes are copied between the file and memory as they are, which is only right when the
// host byte order matches the format's.
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; mha copies it unconverted");

namespace {

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

}  // namespace

namespace format {

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

}  // namespace format

namespace {

// Element conversions shared by to_tensor and from_tensor.

template <class T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, bfloat16>) return "bfloat16";
  else if constexpr (std::is_same_v<T, float16>) return "float16";
  else static_assert(!sizeof(T), "unsupported element type");
}

// The dtype a floating element type is stored as when it is stored as itself.
template <class T>
constexpr DType own_dtype() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, double>) return DType::F64;
  else if constexpr (std::is_same_v<T, bfloat16>) return DType::BF16;
  else return DType::F16;
}

// Streams int8/uint8 as numbers rather than characters.
template <class V>
auto printable(V value) {
  if constexpr (std::is_integral_v<V>) return static_cast<long long>(value);
  else if constexpr (is_half_v<V>) return widen(value);
  else return value;
}

// `value` as To, or nullopt when it does not fit: to bool only 0 and 1 convert; to an integer only
// finite whole numbers in range do. Conversions to floating point always succeed (rounding to
// nearest, overflowing to inf, as static_cast does on IEEE hosts).
template <class To, class From>
std::optional<To> convert_element(From value) {
  if constexpr (is_half_v<From>) {
    return convert_element<To>(widen(value));  // exact in float
  } else if constexpr (is_half_v<To>) {
    return narrow<To>(static_cast<double>(value));  // rounded once (from a whole number: exact first)
  } else if constexpr (std::is_floating_point_v<To>) {
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

}  // namespace

std::string to_string(DType dtype) { return info(dtype).name; }

DType dtype_from_string(const std::string& name) {
  const std::optional<DType> dtype = format::find_dtype(name);
  check(dtype.has_value(), "safetensors: unknown dtype '", name, "' (known: ", format::known_dtype_names(), ")");
  return *dtype;
}

size_t dtype_size(DType dtype) { return info(dtype).size; }

template <class T>
Tensor<T> to_tensor(const TensorRef& data, const std::string& name) {
  const std::string where = "safetensors: tensor '" + name + "'";
  const uint64_t needed = format::byte_size(data.shape, data.dtype, where);
  check(data.bytes.size() == needed, where, ": has ", data.bytes.size(), " bytes but shape ",
        mha::to_string(data.shape), " of ", to_string(data.dtype), " needs ", needed);
  auto out = Tensor<T>::uninitialized(data.shape);  // every element is written below
  // Stored as T itself (F32 into float, F64 into double): the bytes are the values.
  // (And BF16 into bfloat16, F16 into float16: their bits as they are.)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_v<T>) {
    if (data.dtype == own_dtype<T>()) {
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
      decode_elements<float16>(out, data, name, [](float16 half, int64_t) { return to_float(half); });
      break;
    case DType::BF16:
      decode_elements<bfloat16>(out, data, name, [](bfloat16 bf16, int64_t) { return to_float(bf16); });
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
  else if constexpr (is_half_v<T>) return from_tensor(tensor, own_dtype<T>());
  else static_assert(!sizeof(T), "unsupported element type");
}

// Any element type converts to any dtype: floating dtypes round (F16/BF16 to nearest even),
// integer and BOOL dtypes accept only values they hold exactly.
template <class T>
TensorData from_tensor(const Tensor<T>& tensor, DType dtype) {
  check(tensor.defined(), "safetensors::from_tensor: the tensor is undefined (default-constructed)");
  TensorData data{dtype, tensor.shape(), {}};
  // Stored as T itself (float as F32, double as F64, bfloat16 as BF16, float16 as F16): the values
  // are the bytes.
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_v<T>) {
    if (dtype == own_dtype<T>()) {
      // Constructed from the range: one pass (resize then memcpy wrote every byte twice).
      const auto* first = reinterpret_cast<const std::byte*>(tensor.data());
      data.bytes.assign(first, first + static_cast<size_t>(tensor.numel()) * sizeof(T));
      return data;
    }
  }
  // Rounded once, from the double (mha/core/half.h): a double rounded through float would round twice.
  const auto to_f16 = [](T value, int64_t) { return *convert_element<float16>(value); };
  const auto to_bf16 = [](T value, int64_t) { return *convert_element<bfloat16>(value); };
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
    case DType::F16: data.bytes = encode_elements<float16>(tensor, to_f16); break;
    case DType::BF16: data.bytes = encode_elements<bfloat16>(tensor, to_bf16); break;
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

template <class T>
Tensor<T> MappedFile::to_tensor(const std::string& name) const {
  return safetensors::to_tensor<T>(require(name, path_), name);
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
MHA_INSTANTIATE(bfloat16)
MHA_INSTANTIATE(float16)
#undef MHA_INSTANTIATE

}  // namespace mha::safetensors
