#include "mha/core/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "../support/assertions.h"
#include "../support/printable.h"

namespace {

namespace fs = std::filesystem;
namespace st = mha::safetensors;
using st::DType;
using mha::testing::error_of;

// The committed fixture lives next to this file; the build only tells us where the goldens are.
const fs::path kPythonFixture =
    fs::path(MHA_GOLDENS_DIR).parent_path() / "core" / "fixtures" / "python_written.safetensors";

std::vector<std::byte> as_bytes(std::string_view text) {
  const auto* begin = reinterpret_cast<const std::byte*>(text.data());
  return {begin, begin + text.size()};
}

// A file image: `header_size` as 8 little-endian bytes, then `rest` (header text and data).
std::vector<std::byte> with_header_size(uint64_t header_size, std::string_view rest) {
  std::vector<std::byte> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<std::byte>((header_size >> (8 * i)) & 0xFF));
  const std::vector<std::byte> tail = as_bytes(rest);
  bytes.insert(bytes.end(), tail.begin(), tail.end());
  return bytes;
}

std::string repeat(std::string_view text, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += text;
  return out;
}

std::vector<std::byte> make_file(std::string_view header, std::string_view data) {
  return with_header_size(header.size(), std::string(header) + std::string(data));
}

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.is_open()) << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void write_file(const fs::path& path, std::string_view text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Reads a file as a user would: parse it, then convert every tensor.
void read_everything(const std::vector<std::byte>& bytes) {
  const st::File file = st::parse(bytes);
  for (const auto& [name, tensor] : file.tensors) (void)st::to_tensor<double>(tensor, name);
}


#define EXPECT_ERROR_CONTAINS(statement, substring)                                 \
  do {                                                                              \
    EXPECT_THROW(statement, mha::Error);                                            \
    const std::string message = error_of([&] { statement; });                       \
    EXPECT_NE(message.find(substring), std::string::npos)                           \
        << "message: " << message << "\nexpected to contain: " << (substring);     \
  } while (0)

void expect_same(const st::TensorData& got, const st::TensorData& expected, const std::string& name) {
  EXPECT_EQ(got.dtype, expected.dtype) << name;
  EXPECT_EQ(got.shape, expected.shape) << name;
  EXPECT_EQ(got.bytes, expected.bytes) << name;
}

// A fresh directory under the system temp dir, removed with everything in it afterwards.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("mha_safetensors_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

template <class T>
std::vector<T> values_of(const mha::Tensor<T>& tensor) {
  return {tensor.values().begin(), tensor.values().end()};
}

uint16_t u16_at(const st::TensorData& data, size_t i) {
  uint16_t value = 0;
  std::memcpy(&value, data.bytes.data() + 2 * i, 2);
  return value;
}

// -------------------------------------------------------------------------------------------
// DType names and sizes

TEST(SafetensorsDType, NamesAndSizesRoundTrip) {
  const std::vector<std::pair<DType, size_t>> all = {
      {DType::BOOL, 1}, {DType::U8, 1}, {DType::I8, 1},  {DType::I16, 2}, {DType::I32, 4},
      {DType::I64, 8},  {DType::F16, 2}, {DType::BF16, 2}, {DType::F32, 4}, {DType::F64, 8}};
  for (const auto& [dtype, size] : all) {
    EXPECT_EQ(st::dtype_from_string(st::to_string(dtype)), dtype);
    EXPECT_EQ(st::dtype_size(dtype), size) << st::to_string(dtype);
  }
  EXPECT_EQ(st::to_string(DType::BF16), "BF16");
  EXPECT_ERROR_CONTAINS(st::dtype_from_string("f32"), "unknown dtype 'f32'");
}

// -------------------------------------------------------------------------------------------
// Round trips

TEST(SafetensorsRoundTrip, EveryDTypeRankZeroZeroSizeAndMetadata) {
  const mha::Tensor<int64_t> small_ints({2, 2}, {-7, 0, 5, 100});
  st::File file;
  file.tensors["bool"] = st::from_tensor(mha::Tensor<bool>({3}, {true, false, true}));
  file.tensors["u8"] = st::from_tensor(mha::Tensor<int64_t>({3}, {0, 128, 255}), DType::U8);
  file.tensors["i8"] = st::from_tensor(mha::Tensor<int64_t>({3}, {-128, 0, 127}), DType::I8);
  file.tensors["i16"] = st::from_tensor(mha::Tensor<int64_t>({2}, {-32768, 32767}), DType::I16);
  file.tensors["i32"] = st::from_tensor(mha::Tensor<int32_t>({2, 1}, {-2147483647 - 1, 2147483647}));
  file.tensors["i64"] = st::from_tensor(small_ints);
  file.tensors["f16"] = st::from_tensor(mha::Tensor<float>({2}, {1.5f, -0.25f}), DType::F16);
  file.tensors["bf16"] = st::from_tensor(mha::Tensor<float>({2}, {1.5f, -0.25f}), DType::BF16);
  file.tensors["f32"] = st::from_tensor(mha::Tensor<float>({1, 2, 1}, {0.1f, -3.5f}));
  file.tensors["f64"] = st::from_tensor(mha::Tensor<double>({2}, {0.1, 1e300}));
  file.tensors["scalar"] = st::from_tensor(mha::Tensor<double>(mha::Shape{}, 42.0));
  file.tensors["empty"] = st::from_tensor(mha::Tensor<float>({0, 4}));
  file.tensors["empty_bool"] = st::from_tensor(mha::Tensor<bool>({3, 0}));
  file.metadata = {{"format", "pt"}, {"note", "ünïcödé \"quoted\"\n"}};

  const std::vector<std::byte> bytes = st::serialize(file);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  const st::File back = st::parse(bytes);
  EXPECT_EQ(back.metadata, file.metadata);
  ASSERT_EQ(back.tensors.size(), file.tensors.size());
  for (const auto& [name, tensor] : file.tensors) {
    ASSERT_TRUE(back.tensors.count(name)) << name;
    expect_same(back.tensors.at(name), tensor, name);
  }
  EXPECT_EQ(st::serialize(back), bytes);

  // Values come back through the typed conversions.
  EXPECT_EQ(st::to_tensor<int64_t>(back.tensors.at("u8"), "u8").values()[1], 128);
  EXPECT_EQ(st::to_tensor<int64_t>(back.tensors.at("i8"), "i8").values()[0], -128);
  EXPECT_EQ(st::to_tensor<int32_t>(back.tensors.at("i16"), "i16").values()[0], -32768);
  EXPECT_EQ(st::to_tensor<int32_t>(back.tensors.at("i32"), "i32").values()[0], -2147483647 - 1);
  EXPECT_EQ(st::to_tensor<int64_t>(back.tensors.at("i64"), "i64").values()[3], 100);
  EXPECT_EQ(st::to_tensor<float>(back.tensors.at("f16"), "f16").values()[1], -0.25f);
  EXPECT_EQ(st::to_tensor<float>(back.tensors.at("bf16"), "bf16").values()[0], 1.5f);
  EXPECT_EQ(st::to_tensor<float>(back.tensors.at("f32"), "f32").values()[0], 0.1f);
  EXPECT_EQ(st::to_tensor<double>(back.tensors.at("f64"), "f64").values()[1], 1e300);
  const auto scalar = st::to_tensor<double>(back.tensors.at("scalar"), "scalar");
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar[0], 42.0);
  const auto empty = st::to_tensor<float>(back.tensors.at("empty"), "empty");
  EXPECT_EQ(empty.shape(), (mha::Shape{0, 4}));
  EXPECT_EQ(empty.numel(), 0);
  const auto flags = st::to_tensor<bool>(back.tensors.at("bool"), "bool");
  EXPECT_TRUE(flags[0]);
  EXPECT_FALSE(flags[1]);
  EXPECT_TRUE(flags[2]);
}

