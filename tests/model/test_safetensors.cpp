// safetensors: bit-exact round trips of every dtype, a file laid out byte for byte as
// Hugging Face's writer lays it out, every kind of malformed file (each an mmsp::Error
// with the expected text), atomic saves, and a deterministic mutation fuzz of the reader.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "mmsp/core/check.h"
#include "mmsp/hf/safetensors.h"
#include "scratch_dir.h"

namespace mmsp::model {
namespace {

using ::testing::HasSubstr;

std::string temp_dir() { return mmsp::test::scratch_dir("safetensors_"); }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A file exactly as the format says: length, header text, data.
std::string file_bytes(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

std::string error_of(const std::string& bytes) {
  return test::error_of([&] { hf::parse_safetensors(bytes.data(), bytes.size(), "test.safetensors"); });
}

// Same data on both sides, element for element and bit for bit.
void expect_identical(const at::Tensor& a, const at::Tensor& b, const std::string& name) {
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << name;
  ASSERT_EQ(a.sizes(), b.sizes()) << name;
  const at::Tensor ac = a.contiguous();
  const at::Tensor bc = b.contiguous();
  ASSERT_EQ(ac.nbytes(), bc.nbytes()) << name;
  if (ac.nbytes() > 0) { EXPECT_EQ(std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()), 0) << name; }
}

// Random bit patterns (NaN payloads, denormals, negative zero) for every byte of the tensor.
at::Tensor random_bits(at::ScalarType type, at::IntArrayRef shape, std::mt19937& rng) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i)
    p[i] = static_cast<unsigned char>(type == at::kBool ? rng() % 2 : rng() % 256);
  return t;
}

const std::vector<at::ScalarType> kAllTypes = {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong,
                                               at::kInt,    at::kShort, at::kChar, at::kByte,     at::kBool};

// ---------- round trips ----------

TEST(Safetensors, RoundTripEveryDtypeAndShapeBitExact) {
  std::mt19937 rng(7);
  std::map<std::string, at::Tensor> tensors;
  const std::vector<std::vector<int64_t>> shapes = {{3, 5}, {}, {0}, {2, 0, 3}, {7}, {1, 1, 2, 3}};
  for (at::ScalarType type : kAllTypes)
    for (size_t s = 0; s < shapes.size(); ++s)
      tensors[hf::safetensors_dtype_name(type) + ".shape" + std::to_string(s)] = random_bits(type, shapes[s], rng);
  const std::string dir = temp_dir();
  const std::string path = dir + "/all.safetensors";
  hf::save_safetensors(path, tensors);
  const auto loaded = hf::load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, t] : tensors) expect_identical(loaded.at(name), t, name);
  // The in-memory reader agrees with the file reader.
  const std::string bytes = read_file(path);
  const auto parsed = hf::parse_safetensors(bytes.data(), bytes.size());
  for (const auto& [name, t] : tensors) expect_identical(parsed.at(name), t, name);
  EXPECT_EQ(hf::serialize_safetensors(tensors), bytes);
}

TEST(Safetensors, DtypeNamesMapBothWays) {
  const std::vector<std::string> names = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"};
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(hf::safetensors_dtype_name(kAllTypes[i]), names[i]);
    EXPECT_EQ(hf::safetensors_scalar_type(names[i]), kAllTypes[i]);
  }
  EXPECT_THROW(hf::safetensors_scalar_type("F8_E4M3"), Error);
  EXPECT_THROW(hf::safetensors_dtype_name(at::kComplexFloat), Error);
}

TEST(Safetensors, NonContiguousAndViewsAreSavedByValue) {
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  const std::map<std::string, at::Tensor> tensors = {{"t", base.t()}, {"s", base.narrow(1, 2, 3)}};
  const std::string bytes = hf::serialize_safetensors(tensors);
  const auto loaded = hf::parse_safetensors(bytes.data(), bytes.size());
  EXPECT_TRUE(at::equal(loaded.at("t"), base.t()));
  EXPECT_TRUE(at::equal(loaded.at("s"), base.narrow(1, 2, 3)));
  EXPECT_TRUE(loaded.at("t").is_contiguous());
}

