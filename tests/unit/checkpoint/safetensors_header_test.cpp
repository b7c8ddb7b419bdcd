// parse_safetensors_header and parse_safetensors_index on hand-built bytes: each rule.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <span>
#include <string>

#include "checkpoint/safetensors.h"
#include "checkpoint_fixtures.h"
#include "core/error.h"

namespace lily {
namespace {

using test::Contains;
using test::safetensors_bytes;

std::span<const std::byte> as_bytes(const std::string& file) {
  return {reinterpret_cast<const std::byte*>(file.data()), file.size()};
}

ShardHeader parse(const std::string& file) {
  return parse_safetensors_header(as_bytes(file), "t.st");
}

// The InputError message for `file`; a test failure if it is accepted.
std::string header_error(const std::string& file) {
  try {
    parse(file);
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "header accepted";
  return "";
}

// A file whose header is `header` and whose data section is `data_size` zero bytes.
std::string file_with(const std::string& header, size_t data_size = 0) {
  return safetensors_bytes(header, std::string(data_size, '\0'));
}

std::string one_tensor(const std::string& entry, size_t data_size) {
  return file_with(R"({"w":)" + entry + "}", data_size);
}

TEST(SafetensorsHeader, MinimalEmptyHeaderIsAccepted) {
  const ShardHeader header = parse(file_with("{}"));
  EXPECT_TRUE(header.tensors.empty());
  EXPECT_TRUE(header.metadata.empty());
}

TEST(SafetensorsHeader, ValidTensorsAndMetadataAreParsed) {
  const std::string text = R"({"__metadata__":{"format":"mlx"},)"
                           R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},)"
                           R"("a":{"dtype":"U32","shape":[4],"data_offsets":[0,16]},)"
                           R"("s":{"dtype":"F64","shape":[],"data_offsets":[28,36]},)"
                           R"("z":{"dtype":"F32","shape":[0,5],"data_offsets":[36,36]}})";
  const std::string file = file_with(text + "    ", 36);  // padded header is fine
  const ShardHeader header = parse(file);
  EXPECT_EQ(header.metadata.at("format"), "mlx");
  ASSERT_EQ(header.tensors.size(), 4u);
  for (const TensorEntry& entry : header.tensors) {
    EXPECT_LE(entry.file_offset + entry.nbytes, file.size()) << entry.name;
    if (entry.name == "b") {
      EXPECT_EQ(entry.dtype, DType::BF16);
      EXPECT_EQ(entry.shape, (std::vector<uint64_t>{2, 3}));
      EXPECT_EQ(entry.file_offset, 8 + text.size() + 4 + 16);  // absolute
      EXPECT_EQ(entry.nbytes, 12u);
    }
    if (entry.name == "s") {
      EXPECT_EQ(entry.nbytes, 8u);  // a scalar has one element
    }
    if (entry.name == "z") {
      EXPECT_EQ(entry.nbytes, 0u);
    }
  }
}

TEST(SafetensorsHeader, EveryDtypeNameIsKnown) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "F64", "I64", "U64"}) {
    const auto dtype = parse_dtype(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(dtype_name(*dtype), name);
    const std::string size = std::to_string(dtype_size(*dtype));
    EXPECT_EQ(parse(one_tensor(std::string(R"({"dtype":")") + name +
                                   R"(","shape":[1],"data_offsets":[0,)" + size + "]}",
                               dtype_size(*dtype)))
                  .tensors.size(),
              1u)
        << name;
  }
}

TEST(SafetensorsHeader, FileShorterThanTheLengthPrefix) {
  EXPECT_TRUE(Contains(header_error(""), {"t.st: file is 0 bytes", "8-byte header length"}));
  EXPECT_TRUE(Contains(header_error("1234567"), {"file is 7 bytes", "8-byte header length"}));
}

TEST(SafetensorsHeader, HeaderLengthPastTheEnd) {
  EXPECT_TRUE(Contains(header_error(safetensors_bytes("{}", "", 3)),
                       {"t.st: header length 3 runs past the end of the file",
                        "(2 bytes follow the length prefix)"}));
  EXPECT_TRUE(Contains(header_error(safetensors_bytes("{}", "", UINT64_MAX)),
                       {"header length 18446744073709551615 runs past the end"}));
  EXPECT_TRUE(
      Contains(header_error(safetensors_bytes("", "", 1)), {"header length 1 runs past the end"}));
}

