// safetensors reader and writer. The reader validates the whole header against the file
// (lengths, UTF-8, JSON shape, dtypes, shapes, offsets, overlaps, holes, duplicate keys)
// before it allocates or reads any tensor; the writer reproduces Hugging Face's layout.
#include "mmsp/hf/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "mmsp/core/check.h"
#include "mmsp/core/file_descriptor.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian data; mmsp copies it without swapping bytes");

namespace mmsp::hf {
namespace {

using nlohmann::json;

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  uint64_t size;
  int rank;  // position in Hugging Face's Dtype enum; its writer lays out the highest first
};

constexpr DtypeInfo kDtypes[] = {
    {"BOOL", at::kBool, 1, 0},   {"U8", at::kByte, 1, 1},       {"I8", at::kChar, 1, 2}, {"I16", at::kShort, 2, 5},
    {"F16", at::kHalf, 2, 7},    {"BF16", at::kBFloat16, 2, 8}, {"I32", at::kInt, 4, 9}, {"F32", at::kFloat, 4, 11},
    {"F64", at::kDouble, 8, 12}, {"I64", at::kLong, 8, 13},
};
constexpr const char* kSupportedNames = "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL";
constexpr int kMaxJsonDepth = 4;  // {name: {shape: [dims]}} needs 3

const DtypeInfo* find_dtype(const std::string& name) {
  for (const DtypeInfo& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeInfo* find_dtype(at::ScalarType type) {
  for (const DtypeInfo& d : kDtypes)
    if (type == d.type) return &d;
  return nullptr;
}

// A value for an error message: JSON text, cut short so a 100 MB header stays readable.
std::string brief(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string brief_name(const std::string& name) { return name.size() > 200 ? name.substr(0, 197) + "..." : name; }

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF included), or npos when the text is valid.
size_t invalid_utf8_at(const unsigned char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    const uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

bool is_utf8(const std::string& s) {
  return invalid_utf8_at(reinterpret_cast<const unsigned char*>(s.data()), s.size()) == std::string::npos;
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// JSON parse that also rejects duplicate keys (nlohmann keeps the last one silently)
// and nesting deeper than a header ever needs.
json parse_header_json(const char* text, size_t n, const std::string& source) {
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        MMSP_CHECK(depth < kMaxJsonDepth, source, ": safetensors header nests deeper than ", kMaxJsonDepth,
                   " levels; a header is {name: {dtype, shape: [..], ", "data_offsets: [..]}}");
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        MMSP_CHECK(open_objects.back().insert(key).second, source, ": safetensors header has the key \"",
                   brief_name(key), "\" twice", depth <= 1 ? " (duplicate tensor name)" : "");
        break;
      }
      case json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, text + n, callback);
  } catch (const json::exception& e) {
    throw Error(detail::concat(source, ": safetensors header is not valid JSON: ", e.what()));
  }
}

uint64_t read_offset(const json& j, const std::string& source, const std::string& name) {
  MMSP_CHECK(j.is_number_unsigned(), source, ": tensor \"", name, "\": data_offsets must hold integers >= 0, got ",
             brief(j));
  return j.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& name, const json& j, uint64_t data_bytes, const std::string& source) {
  const std::string where = detail::concat(source, ": tensor \"", brief_name(name), "\": ");
  MMSP_CHECK(j.is_object(), where, "entry must be an object {dtype, shape, data_offsets}, got ", brief(j));
  for (const auto& item : j.items())
    MMSP_CHECK(item.key() == "dtype" || item.key() == "shape" || item.key() == "data_offsets", where, "unknown key \"",
               brief_name(item.key()), "\" (an entry holds dtype, shape, data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    MMSP_CHECK(j.contains(key), where, "missing \"", key, "\"");

  SafetensorsEntry e;
  const json& dtype = j.at("dtype");
  MMSP_CHECK(dtype.is_string(), where, "dtype must be a string, got ", brief(dtype));
  e.dtype = dtype.get<std::string>();
  const DtypeInfo* info = find_dtype(e.dtype);
  MMSP_CHECK(info != nullptr, where, "dtype \"", brief_name(e.dtype),
             "\" is not supported; supported: ", kSupportedNames);
  e.scalar_type = info->type;

  const json& shape = j.at("shape");
  MMSP_CHECK(shape.is_array(), where, "shape must be an array of integers >= 0, got ", brief(shape));
  MMSP_CHECK(shape.size() <= kSafetensorsMaxDims, where, "shape has ", shape.size(), " dimensions; at most ",
             kSafetensorsMaxDims, " are accepted");
  // Every product below stays within int64 even if a later dimension is 0, so LibTorch
  // never sees a size it cannot represent.
  uint64_t numel = 1;
  uint64_t bounded = 1;  // product of max(dim, 1)
  const auto max_i64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (const json& d : shape) {
    MMSP_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= max_i64, where,
               "shape must hold integers in [0, 2^63), got ", brief(shape));
    const uint64_t dim = d.get<uint64_t>();
    MMSP_CHECK(!__builtin_mul_overflow(bounded, std::max<uint64_t>(dim, 1), &bounded) && bounded <= max_i64, where,
               "shape ", brief(shape), " has more than 2^63 elements");
    numel *= dim;  // <= bounded, cannot overflow
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  MMSP_CHECK(!__builtin_mul_overflow(numel, info->size, &nbytes), where, "shape ", brief(shape), " of ", e.dtype,
             " needs more than 2^64 bytes");

  const json& offsets = j.at("data_offsets");
  MMSP_CHECK(offsets.is_array() && offsets.size() == 2, where, "data_offsets must be [begin, end], got ",
             brief(offsets));
  e.data_begin = read_offset(offsets[0], source, name);
  e.data_end = read_offset(offsets[1], source, name);
  MMSP_CHECK(e.data_begin <= e.data_end, where, "data_offsets [", e.data_begin, ", ", e.data_end,
             "] end before they begin");
  MMSP_CHECK(e.data_end <= data_bytes, where, "data_offsets [", e.data_begin, ", ", e.data_end,
             "] run past the data section, which holds ", data_bytes, " bytes (truncated file?)");
  MMSP_CHECK(e.data_end - e.data_begin == nbytes, where, "data_offsets [", e.data_begin, ", ", e.data_end, "] span ",
             e.data_end - e.data_begin, " bytes but shape ", brief(shape), " of ", e.dtype, " needs ", nbytes);
  return e;
}

// Sorted by position, the tensors must tile the data section exactly: no overlap, no gap,
// nothing after the last one (Hugging Face's reader requires the same).
void check_tiling(const SafetensorsHeader& h, const std::string& source) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> order;
  for (const auto& [name, e] : h.tensors) order.emplace_back(&name, &e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->data_begin, a.second->data_end) <
           std::make_pair(b.second->data_begin, b.second->data_end);
  });
  uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, e] : order) {
    MMSP_CHECK(e->data_begin >= cursor, source, ": tensor \"", brief_name(*name), "\": data_offsets [", e->data_begin,
               ", ", e->data_end, "] overlap tensor \"", brief_name(previous ? *previous : std::string()),
               "\", which ends at ", cursor);
    MMSP_CHECK(e->data_begin == cursor, source, ": tensor \"", brief_name(*name), "\": data_offsets [", e->data_begin,
               ", ", e->data_end, "] leave a hole of ", e->data_begin - cursor, " bytes at data offset ", cursor,
               " (tensors must cover the data section without gaps)");
    cursor = e->data_end;
    previous = name;
  }
  MMSP_CHECK(cursor == h.data_bytes, source, ": the data section holds ", h.data_bytes,
             " bytes but its tensors cover only ", cursor, " (", h.data_bytes - cursor, " trailing bytes)");
}