TEST(SafetensorsRoundTrip, EmptyFileHasNoMetadataEntry) {
  const std::vector<std::byte> bytes = st::serialize(st::File{});
  // "{}" padded to 8 bytes.
  EXPECT_EQ(bytes, with_header_size(8, "{}      "));
  const st::File back = st::parse(bytes);
  EXPECT_TRUE(back.tensors.empty());
  EXPECT_TRUE(back.metadata.empty());
}

// -------------------------------------------------------------------------------------------
// Byte-exact layout

TEST(SafetensorsLayout, MatchesHandDerivedBytes) {
  st::File file;
  file.tensors["b"] = st::from_tensor(mha::Tensor<int64_t>(mha::Shape{}, 513), DType::I16);
  file.tensors["a"] = st::from_tensor(mha::Tensor<float>({2}, {1.0f, -2.0f}));
  file.metadata["k"] = "v";

  // Metadata first, then tensors in name order with contiguous offsets; fields in the order
  // dtype, shape, data_offsets; compact JSON (132 characters) padded with 4 spaces to 136 = 0x88.
  const std::string header =
      R"({"__metadata__":{"k":"v"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I16","shape":[],"data_offsets":[8,10]}})"
      "    ";
  ASSERT_EQ(header.size(), 136u);
  const std::string size_field("\x88\0\0\0\0\0\0\0", 8);
  const std::string data("\x00\x00\x80\x3f"   // 1.0f
                         "\x00\x00\x00\xc0"   // -2.0f
                         "\x01\x02",          // int16 513 = 0x0201
                         10);
  EXPECT_EQ(st::serialize(file), as_bytes(size_field + header + data));
}

// Values written by scripts/goldens/make_safetensors_fixture.py (the official Python writer), whose
// `source` is the path the script had then; keep the two lists in step.
TEST(SafetensorsLayout, ReadsFileWrittenByPythonSafetensors) {
  const st::File file = st::load(kPythonFixture.string());
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"source", "scripts/make_safetensors_fixture.py"}}));
  ASSERT_EQ(file.tensors.size(), 9u);

  const auto i64 = st::to_tensor<int64_t>(st::require(file, "a_i64", "fixture"), "a_i64");
  EXPECT_EQ(i64.shape(), (mha::Shape{5}));
  EXPECT_EQ(std::vector<int64_t>(i64.values().begin(), i64.values().end()),
            (std::vector<int64_t>{-3, 0, (int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max()}));

  const auto f64 = st::to_tensor<double>(st::require(file, "b_f64", "fixture"), "b_f64");
  EXPECT_EQ(f64.shape(), (mha::Shape{2, 2}));
  EXPECT_EQ(std::vector<double>(f64.values().begin(), f64.values().end()),
            (std::vector<double>{1.0, -2.5, 1e-300, 3.141592653589793}));

  const auto f32 = st::to_tensor<float>(st::require(file, "c_f32", "fixture"), "c_f32");
  EXPECT_EQ(f32.shape(), (mha::Shape{2, 3}));
  EXPECT_EQ(std::vector<float>(f32.values().begin(), f32.values().end()),
            (std::vector<float>{0.0f, 1.5f, -2.25f, 3.0e38f, std::ldexp(1.0f, -149), -1.0f}));

  const auto scalar = st::to_tensor<float>(st::require(file, "c_scalar", "fixture"), "c_scalar");
  EXPECT_EQ(scalar.shape(), mha::Shape{});
  EXPECT_EQ(scalar[0], 7.5f);

  const auto zero = st::to_tensor<float>(st::require(file, "c_zero", "fixture"), "c_zero");
  EXPECT_EQ(zero.shape(), (mha::Shape{0, 3}));

  const auto i32 = st::to_tensor<int32_t>(st::require(file, "d_i32", "fixture"), "d_i32");
  EXPECT_EQ(std::vector<int32_t>(i32.values().begin(), i32.values().end()),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -1, 0, std::numeric_limits<int32_t>::max()}));

  const auto bf16 = st::to_tensor<float>(st::require(file, "e_bf16", "fixture"), "e_bf16");
  EXPECT_EQ(std::vector<float>(bf16.values().begin(), bf16.values().end()),
            (std::vector<float>{1.0f, -2.5f, 3.140625f, std::numeric_limits<float>::infinity()}));

  const auto f16 = st::to_tensor<double>(st::require(file, "f_f16", "fixture"), "f_f16");
  EXPECT_EQ(f16.shape(), (mha::Shape{2, 3}));
  EXPECT_EQ(f16[0], 1.0);
  EXPECT_EQ(f16[1], -2.5);
  EXPECT_EQ(f16[2], 65504.0);
  EXPECT_EQ(f16[3], std::ldexp(1.0, -24));
  EXPECT_EQ(f16[4], -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(f16[5]));

  const auto flags = st::to_tensor<bool>(st::require(file, "g_bool", "fixture"), "g_bool");
  EXPECT_EQ(flags.shape(), (mha::Shape{2, 2}));
  EXPECT_TRUE(flags[0]);
  EXPECT_FALSE(flags[1]);
  EXPECT_FALSE(flags[2]);
  EXPECT_TRUE(flags[3]);
}