TEST(SafetensorsHeader, HeaderLengthOverTheCap) {
  // A file just larger than the 100 MiB cap, mapped but never touched beyond the prefix.
  const size_t size = static_cast<size_t>(kMaxHeaderBytes) + 4096 + 8;
  void* mapping = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapping, MAP_FAILED);
  const std::string prefix = safetensors_bytes("", "", kMaxHeaderBytes + 1);
  std::memcpy(mapping, prefix.data(), 8);
  try {
    parse_safetensors_header({static_cast<const std::byte*>(mapping), size}, "big.st");
    ADD_FAILURE() << "header accepted";
  } catch (const InputError& error) {
    EXPECT_TRUE(Contains(error.what(), {"big.st: header length 104857601 exceeds the limit of "
                                        "104857600 bytes"}));
  }
  ::munmap(mapping, size);
}

TEST(SafetensorsHeader, HeaderIsNotJson) {
  EXPECT_TRUE(Contains(header_error(file_with("")), {"t.st header: not valid JSON"}));
  EXPECT_TRUE(Contains(header_error(file_with("not json")), {"t.st header: not valid JSON"}));
  EXPECT_TRUE(Contains(header_error(file_with("{} x")), {"t.st header: not valid JSON"}));
  EXPECT_TRUE(Contains(header_error(file_with(R"({"a":1,})")), {"t.st header: not valid JSON"}));
  EXPECT_TRUE(Contains(header_error(file_with(std::string("{\"\xff\":1}"))),
                       {"t.st header: not valid JSON"}));  // invalid UTF-8
  // nlohmann alone would stop at a NUL byte and ignore the rest.
  EXPECT_TRUE(Contains(header_error(file_with(std::string("{}\0", 3))),
                       {"t.st header: not valid JSON: NUL byte at offset 2"}));
  EXPECT_TRUE(Contains(header_error(file_with(std::string("{\"a\":\"\0\"}", 8))),
                       {"t.st header: not valid JSON: NUL byte at offset 6"}));
  EXPECT_TRUE(Contains(header_error(file_with("{} // comment")), {"not valid JSON"}));
}

TEST(SafetensorsHeader, HeaderIsNotAnObject) {
  EXPECT_TRUE(
      Contains(header_error(file_with("[]")), {"t.st: header is array", "expected an object"}));
  EXPECT_TRUE(Contains(header_error(file_with("\"x\"")), {"t.st: header is string"}));
  EXPECT_TRUE(Contains(header_error(file_with("7")), {"t.st: header is number"}));
}

TEST(SafetensorsHeader, DeeplyNestedHeaderIsRefusedWithoutRecursion) {
  EXPECT_TRUE(Contains(header_error(file_with(R"({"w":{"shape":[[1]]}})")),
                       {"t.st header: JSON nesting deeper than 3 levels"}));
  const size_t depth = 200000;  // would overflow a recursive parser's stack
  std::string deep(depth, '[');
  deep += std::string(depth, ']');
  EXPECT_TRUE(Contains(header_error(file_with(deep)), {"JSON nesting deeper than 3 levels"}));
  std::string objects;
  for (size_t i = 0; i < depth; ++i) objects += R"({"a":)";
  EXPECT_TRUE(Contains(header_error(file_with(objects)), {"JSON nesting deeper than 3 levels"}));
}

TEST(SafetensorsHeader, DuplicateTensorName) {
  const std::string entry = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_TRUE(Contains(header_error(file_with(R"({"w":)" + entry + R"(,"w":)" + entry + "}", 1)),
                       {"t.st header: duplicate key \"w\""}));
  EXPECT_TRUE(Contains(header_error(file_with(R"({"w":{"dtype":"U8","dtype":"U8"}})")),
                       {"duplicate key \"dtype\""}));
}

TEST(SafetensorsHeader, MetadataMustBeAnObjectOfStrings) {
  EXPECT_TRUE(Contains(header_error(file_with(R"({"__metadata__":[]})")),
                       {"t.st: __metadata__ is array", "expected an object of strings"}));
  EXPECT_TRUE(Contains(header_error(file_with(R"({"__metadata__":{"format":1}})")),
                       {"t.st: __metadata__.format is number 1, expected a string"}));
  EXPECT_TRUE(Contains(header_error(file_with(R"({"__metadata__":{"k":{}}})")),
                       {"__metadata__.k is object", "expected a string"}));
}

