// TensorBoard's event files as mmsp writes them (train/tensorboard_writer.h): CRC-32C against
// its published check value, TFRecord framing and the Event bytes against their wire format.
// tests/python/test_report.py reads a run's files back with tensorboard's own reader.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "mmsp/train/tensorboard_writer.h"

namespace mmsp::train {
namespace {

TEST(TensorBoardWriter, Crc32cMatchesItsCheckValue) {
  const char* check = "123456789";  // RFC 3720's CRC-32C check value
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c(check, 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoardWriter, RecordsFrameTheirPayload) {
  const std::string payload = "abc";
  const std::string record = tfrecord(payload);
  ASSERT_EQ(record.size(), 8u + 4 + 3 + 4);
  uint64_t length = 0;
  std::memcpy(&length, record.data(), 8);
  EXPECT_EQ(length, 3u);
  uint32_t head = 0, tail = 0;
  std::memcpy(&head, record.data() + 8, 4);
  std::memcpy(&tail, record.data() + 15, 4);
  EXPECT_EQ(head, masked_crc32c(record.data(), 8));
  EXPECT_EQ(record.substr(12, 3), payload);
  EXPECT_EQ(tail, masked_crc32c(payload.data(), 3));
}

TEST(TensorBoardWriter, EventsFollowTheWireFormat) {
  // wall_time 1.0 (field 1, fixed64), step 3 (field 2, varint), summary (field 5) of one value:
  // tag "a" (field 1), simple_value 2.0f (field 2, fixed32)
  const std::string e = event_with_scalars(1.0, 3, {{"a", 2.0f}});
  const std::string want = std::string("\x09\x00\x00\x00\x00\x00\x00\xf0\x3f", 9) + "\x10\x03" +
                           std::string(
                               "\x2a\x0a\x0a\x08\x0a\x01"
                               "a"
                               "\x15\x00\x00\x00\x40",
                               12);
  EXPECT_EQ(e, want);
  const std::string v = event_with_version(1.0, "brain.Event:2");
  EXPECT_EQ(v.substr(9), std::string("\x1a\x0d") + "brain.Event:2");
}

TEST(TensorBoardWriter, WritesTheVersionThenEachStep) {
  const std::string dir = testing::TempDir() + "mmsp-tensorboard";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir);
    EXPECT_FALSE(std::filesystem::exists(dir)) << "nothing before the first event";
    w.scalars(1, {{"train/loss", 1.5f}});
    w.scalars(2, {{"train/loss", 1.25f}});
    path = w.path();
  }
  EXPECT_NE(path.find(dir + "/events.out.tfevents."), std::string::npos);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0;
  int records = 0;
  while (at < bytes.size()) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    ASSERT_LE(at + 16 + length, bytes.size());
    ++records;
    at += 16 + length;
  }
  EXPECT_EQ(records, 3);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mmsp::train
