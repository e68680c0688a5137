// TensorBoard's event files, written without TensorFlow or Python (the tool stays one C++
// binary): TFRecord framing (length, masked CRC-32C of it, an Event protocol buffer, its
// masked CRC-32C) around Event messages — the first holds file_version "brain.Event:2", the
// others one step's scalars as Summary values (tag, simple_value). TensorBoard, and its
// reader (tensorboard.backend.event_processing), read them as its own writers' files
// (tests/python/test_report.py reads them back with tensorboard 2.21's reader).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace mmsp::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes, and TFRecord's mask
// of it ((crc >> 15 | crc << 17) + 0xa282ead8).
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// An Event message's bytes: wall_time (field 1, double), step (2, varint) and either
// file_version (3) or a Summary (5) of (tag, simple_value) values.
std::string event_with_version(double wall_time, const std::string& version);
std::string event_with_scalars(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& scalars);
// One TFRecord: the framing around `payload`.
std::string tfrecord(const std::string& payload);

class TensorBoardWriter {
 public:
  // Creates `dir` and the file events.out.tfevents.<seconds>.<host>.<pid> in it (opened at
  // the first write, its version event first), appended and flushed event by event.
  explicit TensorBoardWriter(std::string dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& record);
  std::string dir_, path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mmsp::train