// `header` is the N bytes after the length; `file_size` the size of the whole file.
SafetensorsHeader check_header(const char* header, uint64_t n, uint64_t file_size, const std::string& source) {
  SafetensorsHeader h;
  h.header_bytes = n;
  h.data_bytes = file_size - 8 - n;
  const size_t bad = invalid_utf8_at(reinterpret_cast<const unsigned char*>(header), n);
  MMSP_CHECK(bad == std::string::npos, source, ": safetensors header is not valid UTF-8 (byte ", bad, " of ", n, ")");
  // nlohmann's parser takes a NUL for the end of its input; JSON never holds a raw NUL.
  const void* nul = std::memchr(header, 0, n);
  MMSP_CHECK(nul == nullptr, source, ": safetensors header has a NUL byte at byte ",
             static_cast<const char*>(nul) - header, " of ", n);
  const json j = parse_header_json(header, n, source);
  MMSP_CHECK(j.is_object(), source, ": safetensors header must be a JSON object, got ", j.type_name());
  for (const auto& item : j.items()) {
    if (item.key() == "__metadata__") {
      const json& m = item.value();
      MMSP_CHECK(m.is_object(), source, ": __metadata__ must be an object of strings, got ", brief(m));
      for (const auto& kv : m.items()) {
        MMSP_CHECK(kv.value().is_string(), source, ": __metadata__ \"", brief_name(kv.key()),
                   "\" must be a string, got ", brief(kv.value()));
        h.metadata.emplace(kv.key(), kv.value().get<std::string>());
      }
      continue;
    }
    h.tensors.emplace(item.key(), parse_entry(item.key(), item.value(), h.data_bytes, source));
  }
  check_tiling(h, source);
  return h;
}