TEST(SafetensorsHeader, TensorEntryMustBeAnObjectWithExactlyTheThreeFields) {
  EXPECT_TRUE(
      Contains(header_error(one_tensor("[]", 0)), {"t.st: tensor w is array",
                                                   "expected an object with dtype, shape and "
                                                   "data_offsets"}));
  EXPECT_TRUE(Contains(header_error(one_tensor("5", 0)), {"t.st: tensor w is number 5"}));
  EXPECT_TRUE(Contains(
      header_error(one_tensor(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1})", 1)),
      {"t.st: tensor w has unexpected field \"x\""}));
  EXPECT_TRUE(Contains(header_error(one_tensor(R"({"shape":[1],"data_offsets":[0,1]})", 1)),
                       {"t.st: tensor w.dtype is missing"}));
  EXPECT_TRUE(Contains(header_error(one_tensor(R"({"dtype":"U8","data_offsets":[0,1]})", 1)),
                       {"t.st: tensor w.shape is missing"}));
  EXPECT_TRUE(Contains(header_error(one_tensor(R"({"dtype":"U8","shape":[1]})", 1)),
                       {"t.st: tensor w.data_offsets is missing"}));
  EXPECT_TRUE(Contains(header_error(file_with(R"({"":{"dtype":"U8","shape":[1],)"
                                              R"("data_offsets":[0,1]}})",
                                              1)),
                       {"t.st: header has a tensor with an empty name"}));
}

TEST(SafetensorsHeader, UnknownOrMistypedDtype) {
  EXPECT_TRUE(
      Contains(header_error(one_tensor(R"({"dtype":"F4","shape":[1],"data_offsets":[0,1]})", 1)),
               {"t.st: tensor w.dtype \"F4\" is not a safetensors dtype"}));
  EXPECT_TRUE(
      Contains(header_error(one_tensor(R"({"dtype":"bf16","shape":[1],"data_offsets":[0,2]})", 2)),
               {"tensor w.dtype \"bf16\" is not a safetensors dtype"}));
  EXPECT_TRUE(
      Contains(header_error(one_tensor(R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})", 1)),
               {"t.st: tensor w.dtype is number 7, expected a string"}));
}

TEST(SafetensorsHeader, BadShapes) {
  auto with_shape = [](const std::string& shape) {
    return header_error(
        one_tensor(R"({"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,1]})", 1));
  };
  EXPECT_TRUE(Contains(with_shape("3"), {"t.st: tensor w.shape is number 3, expected an array"}));
  EXPECT_TRUE(Contains(with_shape("[1,1,1,1,1,1,1,1,1]"),
                       {"t.st: tensor w.shape has rank 9, expected at most 8"}));
  EXPECT_TRUE(Contains(with_shape("[-1]"),
                       {"t.st: tensor w.shape[0] is number -1, expected a non-negative integer"}));
  EXPECT_TRUE(Contains(with_shape("[1,1.5]"),
                       {"tensor w.shape[1] is number 1.5, expected a non-negative integer"}));
  EXPECT_TRUE(Contains(with_shape("[\"1\"]"),
                       {"tensor w.shape[0] is string \"1\", expected a non-negative integer"}));
  EXPECT_TRUE(Contains(with_shape("[100000000000000000000]"),
                       {"tensor w.shape[0] is number", "expected a non-negative integer"}));
}

TEST(SafetensorsHeader, ShapeProductOverflow) {
  EXPECT_TRUE(
      Contains(header_error(one_tensor(R"({"dtype":"U8","shape":[1099511627776,1099511627776],)"
                                       R"("data_offsets":[0,1]})",
                                       1)),
               {"t.st: tensor w.shape array [1099511627776,1099511627776] overflows 64 bits"}));
  // Fits in elements, overflows in bytes (U32: x4).
  EXPECT_TRUE(Contains(header_error(one_tensor(R"({"dtype":"U32","shape":[4611686018427387904],)"
                                               R"("data_offsets":[0,4]})",
                                               4)),
                       {"t.st: tensor w.shape array [4611686018427387904] overflows 64 bits in "
                        "bytes"}));
  // A zero dimension anywhere makes the product 0, never an overflow.
  EXPECT_EQ(parse(one_tensor(R"({"dtype":"U8","shape":[0,18446744073709551615,2],)"
                             R"("data_offsets":[0,0]})",
                             0))
                .tensors.at(0)
                .nbytes,
            0u);
}