// The fixture's names put name order equal to the Python writer's layout order, so writing the
// parsed file back must reproduce the Python bytes exactly.
TEST(SafetensorsLayout, ReserializesPythonFileByteForByte) {
  const std::vector<std::byte> original = read_file(kPythonFixture);
  ASSERT_FALSE(original.empty());
  EXPECT_EQ(st::serialize(st::parse(original)), original);
}

// -------------------------------------------------------------------------------------------
// Corrupt files: every one must be refused with a message that says what is wrong.

struct CorruptFile {
  const char* what;
  std::vector<std::byte> bytes;
  const char* message;
};

std::vector<CorruptFile> corrupt_files() {
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  const std::string eight_bytes(8, '\0');
  return {
      {"too short", as_bytes("abc"), "too short"},
      {"header size 2^63", with_header_size(uint64_t{1} << 63, "{}"), "exceeds the limit"},
      {"header size 2^64 - 1", with_header_size(~uint64_t{0}, "{}"), "exceeds the limit"},
      {"header size past the end", with_header_size(100, "{}"), "runs past the end of the file"},
      {"empty header", make_file("", ""), "header is empty"},
      {"header not JSON", make_file("{not json}", ""), "not valid JSON"},
      {"header truncated JSON", make_file(R"({"a":{"dtype")", ""), "not valid JSON"},
      {"trailing garbage after JSON", make_file("{} x", ""), "not valid JSON"},
      {"not starting with '{'", make_file("[]", ""), "must start with '{'"},
      {"leading space", make_file(" {}", ""), "must start with '{'"},
      {"NUL hides trailing garbage", make_file(std::string("{}\0garbage", 10), ""), "NUL byte"},
      {"invalid UTF-8", make_file("{\"\xff\":1}", ""), "not valid JSON"},
      {"duplicate tensor name",
       make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"a":{)" + f32x2 + R"(,"data_offsets":[0,8]}})",
                 eight_bytes),
       "duplicate key 'a'"},
      {"duplicate field inside entry",
       make_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight_bytes),
       "duplicate key 'dtype' inside 'a'"},
      {"duplicate metadata key", make_file(R"({"__metadata__":{"k":"1","k":"2"}})", ""),
       "duplicate key 'k' inside '__metadata__'"},
      {"entry not an object", make_file(R"({"a":[1,2]})", ""), "expected an object"},
      {"missing field", make_file(R"({"a":{"dtype":"F32","shape":[2]}})", eight_bytes), "missing field 'data_offsets'"},
      {"extra field", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8],"x":1}})", eight_bytes),
       "unexpected field 'x'"},
      {"unknown dtype", make_file(R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", "xx"),
       "unknown dtype \"F8\""},
      {"dtype not a string", make_file(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", eight_bytes),
       "dtype must be a string"},
      {"negative shape", make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight_bytes),
       "shape must be an array of non-negative integers, got [-2]"},
      {"non-integer shape", make_file(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", eight_bytes),
       "non-negative integers, got [1.5]"},
      {"shape not an array", make_file(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", eight_bytes),
       "shape must be an array"},
      {"shape dimension above int64",
       make_file(R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}})", eight_bytes),
       "non-negative integers"},
      {"offsets not a pair", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0]}})", eight_bytes),
       "data_offsets must be [begin, end]"},
      {"negative offset", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[-8,0]}})", eight_bytes),
       "data_offsets must be [begin, end]"},
      {"offsets reversed", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[8,0]}})", eight_bytes),
       "data_offsets [8, 0] are reversed"},
      {"offsets overlapping",
       make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[4,12]}})",
                 std::string(12, '\0')),
       "tensor 'b': data_offsets [4, 12] overlap tensor 'a' at [0, 8]"},
      {"gap between tensors",
       make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[12,20]}})",
                 std::string(20, '\0')),
       "bytes [8, 12) of the data buffer belong to no tensor"},
      {"first tensor not at 0", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[4,12]}})", std::string(12, '\0')),
       "bytes [0, 4) of the data buffer belong to no tensor"},
      {"offsets out of bounds", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[1000,1008]}})", eight_bytes),
       "run past the end of the 8-byte data buffer"},
      {"truncated data", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", "abcd"),
       "run past the end of the 4-byte data buffer"},
      {"trailing bytes", make_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", std::string(9, '\0')),
       "trailing bytes"},
      {"shape times dtype differs from byte range",
       make_file(R"({"query":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})", std::string(12, '\0')),
       "tensor 'query': data_offsets [0, 12] hold 12 bytes but shape [2, 3] of F32 needs 24"},
      {"element count overflows 64 bits",
       make_file(R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}})", ""),
       "more elements than fit in 64 bits"},
      {"byte count overflows 64 bits",
       make_file(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""),
       "needs more bytes than fit in 64 bits"},
      {"metadata value not a string", make_file(R"({"__metadata__":{"k":1}})", ""),
       "__metadata__ entry 'k' must be a string, got 1"},
      {"metadata not an object", make_file(R"({"__metadata__":"x"})", ""), "__metadata__ must be an object"},
      {"BOOL byte 2", make_file(R"({"mask":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x02", 2)),
       "tensor 'mask': BOOL element 1 is stored as byte 2, expected 0 or 1"},
      {"header size one past the limit", with_header_size(st::kMaxHeaderSize + 1, "{}"), "exceeds the limit"},
      {"offsets at 2^64 - 1", make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})", ""),
       "run past the end of the 0-byte data buffer"},
      {"offsets beyond 2^64", make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,18446744073709551616]}})", ""),
       "data_offsets must be [begin, end] with non-negative integers"},
      // 2^61 − 1 F64 elements need 2^64 − 8 bytes: the arithmetic fits, the file does not.
      {"claims 2^64 - 8 bytes",
       make_file(R"({"a":{"dtype":"F64","shape":[2305843009213693951],"data_offsets":[0,18446744073709551608]}})", ""),
       "data_offsets [0, 18446744073709551608] run past the end of the 0-byte data buffer"},
      // Nesting a valid header never has, refused as it opens; 100 000 levels (200 kB) once
      // overflowed the stack while an error message printed the value.
      {"nested 100000 deep in an entry",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}}",
                 eight_bytes),
       "header nests objects or arrays more than 3 deep"},
      {"nested 100000 deep as metadata",
       make_file(R"({"__metadata__":)" + std::string(100000, '[') + std::string(100000, ']') + "}", ""),
       "header nests objects or arrays more than 3 deep"},
      {"shape nested one level too deep", make_file(R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", eight_bytes),
       "header nests objects or arrays more than 3 deep"},
      {"metadata value an object", make_file(R"({"__metadata__":{"k":{"x":1}}})", ""),
       R"(__metadata__ entry 'k' must be a string, got {"x":1})"},
      {"metadata value nested too deep", make_file(R"({"__metadata__":{"k":[[1]]}})", ""),
       "header nests objects or arrays more than 3 deep"},
      {"long malformed value is abbreviated",
       make_file(R"({"a":{"dtype":"F32","shape":[-1)" + repeat(",-1", 99) + R"(],"data_offsets":[0,8]}})", eight_bytes),
       "shape must be an array of non-negative integers, got [-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-..."},
  };
}