TEST(Safetensors, MetadataAndHeaderInspection) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/meta.safetensors";
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "1200"}, {"note", "ünïcödé \"quoted\"\n"}};
  hf::save_safetensors(path, {{"w", at::ones({2, 3}, at::kBFloat16)}, {"b", at::zeros({3})}}, metadata);
  const hf::SafetensorsHeader h = hf::read_safetensors_header(path);
  EXPECT_EQ(h.metadata, metadata);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ((8 + h.header_bytes) % 8, 0u) << "data must start 8-byte aligned";
  EXPECT_EQ(h.data_bytes, 2u * 3 * 2 + 3 * 4);
  const hf::SafetensorsEntry& w = h.tensors.at("w");
  EXPECT_EQ(w.dtype, "BF16");
  EXPECT_EQ(w.scalar_type, at::kBFloat16);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  // F32 is wider than BF16, so Hugging Face's layout puts "b" first.
  EXPECT_EQ(h.tensors.at("b").data_begin, 0u);
  EXPECT_EQ(w.data_begin, 12u);
  EXPECT_EQ(w.data_end, 24u);
}

TEST(Safetensors, EmptyFileHasNoTensors) {
  const std::string bytes = hf::serialize_safetensors({});
  EXPECT_EQ(bytes, le64(8) + "{}      ");
  EXPECT_TRUE(hf::parse_safetensors(bytes.data(), bytes.size()).empty());
}

// ---------- the format as Python's safetensors writes it ----------

// What `safetensors.torch.save_file({"b": tensor([1., 2.]), "a": tensor([7]),
// "c": tensor([1, 2, 3], dtype=uint8), "flag": tensor(True)}, f, {"format": "pt"})` writes:
// serde_json compact header, __metadata__ first, tensors ordered by dtype (widest first)
// then name, data offsets relative to the end of the header, header padded with spaces.
std::string python_style_file() {
  std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"c\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]},"
      "\"flag\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[19,20]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string data;
  data += le64(7);
  const float b[2] = {1.0f, 2.0f};
  data.append(reinterpret_cast<const char*>(b), sizeof b);
  data += std::string("\x01\x02\x03", 3);
  data += std::string("\x01", 1);
  return file_bytes(header, data);
}

TEST(Safetensors, ReadsTheBytesPythonWrites) {
  const std::string bytes = python_style_file();
  ASSERT_EQ((bytes.size() - 20) % 8, 0u);
  const auto t = hf::parse_safetensors(bytes.data(), bytes.size());
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t.at("a").scalar_type(), at::kLong);
  EXPECT_EQ(t.at("a").item<int64_t>(), 7);
  EXPECT_TRUE(at::equal(t.at("b"), at::tensor({1.0f, 2.0f})));
  EXPECT_TRUE(at::equal(t.at("c"), at::tensor({1, 2, 3}, at::kByte)));
  EXPECT_EQ(t.at("flag").dim(), 0);
  EXPECT_TRUE(t.at("flag").item<bool>());
  const hf::SafetensorsHeader h = hf::parse_safetensors_header(bytes.data(), bytes.size());
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(Safetensors, WritesTheBytesPythonWrites) {
  const std::map<std::string, at::Tensor> tensors = {{"b", at::tensor({1.0f, 2.0f})},
                                                     {"a", at::tensor({int64_t{7}})},
                                                     {"c", at::tensor({1, 2, 3}, at::kByte)},
                                                     {"flag", at::scalar_tensor(true, at::kBool)}};
  EXPECT_EQ(hf::serialize_safetensors(tensors, {{"format", "pt"}}), python_style_file());
}

TEST(Safetensors, ReadsAnyKeyOrderWhitespaceAndUnpaddedHeaders) {
  // Other writers order keys differently and need not pad; the format allows both.
  const std::string header =
      "{ \"y\" : {\"data_offsets\": [4, 6], \"shape\": [1], \"dtype\": \"F16\"},\n"
      "  \"x\" : {\"shape\": [1], \"dtype\": \"I32\", \"data_offsets\": [0, 4]} }";
  const std::string bytes = file_bytes(header, std::string("\x05\0\0\0\x00\x3c", 6));
  const auto t = hf::parse_safetensors(bytes.data(), bytes.size());
  EXPECT_EQ(t.at("x").item<int32_t>(), 5);
  EXPECT_EQ(t.at("y").item<float>(), 1.0f);
}

TEST(Safetensors, ZeroSizeTensorsMayShareAnOffset) {
  const std::string header =
      "{\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
      "\"e2\":{\"dtype\":\"I8\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
      "\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}";
  const std::string bytes = file_bytes(header, std::string(4, '\0'));
  const auto t = hf::parse_safetensors(bytes.data(), bytes.size());
  EXPECT_EQ(t.at("e2").sizes(), (std::vector<int64_t>{3, 0}));
}