uint64_t check_length_prefix(const unsigned char* prefix, uint64_t file_size, const std::string& source) {
  const uint64_t n = read_le64(prefix);
  MMSP_CHECK(n <= file_size - 8, source, ": header length ", n, " exceeds the ", file_size - 8,
             " bytes that follow it (truncated or not a safetensors file)");
  MMSP_CHECK(n <= kSafetensorsMaxHeaderBytes, source, ": header length ", n, " exceeds the ",
             kSafetensorsMaxHeaderBytes, "-byte limit");
  return n;
}

at::Tensor allocate(const std::string& name, const SafetensorsEntry& e, const std::string& source) {
  try {
    return at::empty(e.shape, at::TensorOptions().dtype(e.scalar_type));
  } catch (const std::exception& err) {  // c10::Error or std::bad_alloc
    throw Error(detail::concat(source, ": tensor \"", brief_name(name), "\": cannot allocate ",
                               e.data_end - e.data_begin, " bytes: ", err.what()));
  }
}

// LibTorch bools must be 0 or 1; any other byte is a corrupt file, not a true.
void check_bools(const std::string& name, const at::Tensor& t, const std::string& source) {
  if (t.scalar_type() != at::kBool) return;
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i)
    MMSP_CHECK(p[i] <= 1, source, ": tensor \"", brief_name(name), "\": BOOL element ", i, " is byte ",
               static_cast<int>(p[i]), "; must be 0 or 1");
}

// ---- files ----

using Fd = FileDescriptor;

std::string errno_text() { return std::strerror(errno); }

struct OpenFile {
  Fd fd;
  uint64_t size;
};

OpenFile open_for_reading(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  MMSP_CHECK(fd.get() >= 0, path, ": cannot open safetensors file: ", errno_text());
  struct stat st {};
  MMSP_CHECK(::fstat(fd.get(), &st) == 0, path, ": cannot stat: ", errno_text());
  MMSP_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  return OpenFile{Fd(fd.release()), static_cast<uint64_t>(st.st_size)};
}