TEST(SafetensorsHeader, BadDataOffsets) {
  auto with_offsets = [](const std::string& offsets, size_t data) {
    return header_error(
        one_tensor(R"({"dtype":"U8","shape":[4],"data_offsets":)" + offsets + "}", data));
  };
  EXPECT_TRUE(Contains(with_offsets("4", 4),
                       {"t.st: tensor w.data_offsets is number 4, expected [begin, end]"}));
  EXPECT_TRUE(Contains(with_offsets("[0,4,8]", 8), {"tensor w.data_offsets is array [0,4,8]"}));
  EXPECT_TRUE(Contains(with_offsets("[4]", 4), {"tensor w.data_offsets is array [4]"}));
  EXPECT_TRUE(Contains(with_offsets("[-1,3]", 4),
                       {"tensor w.data_offsets[0] is number -1, expected a non-negative integer"}));
  EXPECT_TRUE(Contains(with_offsets("[0,4.0]", 4),
                       {"tensor w.data_offsets[1] is number 4.0, expected a non-negative"}));
  EXPECT_TRUE(
      Contains(with_offsets("[4,0]", 4), {"t.st: tensor w.data_offsets [4, 0] are reversed"}));
  EXPECT_TRUE(Contains(with_offsets("[0,4]", 3),
                       {"t.st: tensor w.data_offsets [0, 4] run past the data section (3 bytes)"}));
  EXPECT_TRUE(Contains(with_offsets("[18446744073709551611,18446744073709551615]", 4),
                       {"data_offsets [18446744073709551611, 18446744073709551615] run past"}));
  EXPECT_TRUE(
      Contains(with_offsets("[0,3]", 4), {"t.st: tensor w spans 3 bytes, expected 4 for U8 [4]"}));
  EXPECT_TRUE(
      Contains(with_offsets("[0,8]", 8), {"tensor w spans 8 bytes, expected 4 for U8 [4]"}));
}

TEST(SafetensorsHeader, OverlappingTensors) {
  const std::string text = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}})";
  EXPECT_TRUE(Contains(header_error(file_with(text, 8)),
                       {"t.st: tensors a and b overlap in the data section"}));
  const std::string same = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  EXPECT_TRUE(Contains(header_error(file_with(same, 4)), {"overlap in the data section"}));
  // Adjacent ranges and empty tensors inside another's range do not overlap.
  const std::string ok = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                         R"("c":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})";
  EXPECT_EQ(parse(file_with(ok, 8)).tensors.size(), 3u);
}

// ---- model.safetensors.index.json ----

std::string index_error(const std::string& text) {
  try {
    parse_safetensors_index(text, "idx.json");
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "index accepted: " << text;
  return "";
}

TEST(SafetensorsIndex, ValidIndexIsParsed) {
  const auto map = parse_safetensors_index(
      R"({"metadata":{"total_size":10},"weight_map":{"a":"s1.safetensors","b":"s2"}})", "idx.json");
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(map.at("a"), "s1.safetensors");
  EXPECT_EQ(map.at("b"), "s2");
}

TEST(SafetensorsIndex, StructuralErrors) {
  EXPECT_TRUE(Contains(index_error(""), {"idx.json: not valid JSON"}));
  EXPECT_TRUE(Contains(index_error("[]"), {"idx.json is array [], expected an object"}));
  EXPECT_TRUE(Contains(index_error("{}"), {"idx.json.weight_map is missing"}));
  EXPECT_TRUE(Contains(index_error(R"({"weight_map":[]})"),
                       {"idx.json.weight_map is array", "expected an object of tensor name"}));
  EXPECT_TRUE(
      Contains(index_error(R"({"weight_map":{}})"), {"idx.json.weight_map names no tensors"}));
  EXPECT_TRUE(Contains(index_error(R"({"weight_map":{"a":3}})"),
                       {"idx.json.weight_map[\"a\"] is number 3, expected a shard file name"}));
  EXPECT_TRUE(Contains(index_error(R"({"weight_map":{"a":"x","a":"y"}})"),
                       {"idx.json: duplicate key \"a\""}));
  EXPECT_TRUE(Contains(index_error(R"({"weight_map":{"a":[[[["x"]]]]}})"),
                       {"idx.json: JSON nesting deeper than 4 levels"}));
}

TEST(SafetensorsIndex, ShardNamesMustBePlainFileNames) {
  for (const std::string name :
       {"../x", "..", ".", "", "/etc/passwd", "sub/x.safetensors", "a\\\\b", "..\\\\x"}) {
    EXPECT_TRUE(Contains(index_error(R"({"weight_map":{"t":")" + name + "\"}}"),
                         {"idx.json.weight_map[\"t\"] is string \"",
                          "expected a plain file name inside the model directory"}))
        << name;
  }
  // An escaped NUL survives into the message without cutting it short.
  EXPECT_TRUE(Contains(index_error(R"({"weight_map":{"t":"a\u0000b"}})"),
                       {"is string \"a\\u0000b\", expected a plain file name inside the model "
                        "directory"}));
}

}  // namespace
}  // namespace lily