// ---------- malformed files ----------

std::string f32_entry(const std::string& name, const std::string& shape, uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(begin) +
         "," + std::to_string(end) + "]}";
}

TEST(SafetensorsMalformed, ShorterThanTheLengthPrefix) {
  EXPECT_THAT(error_of(std::string("\x08\0\0", 3)), HasSubstr("3 bytes, shorter than the 8-byte header length"));
  EXPECT_THAT(error_of(""), HasSubstr("0 bytes, shorter"));
}

TEST(SafetensorsMalformed, HeaderLengthBeyondTheFile) {
  const std::string bytes = le64(1000) + "{}";
  EXPECT_THAT(error_of(bytes), HasSubstr("header length 1000 exceeds the 2 bytes that follow it"));
  EXPECT_THAT(error_of(le64(~uint64_t{0}) + "{}"), HasSubstr("header length 18446744073709551615 exceeds"));
}

TEST(SafetensorsMalformed, HeaderLengthOverTheLimitIsRefusedBeforeReading) {
  // A sparse 200 MB file: the reader must refuse its 150 MB header without reading it.
  const std::string path = temp_dir() + "/huge.safetensors";
  write_file(path, le64(150'000'000) + "{}");
  ASSERT_EQ(::truncate(path.c_str(), 200'000'000), 0);
  try {
    hf::read_safetensors_header(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    EXPECT_THAT(e.what(), HasSubstr("header length 150000000 exceeds the 100000000-byte limit"));
  }
}

TEST(SafetensorsMalformed, TruncatedData) {
  const std::string full = python_style_file();
  const std::string cut = full.substr(0, full.size() - 3);
  EXPECT_THAT(error_of(cut), HasSubstr("tensor \"c\": data_offsets [16, 19] run past the data section, which "
                                       "holds 17 bytes (truncated file?)"));
}

TEST(SafetensorsMalformed, TruncatedFileNamesThePath) {
  const std::string path = temp_dir() + "/cut.safetensors";
  const std::string full = python_style_file();
  write_file(path, full.substr(0, full.size() - 1));
  try {
    hf::load_safetensors(path);
    FAIL() << "expected an error";
  } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr(path + ": tensor \"flag\"")); }
}

TEST(SafetensorsMalformed, MissingFile) {
  try {
    hf::load_safetensors("/nonexistent/dir/w.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr("/nonexistent/dir/w.safetensors: cannot open")); }
  EXPECT_THAT(
      [] {
        try {
          hf::load_safetensors(testing::TempDir());
        } catch (const Error& e) { return std::string(e.what()); }
        return std::string();
      }(),
      HasSubstr("not a regular file"));
}

TEST(SafetensorsMalformed, OverlappingOffsets) {
  const std::string h = "{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("b", "[2]", 4, 12) + "}";
  EXPECT_THAT(error_of(file_bytes(h, std::string(12, '\0'))),
              HasSubstr("tensor \"b\": data_offsets [4, 12] overlap tensor \"a\", which ends at 8"));
  // The same range twice is an overlap too.
  const std::string same = "{" + f32_entry("a", "[1]", 0, 4) + "," + f32_entry("b", "[1]", 0, 4) + "}";
  EXPECT_THAT(error_of(file_bytes(same, std::string(4, '\0'))), HasSubstr("overlap tensor \"a\""));
}

TEST(SafetensorsMalformed, HolesAndTrailingBytes) {
  const std::string h = "{" + f32_entry("a", "[1]", 0, 4) + "," + f32_entry("b", "[1]", 8, 12) + "}";
  EXPECT_THAT(error_of(file_bytes(h, std::string(12, '\0'))),
              HasSubstr("tensor \"b\": data_offsets [8, 12] leave a hole of 4 bytes at data "
                        "offset 4"));
  const std::string start = "{" + f32_entry("a", "[1]", 4, 8) + "}";
  EXPECT_THAT(error_of(file_bytes(start, std::string(8, '\0'))), HasSubstr("leave a hole of 4"));
  const std::string one = "{" + f32_entry("a", "[1]", 0, 4) + "}";
  EXPECT_THAT(error_of(file_bytes(one, std::string(6, '\0'))),
              HasSubstr("the data section holds 6 bytes but its tensors cover only 4 (2 "
                        "trailing bytes)"));
}

TEST(SafetensorsMalformed, SizeMismatch) {
  const std::string h = "{" + f32_entry("w", "[2,2]", 0, 12) + "}";
  EXPECT_THAT(error_of(file_bytes(h, std::string(12, '\0'))),
              HasSubstr("tensor \"w\": data_offsets [0, 12] span 12 bytes but shape [2,2] of "
                        "F32 needs 16"));
}

TEST(SafetensorsMalformed, WrongDtype) {
  const std::string h = "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  EXPECT_THAT(error_of(file_bytes(h, std::string(4, '\0'))),
              HasSubstr("tensor \"w\": dtype \"F33\" is not supported; supported: F64, F32"));
  const std::string fp8 = "{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  EXPECT_THAT(error_of(file_bytes(fp8, std::string(1, '\0'))), HasSubstr("\"F8_E4M3\" is not supported"));
  const std::string num = "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}";
  EXPECT_THAT(error_of(file_bytes(num, std::string(4, '\0'))), HasSubstr("dtype must be a string, got 4"));
}