SafetensorsHeader read_header(const OpenFile& f, const std::string& path) {
  MMSP_CHECK(f.size >= 8, path, ": file is ", f.size,
             " bytes, shorter than the 8-byte header length (truncated or not safetensors)");
  unsigned char prefix[8];
  pread_exact(f.fd.get(), prefix, 8, 0, path);
  const uint64_t n = check_length_prefix(prefix, f.size, path);
  std::string header(static_cast<size_t>(n), '\0');
  pread_exact(f.fd.get(), header.data(), n, 8, path);
  return check_header(header.data(), n, f.size, path);
}

// ---- writing ----

struct Prepared {
  const std::string* name;
  at::Tensor tensor;  // CPU, contiguous
  const DtypeInfo* info;
  uint64_t nbytes;
};

std::vector<Prepared> prepare(const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata)
    MMSP_CHECK(is_utf8(key) && is_utf8(value), "save_safetensors: metadata \"", brief_name(key),
               "\" is not valid UTF-8");
  std::vector<Prepared> out;
  for (const auto& [name, t] : tensors) {
    MMSP_CHECK(name != "__metadata__", "save_safetensors: \"__metadata__\" is reserved and ", "cannot name a tensor");
    MMSP_CHECK(is_utf8(name), "save_safetensors: tensor name \"", brief_name(name), "\" is not valid UTF-8");
    MMSP_CHECK(t.defined(), "save_safetensors: tensor \"", name, "\" is undefined");
    MMSP_CHECK(t.layout() == at::kStrided && !t.is_quantized(), "save_safetensors: tensor \"", name, "\" has layout ",
               t.layout(), "; only dense tensors can be saved");
    const DtypeInfo* info = find_dtype(t.scalar_type());
    MMSP_CHECK(info != nullptr, "save_safetensors: tensor \"", name, "\" has dtype ", t.scalar_type(),
               "; supported: ", kSupportedNames);
    at::Tensor cpu;
    try {
      cpu = t.detach().to(at::kCPU).contiguous();
    } catch (const std::exception& e) {  // e.g. a meta tensor has no data to copy
      throw Error(
          detail::concat("save_safetensors: tensor \"", name, "\" cannot be copied to ", "the CPU: ", e.what()));
    }
    out.push_back({&name, cpu, info, static_cast<uint64_t>(cpu.numel()) * info->size});
  }
  std::sort(out.begin(), out.end(), [](const Prepared& a, const Prepared& b) {
    if (a.info->rank != b.info->rank) return a.info->rank > b.info->rank;
    return *a.name < *b.name;
  });
  return out;
}

// The header as serde_json writes it for Hugging Face: compact, __metadata__ first, then
// the tensors in data order, each {"dtype","shape","data_offsets"}; padded to 8 bytes.
std::string header_text(const std::vector<Prepared>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string s = "{";
  bool first = true;
  if (!metadata.empty()) {
    s += "\"__metadata__\":" + json(metadata).dump();
    first = false;
  }
  uint64_t offset = 0;
  for (const Prepared& p : tensors) {
    if (!first) s += ",";
    first = false;
    s += json(*p.name).dump() + ":{\"dtype\":\"" + p.info->name + "\",\"shape\":[";
    for (int64_t d = 0; d < p.tensor.dim(); ++d) s += (d ? "," : "") + std::to_string(p.tensor.size(d));
    s += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + p.nbytes) + "]}";
    offset += p.nbytes;
  }
  s += "}";
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

void serialize(const std::vector<Prepared>& prepared, const std::map<std::string, std::string>& metadata,
               const std::function<void(const void*, uint64_t)>& sink) {
  const std::string header = header_text(prepared, metadata);
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  sink(prefix, 8);
  sink(header.data(), header.size());
  for (const Prepared& p : prepared)
    if (p.nbytes > 0) sink(p.tensor.data_ptr(), p.nbytes);
}

void sync_directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() >= 0) ::fsync(fd.get());  // best effort: some filesystems refuse
}

}  // namespace

