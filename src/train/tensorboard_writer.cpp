// TensorBoard event files; see tensorboard_writer.h.
#include "mmsp/train/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "mmsp/core/check.h"

namespace mmsp::train {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol buffers' wire format: a key is (field << 3) | wire type; 0 varint, 1 fixed64,
// 2 length-delimited, 5 fixed32.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <typename T>
void fixed(std::string& out, T v) {  // little-endian, as the hosts mmsp runs on are
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& value) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, value.size());
  out += value;
}
std::string event_head(double wall_time) {
  std::string out;
  varint(out, 1 << 3 | 1);
  fixed(out, wall_time);
  return out;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = crc_table()[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string event_with_version(double wall_time, const std::string& version) {
  std::string out = event_head(wall_time);
  bytes_field(out, 3, version);
  return out;
}

std::string event_with_scalars(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& scalars) {
  std::string out = event_head(wall_time);
  varint(out, 2 << 3 | 0);
  varint(out, static_cast<uint64_t>(step));
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    bytes_field(v, 1, tag);
    varint(v, 2 << 3 | 5);
    fixed(v, value);
    bytes_field(summary, 1, v);
  }
  bytes_field(out, 5, summary);
  return out;
}

std::string tfrecord(const std::string& payload) {
  std::string out;
  const uint64_t length = payload.size();
  fixed(out, length);
  fixed(out, masked_crc32c(out.data(), sizeof length));
  out += payload;
  fixed(out, masked_crc32c(payload.data(), payload.size()));
  return out;
}

TensorBoardWriter::TensorBoardWriter(std::string dir) : dir_(std::move(dir)) {}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  if (!file_) {
    std::filesystem::create_directories(dir_);
    char host[128] = {};
    ::gethostname(host, sizeof host - 1);
    path_ = dir_ + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host + "." +
            std::to_string(::getpid());
    file_ = std::fopen(path_.c_str(), "ab");
    MMSP_CHECK(file_ != nullptr, path_, ": cannot open the TensorBoard event file: ", std::strerror(errno));
    write(tfrecord(event_with_version(now_seconds(), "brain.Event:2")));
  }
  write(tfrecord(event_with_scalars(now_seconds(), step, values)));
}

void TensorBoardWriter::write(const std::string& record) {
  MMSP_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0, path_,
             ": cannot write a TensorBoard event: ", std::strerror(errno));
}

}  // namespace mmsp::train