TEST(SafetensorsMalformed, DuplicateNames) {
  const std::string h = "{" + f32_entry("a", "[1]", 0, 4) + "," + f32_entry("a", "[1]", 4, 8) + "}";
  EXPECT_THAT(error_of(file_bytes(h, std::string(8, '\0'))),
              HasSubstr("has the key \"a\" twice (duplicate tensor name)"));
  const std::string inner = "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  EXPECT_THAT(error_of(file_bytes(inner, std::string(4, '\0'))), HasSubstr("has the key \"dtype\" twice"));
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  EXPECT_THAT(error_of(file_bytes("[1, 2]")), HasSubstr("safetensors header must be a JSON object, got array"));
  EXPECT_THAT(error_of(file_bytes("\"text\"")), HasSubstr("must be a JSON object, got string"));
  EXPECT_THAT(error_of(file_bytes("{\"a\": 3}")),
              HasSubstr("tensor \"a\": entry must be an object {dtype, shape, data_offsets}, got 3"));
}

TEST(SafetensorsMalformed, GarbageJson) {
  EXPECT_THAT(error_of(file_bytes("{\"a\":")), HasSubstr("test.safetensors: safetensors header is not valid JSON"));
  EXPECT_THAT(error_of(file_bytes("not json at all")), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of(file_bytes("{} {}")), HasSubstr("not valid JSON"));
  // nlohmann would stop at a NUL and accept "{}\0garbage"; the reader refuses any NUL.
  EXPECT_THAT(error_of(file_bytes(std::string("{}\0\0", 4))),
              HasSubstr("safetensors header has a NUL byte at byte 2 of 4"));
  EXPECT_THAT(error_of(file_bytes(std::string("{}\0garbage", 10))), HasSubstr("NUL byte"));
  EXPECT_THAT(error_of(file_bytes("")), HasSubstr("not valid JSON"));
}

TEST(SafetensorsMalformed, InvalidUtf8) {
  EXPECT_THAT(error_of(file_bytes("{\"\xff\":1}")), HasSubstr("safetensors header is not valid UTF-8 (byte 2 of 7)"));
  EXPECT_THAT(error_of(file_bytes("{\"\xc0\xaf\":1}")), HasSubstr("not valid UTF-8"));      // overlong
  EXPECT_THAT(error_of(file_bytes("{\"\xed\xa0\x80\":1}")), HasSubstr("not valid UTF-8"));  // surrogate
}

TEST(SafetensorsMalformed, BadShapes) {
  auto with_shape = [](const std::string& shape) {
    return error_of(
        file_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0,4]}}", std::string(4, '\0')));
  };
  EXPECT_THAT(with_shape("[-1]"), HasSubstr("shape must hold integers in [0, 2^63), got [-1]"));
  EXPECT_THAT(with_shape("[1.0]"), HasSubstr("shape must hold integers"));
  EXPECT_THAT(with_shape("[\"1\"]"), HasSubstr("shape must hold integers"));
  EXPECT_THAT(with_shape("[9223372036854775808]"), HasSubstr("shape must hold integers"));
  EXPECT_THAT(with_shape("4"), HasSubstr("shape must be an array of integers >= 0, got 4"));
  EXPECT_THAT(with_shape("[4294967296,4294967296,4294967296]"), HasSubstr("has more than 2^63 elements"));
  // A zero dimension does not excuse the others from fitting LibTorch's int64 sizes.
  EXPECT_THAT(with_shape("[0,4294967296,4294967296]"), HasSubstr("has more than 2^63 elements"));
  EXPECT_THAT(with_shape("[4611686018427387904]"), HasSubstr("needs more than 2^64 bytes"));
  std::string many = "[";
  for (int i = 0; i < 65; ++i) many += i ? ",1" : "1";
  EXPECT_THAT(with_shape(many + "]"), HasSubstr("shape has 65 dimensions; at most 64"));
}