TEST(SafetensorsCorrupt, EveryViolationIsRefusedWithATellingMessage) {
  for (const CorruptFile& corrupt : corrupt_files()) {
    SCOPED_TRACE(corrupt.what);
    EXPECT_ERROR_CONTAINS(read_everything(corrupt.bytes), std::string(corrupt.message));
  }
}

// The sizes in a header are checked against the file before anything is sized from them: a
// 70-byte file that claims a 2^40-byte tensor is refused with mha::Error (an allocation first
// would throw std::bad_alloc, or abort under the sanitizers' allocation limit).
TEST(SafetensorsCorrupt, ClaimedSizesAreCheckedBeforeAllocating) {
  const std::vector<std::byte> file =
      make_file(R"({"a":{"dtype":"U8","shape":[1099511627776],"data_offsets":[0,1099511627776]}})", "");
  try {
    (void)st::parse(file);
    ADD_FAILURE() << "accepted";
  } catch (const mha::Error& e) {
    EXPECT_NE(std::string(e.what()).find("run past the end of the 0-byte data buffer"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << e.what() << " instead of mha::Error";
  }
  // The header's own size is checked against the file the same way.
  EXPECT_ERROR_CONTAINS(st::parse(with_header_size(st::kMaxHeaderSize, "{}")), "runs past the end of the file");
}

// A valid header nests three levels (header, entry, shape); the error messages of a deep or long
// value stay short.
TEST(SafetensorsCorrupt, ErrorMessagesAbbreviateLongValues) {
  const std::string message = error_of([] {
    (void)st::parse(make_file(R"({"a":{"dtype":[")" + std::string(5000, 'x') + R"("],"shape":[2],"data_offsets":[0,8]}})",
                              std::string(8, '\0')));
  });
  EXPECT_NE(message.find(R"(dtype must be a string, got ["xxxx)"), std::string::npos) << message;
  EXPECT_LT(message.size(), 200u) << message;
}

TEST(SafetensorsCorrupt, TrailingWhitespaceInHeaderIsAccepted) {
  const st::File file = st::parse(make_file("{}  \n\t ", ""));
  EXPECT_TRUE(file.tensors.empty());
}

// -------------------------------------------------------------------------------------------
// F16 / BF16 conversions

uint16_t to_f16_bits(double value) {
  return u16_at(st::from_tensor(mha::Tensor<double>({1}, {value}), DType::F16), 0);
}
uint16_t to_bf16_bits(double value) {
  return u16_at(st::from_tensor(mha::Tensor<double>({1}, {value}), DType::BF16), 0);
}
double from_16_bits(uint16_t bits, DType dtype) {
  st::TensorData data{dtype, {1}, std::vector<std::byte>(2)};
  std::memcpy(data.bytes.data(), &bits, 2);
  return st::to_tensor<double>(data, "x")[0];
}

TEST(SafetensorsHalf, F16EncodesEdgeCases) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(to_f16_bits(1.0), 0x3C00);
  EXPECT_EQ(to_f16_bits(-2.5), 0xC100);
  EXPECT_EQ(to_f16_bits(0.0), 0x0000);
  EXPECT_EQ(to_f16_bits(-0.0), 0x8000);
  EXPECT_EQ(to_f16_bits(65504.0), 0x7BFF);             // largest finite
  EXPECT_EQ(to_f16_bits(65519.99), 0x7BFF);            // just below the halfway point to 65536
  EXPECT_EQ(to_f16_bits(65520.0), 0x7C00);             // halfway: ties to even = inf
  EXPECT_EQ(to_f16_bits(1e10), 0x7C00);
  EXPECT_EQ(to_f16_bits(-inf), 0xFC00);
  EXPECT_EQ(to_f16_bits(std::ldexp(1.0, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(to_f16_bits(std::ldexp(1.0, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(to_f16_bits(std::ldexp(1023.0, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(to_f16_bits(std::ldexp(1.0, -25)), 0x0000);  // tie between 0 and 2^-24: even is 0
  EXPECT_EQ(to_f16_bits(std::ldexp(1.0, -25) * 1.000001), 0x0001);
  EXPECT_EQ(to_f16_bits(std::ldexp(3.0, -25)), 0x0002);  // tie between 1 and 2 ulps: even is 2
  EXPECT_EQ(to_f16_bits(std::ldexp(1.0, -1074)), 0x0000);  // double subnormal underflows
  EXPECT_EQ(to_f16_bits(1.0 + std::ldexp(1.0, -11)), 0x3C00);      // tie: down to even mantissa 0
  EXPECT_EQ(to_f16_bits(1.0 + std::ldexp(3.0, -11)), 0x3C02);      // tie: up to even mantissa 2
  EXPECT_EQ(to_f16_bits(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)), 0x3C01);  // past the tie
  const uint16_t nan = to_f16_bits(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(SafetensorsHalf, F16FromFloatRoundsOnce) {
  // 1 + 2^-11 + 2^-23 is a float just above an F16 tie; it must round up, not to even.
  const float value = 1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23);
  EXPECT_EQ(u16_at(st::from_tensor(mha::Tensor<float>({1}, {value}), DType::F16), 0), 0x3C01);
}

TEST(SafetensorsHalf, F16DecodesEdgeCasesExactly) {
  EXPECT_EQ(from_16_bits(0x3C00, DType::F16), 1.0);
  EXPECT_EQ(from_16_bits(0xC100, DType::F16), -2.5);
  EXPECT_EQ(from_16_bits(0x7BFF, DType::F16), 65504.0);
  EXPECT_EQ(from_16_bits(0x0001, DType::F16), std::ldexp(1.0, -24));
  EXPECT_EQ(from_16_bits(0x8001, DType::F16), -std::ldexp(1.0, -24));
  EXPECT_EQ(from_16_bits(0x03FF, DType::F16), std::ldexp(1023.0, -24));
  EXPECT_EQ(from_16_bits(0x0200, DType::F16), std::ldexp(1.0, -15));
  EXPECT_EQ(from_16_bits(0x0400, DType::F16), std::ldexp(1.0, -14));
  EXPECT_EQ(from_16_bits(0x7C00, DType::F16), std::numeric_limits<double>::infinity());
  EXPECT_EQ(from_16_bits(0xFC00, DType::F16), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(from_16_bits(0x7E00, DType::F16)));
  EXPECT_TRUE(std::isnan(from_16_bits(0x7C01, DType::F16)));  // signalling payload is still NaN
  EXPECT_TRUE(std::signbit(from_16_bits(0x8000, DType::F16)));
}

TEST(SafetensorsHalf, F16EveryFiniteValueRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0) continue;  // NaNs
    const auto half = static_cast<uint16_t>(bits);
    ASSERT_EQ(to_f16_bits(from_16_bits(half, DType::F16)), half) << std::hex << bits;
  }
}

TEST(SafetensorsHalf, BF16EncodesAndDecodesEdgeCases) {
  EXPECT_EQ(to_bf16_bits(1.0), 0x3F80);
  EXPECT_EQ(to_bf16_bits(-2.5), 0xC020);
  EXPECT_EQ(to_bf16_bits(1.0 + std::ldexp(1.0, -8)), 0x3F80);   // tie: down to even
  EXPECT_EQ(to_bf16_bits(1.0 + std::ldexp(3.0, -8)), 0x3F82);   // tie: up to even
  EXPECT_EQ(to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bf16
  EXPECT_EQ(to_bf16_bits(std::ldexp(1.0, -133)), 0x0001);       // smallest bf16 subnormal
  EXPECT_EQ(to_bf16_bits(std::ldexp(1.0, -149)), 0x0000);       // far below it
  EXPECT_EQ(to_bf16_bits(-0.0), 0x8000);
  const uint16_t nan = to_bf16_bits(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0);

  EXPECT_EQ(from_16_bits(0x3F80, DType::BF16), 1.0);
  EXPECT_EQ(from_16_bits(0x7F7F, DType::BF16), std::ldexp(255.0, 120));  // largest finite
  EXPECT_EQ(from_16_bits(0x0001, DType::BF16), std::ldexp(1.0, -133));
  EXPECT_EQ(from_16_bits(0xFF80, DType::BF16), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(from_16_bits(0x7FC0, DType::BF16)));
}

// -------------------------------------------------------------------------------------------
// Typed conversions

TEST(SafetensorsConvert, DefaultDTypes) {
  EXPECT_EQ(st::from_tensor(mha::Tensor<float>({1})).dtype, DType::F32);
  EXPECT_EQ(st::from_tensor(mha::Tensor<double>({1})).dtype, DType::F64);
  EXPECT_EQ(st::from_tensor(mha::Tensor<bool>({1})).dtype, DType::BOOL);
  EXPECT_EQ(st::from_tensor(mha::Tensor<int64_t>({1})).dtype, DType::I64);
  EXPECT_EQ(st::from_tensor(mha::Tensor<int32_t>({1})).dtype, DType::I32);
  EXPECT_EQ(st::from_tensor(mha::Tensor<mha::bfloat16>({1})).dtype, DType::BF16);
  EXPECT_EQ(st::from_tensor(mha::Tensor<mha::float16>({1})).dtype, DType::F16);
}

// bfloat16 and float16 tensors read and write their own dtype as the bits they are (a signaling
// NaN included), and convert to and from every other dtype rounding once.
TEST(SafetensorsConvert, HalfTensorsAsTheyAre) {
  const mha::Tensor<mha::bfloat16> bf({4}, {mha::bfloat16{0x3F81}, mha::bfloat16{0x7F81}, mha::bfloat16{0x8000},
                                            mha::bfloat16{0x0001}});
  const st::TensorData stored = st::from_tensor(bf);
  ASSERT_EQ(stored.bytes.size(), 8u);
  const mha::Tensor<mha::bfloat16> back = st::to_tensor<mha::bfloat16>(stored, "x");
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(back[i].bits, bf[i].bits) << i;
  const mha::Tensor<mha::float16> f16({2}, {mha::float16{0x3C01}, mha::float16{0x7C01}});
  const mha::Tensor<mha::float16> f16_back = st::to_tensor<mha::float16>(st::from_tensor(f16), "x");
  EXPECT_EQ(f16_back[0].bits, 0x3C01);
  EXPECT_EQ(f16_back[1].bits, 0x7C01);
  // Across dtypes: F64 → bfloat16 rounds once from the double; bfloat16 → F32 and F16 → bfloat16.
  const st::TensorData wide = st::from_tensor(mha::Tensor<double>({1}, {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)}));
  EXPECT_EQ(st::to_tensor<mha::bfloat16>(wide, "x")[0].bits, 0x3F81);
  EXPECT_EQ(st::to_tensor<float>(stored, "x")[0], 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(st::to_tensor<mha::bfloat16>(st::from_tensor(f16), "x")[0].bits, 0x3F80);  // 1 + 2⁻¹⁰ → 1
  EXPECT_EQ(st::from_tensor(bf, DType::F32).dtype, DType::F32);
  EXPECT_EQ(st::to_tensor<float>(st::from_tensor(bf, DType::F32), "x")[0], 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(st::to_tensor<mha::bfloat16>(st::from_tensor(mha::Tensor<int64_t>({1}, {257})), "x")[0].bits, 0x4380);
  EXPECT_TRUE(mha::testing::throws_error([&] { st::to_tensor<int64_t>(stored, "x"); }, {"element 0", "does not fit", "int64"}));
}

TEST(SafetensorsConvert, AcrossDTypes) {
  const st::TensorData i64 = st::from_tensor(mha::Tensor<int64_t>({2}, {(int64_t{1} << 53) + 1, -4}));
  EXPECT_EQ(st::to_tensor<double>(i64, "x")[0], 9007199254740992.0);  // rounds as static_cast
  const st::TensorData small = st::from_tensor(mha::Tensor<int64_t>({2}, {-4, 7}));
  EXPECT_EQ(st::to_tensor<int32_t>(small, "x")[0], -4);
  EXPECT_EQ(st::to_tensor<float>(small, "x")[1], 7.0f);
  const st::TensorData flags = st::from_tensor(mha::Tensor<bool>({2}, {true, false}));
  EXPECT_EQ(st::to_tensor<float>(flags, "x")[0], 1.0f);
  EXPECT_EQ(st::to_tensor<int64_t>(flags, "x")[1], 0);
  const st::TensorData whole = st::from_tensor(mha::Tensor<double>({2}, {3.0, -0.0}));
  EXPECT_EQ(st::to_tensor<int32_t>(whole, "x")[0], 3);
  EXPECT_EQ(st::to_tensor<int64_t>(whole, "x")[1], 0);
  const st::TensorData mask = st::from_tensor(mha::Tensor<double>({2}, {1.0, -0.0}));
  EXPECT_EQ(values_of(st::to_tensor<bool>(mask, "x")), (std::vector<bool>{true, false}));
  const st::TensorData narrowed = st::from_tensor(mha::Tensor<double>({1}, {0.1}), DType::F32);
  EXPECT_EQ(st::to_tensor<float>(narrowed, "x")[0], 0.1f);
}

TEST(SafetensorsConvert, RefusesValuesThatDoNotFit) {
  const st::TensorData big = st::from_tensor(mha::Tensor<int64_t>({2}, {1, int64_t{1} << 40}));
  EXPECT_ERROR_CONTAINS(st::to_tensor<int32_t>(big, "ids"),
                        "tensor 'ids': element 1 (1099511627776) of I64 does not fit int32");
  const st::TensorData half = st::from_tensor(mha::Tensor<float>({1}, {2.5f}));
  EXPECT_ERROR_CONTAINS(st::to_tensor<int64_t>(half, "w"), "element 0 (2.5) of F32 does not fit int64");
  const st::TensorData nan = st::from_tensor(mha::Tensor<double>({1}, {std::nan("")}));
  EXPECT_ERROR_CONTAINS(st::to_tensor<int64_t>(nan, "w"), "does not fit int64");
  const st::TensorData two = st::from_tensor(mha::Tensor<int64_t>({1}, {2}), DType::U8);
  EXPECT_ERROR_CONTAINS(st::to_tensor<bool>(two, "mask"), "element 0 (2) of U8 does not fit bool");
  EXPECT_ERROR_CONTAINS(st::from_tensor(mha::Tensor<int64_t>({2}, {0, 300}), DType::I8),
                        "element 1 (300) does not fit I8");
  EXPECT_ERROR_CONTAINS(st::from_tensor(mha::Tensor<int32_t>({1}, {-1}), DType::U8), "does not fit U8");
  EXPECT_ERROR_CONTAINS(st::from_tensor(mha::Tensor<float>({1}, {0.5f}), DType::BOOL), "does not fit BOOL");
  EXPECT_ERROR_CONTAINS(st::from_tensor(mha::Tensor<float>()), "undefined");
}

TEST(SafetensorsConvert, ChecksTensorDataSize) {
  st::TensorData wrong{DType::F32, {2, 3}, std::vector<std::byte>(12)};
  EXPECT_ERROR_CONTAINS(st::to_tensor<float>(wrong, "q"), "tensor 'q': has 12 bytes but shape [2, 3] of F32 needs 24");
  st::File file;
  file.tensors["q"] = wrong;
  EXPECT_ERROR_CONTAINS(st::serialize(file), "tensor 'q': has 12 bytes but shape [2, 3] of F32 needs 24");
  file.tensors.clear();
  file.tensors["__metadata__"] = st::from_tensor(mha::Tensor<float>({1}));
  EXPECT_ERROR_CONTAINS(st::serialize(file), "reserved");
  file.tensors.clear();
  file.tensors["\xff"] = st::from_tensor(mha::Tensor<float>({1}));
  EXPECT_ERROR_CONTAINS(st::serialize(file), "valid UTF-8");
}

TEST(SafetensorsRequire, FindsOrListsWhatIsThere) {
  st::File file;
  file.tensors["b"] = st::from_tensor(mha::Tensor<float>({1}));
  file.tensors["a"] = st::from_tensor(mha::Tensor<float>({1}));
  EXPECT_EQ(&st::require(file, "a", "load"), &file.tensors.at("a"));
  EXPECT_ERROR_CONTAINS(st::require(file, "w", "Linear::load"), "Linear::load: no tensor named 'w' (have: a, b)");
}

// -------------------------------------------------------------------------------------------
// Files on disk

TEST(SafetensorsFiles, SaveThenLoad) {
  TempDir dir;
  st::File file;
  file.tensors["x"] = st::from_tensor(mha::Tensor<float>({2}, {1.0f, 2.0f}));
  const std::string path = (dir.path() / "model.safetensors").string();
  st::save(file, path);
  EXPECT_EQ(read_file(path), st::serialize(file));
  expect_same(st::load(path).tensors.at("x"), file.tensors.at("x"), "x");
}

TEST(SafetensorsFiles, SaveReplacesAnExistingFile) {
  TempDir dir;
  const fs::path path = dir.path() / "model.safetensors";
  write_file(path, "old contents that are not a safetensors file");
  st::File file;
  file.tensors["y"] = st::from_tensor(mha::Tensor<int32_t>({3}, {1, 2, 3}));
  st::save(file, path.string());
  EXPECT_EQ(read_file(path), st::serialize(file));
  // Only the target is left: the temporary file was renamed, not copied.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
}

TEST(SafetensorsFiles, SaveIntoMissingDirectoryThrowsAndLeavesNothing) {
  TempDir dir;
  const fs::path path = dir.path() / "no_such_dir" / "model.safetensors";
  st::File file;
  file.tensors["x"] = st::from_tensor(mha::Tensor<float>({1}));
  EXPECT_ERROR_CONTAINS(st::save(file, path.string()), path.string());
  EXPECT_FALSE(fs::exists(path.parent_path()));
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(SafetensorsFiles, FailedRenameRemovesTheTemporaryFile) {
  TempDir dir;
  // Renaming a file over a non-empty directory fails after the temporary file was written.
  const fs::path path = dir.path() / "taken";
  fs::create_directories(path / "inside");
  st::File file;
  file.tensors["x"] = st::from_tensor(mha::Tensor<float>({1}));
  EXPECT_ERROR_CONTAINS(st::save(file, path.string()), path.string());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
}

TEST(SafetensorsFiles, InvalidFileIsNotWritten) {
  TempDir dir;
  const fs::path path = dir.path() / "model.safetensors";
  st::File file;
  file.tensors["x"] = st::TensorData{DType::F32, {2}, std::vector<std::byte>(3)};
  EXPECT_THROW(st::save(file, path.string()), mha::Error);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// A FIFO (or a device) is refused rather than opened: opening a FIFO blocks until some other
// process writes to it, so a reader would hang.
TEST(SafetensorsFiles, LoadRefusesWhatIsNotARegularFile) {
  TempDir dir;
  const fs::path fifo = dir.path() / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_ERROR_CONTAINS(st::load(fifo.string()), "cannot load '" + fifo.string() + "': not a regular file");
  EXPECT_ERROR_CONTAINS(st::load("/dev/null"), "not a regular file");
}

TEST(SafetensorsFiles, LoadErrorsNameThePath) {
  TempDir dir;
  const std::string missing = (dir.path() / "missing.safetensors").string();
  EXPECT_ERROR_CONTAINS(st::load(missing), "cannot load '" + missing + "'");
  EXPECT_ERROR_CONTAINS(st::load(dir.path().string()), "is a directory");
  const fs::path corrupt = dir.path() / "corrupt.safetensors";
  write_file(corrupt, "abc");
  EXPECT_ERROR_CONTAINS(st::load(corrupt.string()), "too short");
  EXPECT_ERROR_CONTAINS(st::load(corrupt.string()), corrupt.string());
}

// -------------------------------------------------------------------------------------------
// Text from the file (names, metadata, the JSON parser's own messages) and paths in messages:
// escaped, so a file cannot send escape sequences or broken UTF-8 to the terminal that shows
// the error. Each message must be printable (tests/support/printable.h) and hold the escape.

#define EXPECT_ESCAPED_ERROR(statement, part) \
  EXPECT_TRUE(mha::testing::printable_and_holds(error_of([&] { statement; }), part))

const std::string kF32x1 = R"("dtype":"F32","shape":[1])";

TEST(SafetensorsUntrustedText, TensorNamesInMessagesAreEscaped) {
  // A name breaks a rule: a duplicate, an unknown dtype, a field that is not one.
  EXPECT_ESCAPED_ERROR(
      st::parse(make_file(R"({"\u001b[2J":{)" + kF32x1 + R"(,"data_offsets":[0,4]},"\u001b[2J":{)" + kF32x1 +
                              R"(,"data_offsets":[4,8]}})",
                          std::string(8, '\0'))),
      "duplicate key '\\x1b[2J' in the header");
  EXPECT_ESCAPED_ERROR(
      st::parse(make_file(R"({"\u001b]0;x\u0007":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", "x")),
      "tensor '\\x1b]0;x\\x07': unknown dtype \"F8\"");
  EXPECT_ESCAPED_ERROR(
      st::parse(make_file(R"({"a":{"dtype":"\u009b\u202e","shape":[1],"data_offsets":[0,1]}})", "x")),
      "unknown dtype \"\\u009b\\u202e\"");
  EXPECT_ESCAPED_ERROR(st::parse(make_file(R"({"a":{)" + kF32x1 + R"(,"data_offsets":[0,4],"\u001b[2J":1}})",
                                           std::string(4, '\0'))),
                       "unexpected field '\\x1b[2J'");
  // A tensor whose values do not fit, and a tensor that is not there (the names there are listed).
  const st::File file =
      st::parse(make_file(R"({"\u001b[2J":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"));
  EXPECT_ESCAPED_ERROR(st::to_tensor<bool>(file.tensors.begin()->second, file.tensors.begin()->first),
                       "tensor '\\x1b[2J': BOOL element 1 is stored as byte 2");
  EXPECT_ESCAPED_ERROR(st::require(file, "query\x1b]0;x\x07", "inputs"),
                       "inputs: no tensor named 'query\\x1b]0;x\\x07' (have: \\x1b[2J)");
}

TEST(SafetensorsUntrustedText, MetadataInMessagesIsEscaped) {
  EXPECT_ESCAPED_ERROR(st::parse(make_file(R"({"__metadata__":{"\u001b[2J":1}})", "")),
                       "__metadata__ entry '\\x1b[2J' must be a string, got 1");
  EXPECT_ESCAPED_ERROR(st::parse(make_file(R"({"__metadata__":{"k":["\u009b\u2028"]}})", "")),
                       "__metadata__ entry 'k' must be a string, got [\"\\u009b\\u2028\"]");
  EXPECT_ESCAPED_ERROR(
      st::parse(make_file(R"({"__metadata__":{"\u001b]0;x\u0007":"1","\u001b]0;x\u0007":"2"}})", "")),
      "duplicate key '\\x1b]0;x\\x07' inside '__metadata__'");
}

// nlohmann's parse errors quote the bytes last read, raw: a header that is not UTF-8 put them
// into the message as they were.
TEST(SafetensorsUntrustedText, JsonParseErrorsAreEscaped) {
  EXPECT_ESCAPED_ERROR(st::parse(make_file("{\"a\xff\":1}", "")), "last read: '\"a\\xff'");
  EXPECT_ESCAPED_ERROR(st::parse(make_file("{\"a\":\"\xe2\x82\"}", "")), "last read: '\"\\xe2\\x82");
  EXPECT_ESCAPED_ERROR(st::parse(make_file("{\"\xc0\x80\":1}", "")), "last read: '\"\\xc0");
  EXPECT_ESCAPED_ERROR(st::parse(make_file("{\"\x1b[2J\":1}", "")), "header is not valid JSON");
}

TEST(SafetensorsUntrustedText, PathsInMessagesAreEscaped) {
  TempDir dir;
  const std::string name = "\x1b]0;x\x07\xff\x1b[2J.safetensors";
  const std::string shown = dir.path().string() + "/\\x1b]0;x\\x07\\xff\\x1b[2J.safetensors";
  EXPECT_ESCAPED_ERROR(st::load((dir.path() / name).string()), "cannot load '" + shown + "'");
  write_file(dir.path() / name, "abc");
  EXPECT_ESCAPED_ERROR(st::load((dir.path() / name).string()), "(in '" + shown + "')");
  EXPECT_ESCAPED_ERROR(st::MappedFile mapped((dir.path() / name).string()), "(in '" + shown + "')");
  st::File file;
  file.tensors["x"] = st::from_tensor(mha::Tensor<float>({1}));
  EXPECT_ESCAPED_ERROR(st::save(file, (dir.path() / ("d\x1b[2J") / "out.safetensors").string()),
                       dir.path().string() + "/d\\x1b[2J/out.safetensors");
}

}  // namespace