void pread_exact(int fd, void* buffer, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(buffer);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    MMSP_CHECK(got >= 0, path, ": read failed at byte ", offset, ": ", errno_text());
    MMSP_CHECK(got > 0, path, ": file ended at byte ", offset, " while reading (did it shrink?)");
    p += got, n -= static_cast<uint64_t>(got), offset += static_cast<uint64_t>(got);
  }
}

void write_exact(int fd, const void* buffer, uint64_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(buffer);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t put = ::write(fd, p, chunk);
    if (put < 0 && errno == EINTR) continue;
    MMSP_CHECK(put > 0, path, ": write failed: ", errno_text());
    p += put, n -= static_cast<uint64_t>(put);
  }
}

std::string safetensors_dtype_name(at::ScalarType type) {
  const DtypeInfo* info = find_dtype(type);
  MMSP_CHECK(info != nullptr, "dtype ", type, " has no safetensors name here; supported: ", kSupportedNames);
  return info->name;
}

at::ScalarType safetensors_scalar_type(const std::string& dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  MMSP_CHECK(info != nullptr, "safetensors dtype \"", dtype, "\" is not supported; supported: ", kSupportedNames);
  return info->type;
}

SafetensorsHeader parse_safetensors_header(const void* data, size_t size, const std::string& source) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  MMSP_CHECK(size >= 8, source, ": ", size,
             " bytes, shorter than the 8-byte header length (truncated or not safetensors)");
  const uint64_t n = check_length_prefix(bytes, size, source);
  return check_header(reinterpret_cast<const char*>(bytes + 8), n, size, source);
}

std::map<std::string, at::Tensor> parse_safetensors(const void* data, size_t size, const std::string& source) {
  const SafetensorsHeader h = parse_safetensors_header(data, size, source);
  const auto* base = static_cast<const unsigned char*>(data) + 8 + h.header_bytes;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, e] : h.tensors) {
    at::Tensor t = allocate(name, e, source);
    if (e.data_end > e.data_begin) std::memcpy(t.data_ptr(), base + e.data_begin, e.data_end - e.data_begin);
    check_bools(name, t, source);
    out.emplace(name, std::move(t));
  }
  return out;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const OpenFile f = open_for_reading(path);
  return read_header(f, path);
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  const OpenFile f = open_for_reading(path);
  const SafetensorsHeader h = read_header(f, path);
  const uint64_t base = 8 + h.header_bytes;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, e] : h.tensors) {
    at::Tensor t = allocate(name, e, path);
    if (e.data_end > e.data_begin)
      pread_exact(f.fd.get(), t.data_ptr(), e.data_end - e.data_begin, base + e.data_begin, path);
    check_bools(name, t, path);
    out.emplace(name, std::move(t));
  }
  return out;
}

std::string serialize_safetensors(const std::map<std::string, at::Tensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::string out;
  serialize(prepare(tensors, metadata), metadata,
            [&](const void* p, uint64_t n) { out.append(static_cast<const char*>(p), static_cast<size_t>(n)); });
  return out;
}

void write_safetensors(const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void*, uint64_t)>& sink) {
  serialize(prepare(tensors, metadata), metadata, sink);
}

void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Validate and copy to CPU before the file exists, so a bad tensor leaves no trace.
  const std::vector<Prepared> prepared = prepare(tensors, metadata);
  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  MMSP_CHECK(fd.get() >= 0, tmp, ": cannot create: ", errno_text());
  try {
    serialize(prepared, metadata, [&](const void* p, uint64_t n) { write_exact(fd.get(), p, n, tmp); });
    MMSP_CHECK(::fsync(fd.get()) == 0, tmp, ": fsync failed: ", errno_text());
    MMSP_CHECK(::close(fd.release()) == 0, tmp, ": close failed: ", errno_text());
    MMSP_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path, ": ", errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  sync_directory_of(path);
}

}  // namespace mmsp::hf