TEST(SafetensorsMalformed, BadOffsetsAndKeys) {
  auto entry = [](const std::string& body) {
    return error_of(file_bytes("{\"w\":{" + body + "}}", std::string(4, '\0')));
  };
  EXPECT_THAT(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]"),
              HasSubstr("data_offsets [4, 0] end before they begin"));
  EXPECT_THAT(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]"),
              HasSubstr("data_offsets must be [begin, end], got [0]"));
  EXPECT_THAT(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]"),
              HasSubstr("data_offsets must hold integers >= 0, got -4"));
  EXPECT_THAT(entry("\"dtype\":\"F32\",\"shape\":[1]"), HasSubstr("missing \"data_offsets\""));
  EXPECT_THAT(entry("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1"),
              HasSubstr("unknown key \"extra\""));
}

TEST(SafetensorsMalformed, BadMetadata) {
  EXPECT_THAT(error_of(file_bytes("{\"__metadata__\":{\"k\":1}}")),
              HasSubstr("__metadata__ \"k\" must be a string, got 1"));
  EXPECT_THAT(error_of(file_bytes("{\"__metadata__\":[]}")),
              HasSubstr("__metadata__ must be an object of strings, got []"));
}

TEST(SafetensorsMalformed, BoolBytesMustBeZeroOrOne) {
  const std::string h = "{\"m\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[0,3]}}";
  EXPECT_THAT(error_of(file_bytes(h, std::string("\x01\x02\x00", 3))),
              HasSubstr("tensor \"m\": BOOL element 1 is byte 2; must be 0 or 1"));
}

TEST(SafetensorsMalformed, DeepNesting) {
  EXPECT_THAT(error_of(file_bytes("{\"a\":[[[[[[1]]]]]]}")), HasSubstr("nests deeper than 4"));
  EXPECT_THAT(error_of(file_bytes(std::string(100000, '[') + std::string(100000, ']'))), HasSubstr("nests deeper"));
}

// ---------- writer ----------

TEST(SafetensorsWrite, RejectsWhatItCannotWriteAndLeavesTheOldFile) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/w.safetensors";
  hf::save_safetensors(path, {{"a", at::ones({2})}});
  const std::string before = read_file(path);
  auto message = [&](const std::map<std::string, at::Tensor>& t) {
    try {
      hf::save_safetensors(path, t);
    } catch (const Error& e) { return std::string(e.what()); }
    return std::string("(no error)");
  };
  EXPECT_THAT(message({{"z", at::ones({2}, at::kComplexFloat)}}),
              HasSubstr("tensor \"z\" has dtype ComplexFloat; supported: F64"));
  EXPECT_THAT(message({{"u", at::Tensor()}}), HasSubstr("tensor \"u\" is undefined"));
  EXPECT_THAT(message({{"__metadata__", at::ones({1})}}), HasSubstr("\"__metadata__\" is reserved"));
  EXPECT_THAT(message({{"s", at::ones({2, 2}).to_sparse()}}), HasSubstr("only dense tensors"));
  EXPECT_THAT(message({{"bad\xff", at::ones({1})}}), HasSubstr("is not valid UTF-8"));
  EXPECT_THAT(message({{"m", at::empty({2}, at::TensorOptions().device(at::kMeta))}}),
              HasSubstr("tensor \"m\" cannot be copied to the CPU"));
  EXPECT_EQ(read_file(path), before);
  EXPECT_FALSE(exists(path + ".tmp"));
}

TEST(SafetensorsWrite, AtomicReplaceLeavesNoTemporary) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/w.safetensors";
  write_file(path + ".tmp", "stale half-written file");
  hf::save_safetensors(path, {{"a", at::arange(5, at::kLong)}});
  EXPECT_FALSE(exists(path + ".tmp"));
  hf::save_safetensors(path, {{"b", at::arange(3, at::kInt)}});
  const auto t = hf::load_safetensors(path);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_TRUE(at::equal(t.at("b"), at::arange(3, at::kInt)));
  try {
    hf::save_safetensors(dir + "/missing/w.safetensors", {{"a", at::ones({1})}});
    FAIL() << "expected an error";
  } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr(dir + "/missing/w.safetensors.tmp: cannot create")); }
}

TEST(SafetensorsWrite, SameInputSameBytes) {
  std::mt19937 rng(3);
  std::map<std::string, at::Tensor> t;
  for (int i = 0; i < 20; ++i)
    t["layer." + std::to_string(i)] = random_bits(kAllTypes[i % kAllTypes.size()], {i % 4 + 1}, rng);
  const std::string a = hf::serialize_safetensors(t, {{"x", "1"}, {"a", "2"}});
  const std::string b = hf::serialize_safetensors(t, {{"a", "2"}, {"x", "1"}});
  EXPECT_EQ(a, b);
  // Every tensor starts at a multiple of its element size (the data section is 8-aligned).
  const hf::SafetensorsHeader h = hf::parse_safetensors_header(a.data(), a.size());
  EXPECT_EQ((8 + h.header_bytes) % 8, 0u);
  for (const auto& [name, e] : h.tensors) EXPECT_EQ(e.data_begin % at::elementSize(e.scalar_type), 0u) << name;
}

// ---------- mutation fuzz ----------

std::string fuzz_seed_file() {
  std::mt19937 rng(11);
  std::map<std::string, at::Tensor> t;
  t["model.embed_tokens.weight"] = random_bits(at::kBFloat16, {4, 3}, rng);
  t["visual.blocks.0.attn.qkv.bias"] = random_bits(at::kFloat, {6}, rng);
  t["mask"] = random_bits(at::kBool, {5}, rng);
  t["ids"] = random_bits(at::kLong, {2}, rng);
  t["empty"] = at::empty({0, 3}, at::kHalf);
  t["scalar"] = random_bits(at::kDouble, {}, rng);
  t["i8"] = random_bits(at::kChar, {3}, rng);
  return hf::serialize_safetensors(t, {{"format", "pt"}});
}

// Each mutant either loads or throws mmsp::Error; nothing else escapes, nothing crashes.
TEST(SafetensorsFuzz, RandomMutationsLoadOrThrowMmspError) {
  const std::string seed = fuzz_seed_file();
  const size_t header_end = 8 + hf::parse_safetensors_header(seed.data(), seed.size()).header_bytes;
  std::mt19937_64 rng(2024);
  int loaded = 0, rejected = 0;
  const int kIterations = 6000;
  for (int it = 0; it < kIterations; ++it) {
    std::string m = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      // Aim most edits at the length prefix and header, where the checks live.
      const size_t span = rng() % 4 == 0 ? m.size() : std::min(m.size(), header_end);
      const size_t pos = rng() % span;
      switch (rng() % 6) {
        case 0:
          m[pos] = static_cast<char>(m[pos] ^ (1 << (rng() % 8)));
          break;
        case 1:
          m[pos] = static_cast<char>(rng() % 256);
          break;
        case 2:
          m.resize(rng() % m.size());
          break;
        case 3:
          m.erase(pos, 1 + rng() % 4);
          break;
        case 4:
          m.insert(pos, 1, "0123456789[]{},:\" -"[rng() % 19]);
          break;
        case 5:
          m[pos] = static_cast<char>("0123456789"[rng() % 10]);
          break;
      }
    }
    try {
      const auto t = hf::parse_safetensors(m.data(), m.size(), "mutant");
      ++loaded;
    } catch (const Error&) { ++rejected; } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": exception other than mmsp::Error: " << e.what();
    }
  }
  EXPECT_EQ(loaded + rejected, kIterations);
  EXPECT_GT(loaded, 0) << "mutations in the data section must still load";
  EXPECT_GT(rejected, kIterations / 2);
}

TEST(SafetensorsFuzz, EveryTruncationOfAFileOnDiskIsRejected) {
  const std::string seed = fuzz_seed_file();
  const std::string path = temp_dir() + "/t.safetensors";
  for (size_t n = 0; n < seed.size(); ++n) {
    write_file(path, seed.substr(0, n));
    try {
      hf::load_safetensors(path);
      FAIL() << "a file cut to " << n << " of " << seed.size() << " bytes loaded";
    } catch (const Error& e) { EXPECT_THAT(e.what(), HasSubstr(path)) << n; }
  }
}

}  // namespace
}  // namespace mmsp::model
