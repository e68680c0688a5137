// Hugging Face model directories: open (config, index and shard headers checked against
// each other), plan shards and save the way transformers' save_pretrained does (matching
// file names to parameter names and loading them: hf_weights.cpp). See hf_directory.h for
// the contract; the family's naming rules come from checkpoint_naming.h.
#include "mmsp/hf/hf_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include "hf_io.h"
#include "mmsp/core/check.h"
#include "mmsp/core/file_descriptor.h"
#include "mmsp/core/json_read.h"
#include "mmsp/hf/checksum_manifest.h"

namespace mmsp::hf {
namespace {

namespace fs = std::filesystem;
using io::errno_text;
using io::join;
using io::loadable_dtype;
using nlohmann::json;

using Fd = FileDescriptor;

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MMSP_CHECK(in.good(), path, ": cannot open: ", errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  MMSP_CHECK(!in.bad(), path, ": read failed");
  return text.str();
}

// ---- the index ----

struct Index {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file
  std::optional<uint64_t> total_size;
};

// A shard name must stay inside the directory: a plain file name.
void check_shard_name(const std::string& file, const std::string& where) {
  MMSP_CHECK(!file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos &&
                 file.find('\0') == std::string::npos,
             where, ": weight_map names the shard file \"", file,
             "\"; a shard must be a plain file name in the directory (no '/', not '..')");
}

Index parse_index(const std::string& path) {
  const json j = parse_json_text(read_text(path), path);
  MMSP_CHECK(j.is_object(), path, ": must be a JSON object {\"metadata\": {...}, \"weight_map\": {...}}, got ",
             j.type_name());
  Index index;
  if (j.contains("metadata")) {
    const json& m = j.at("metadata");
    MMSP_CHECK(m.is_object(), path, ": \"metadata\" must be an object, got ", m.type_name());
    if (m.contains("total_size")) {
      const json& t = m.at("total_size");
      MMSP_CHECK(t.is_number_unsigned(), path,
                 ": metadata.total_size must be an integer >= 0 (bytes of tensor data), got ", t.dump());
      index.total_size = static_cast<uint64_t>(json_to_int(t, path + ": metadata.total_size", 0, INT64_MAX));
    }
  }
  MMSP_CHECK(j.contains("weight_map"), path, ": has no \"weight_map\" {tensor name: shard file}");
  const json& w = j.at("weight_map");
  MMSP_CHECK(w.is_object(), path, ": \"weight_map\" must be an object {tensor name: shard file}, got ", w.type_name());
  for (const auto& item : w.items()) {
    MMSP_CHECK(item.value().is_string(), path, ": weight_map[\"", item.key(),
               "\"] must be a shard file name (string), got ", item.value().dump());
    const std::string file = item.value().get<std::string>();
    check_shard_name(file, path);
    index.weight_map.emplace(item.key(), file);
  }
  return index;
}

// ---- saving ----

const char* transformers_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    default:
      return nullptr;
  }
}

// Writes `dir/name` through `name.tmp`, fsync and rename; `write` gets the sink.
// With `checksums`, the file's XXH64 is taken from the bytes as they are written.
void write_file_atomically(const std::string& dir, const std::string& name,
                           const std::function<void(const std::function<void(const void*, uint64_t)>&)>& write,
                           const std::function<void(uint64_t)>& progress, ChecksumManifest* checksums = nullptr) {
  ChecksumSink hash;
  const std::string path = join(dir, name);
  const std::string tmp = path + ".tmp";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  MMSP_CHECK(fd.get() >= 0, tmp, ": cannot create: ", errno_text());
  try {
    write([&](const void* data, uint64_t size) {
      write_exact(fd.get(), data, size, tmp);
      if (checksums) hash.update(data, size);
      if (progress) progress(size);
    });
    MMSP_CHECK(::fsync(fd.get()) == 0, tmp, ": fsync failed: ", errno_text());
    MMSP_CHECK(::close(fd.release()) == 0, tmp, ": close failed: ", errno_text());
    MMSP_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path, ": ", errno_text());
    if (checksums) (*checksums)[name] = hash.result();
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

void write_text_file(const std::string& dir, const std::string& name, const std::string& text,
                     const std::function<void(uint64_t)>& progress, ChecksumManifest* checksums = nullptr) {
  write_file_atomically(
      dir, name, [&](const auto& sink) { sink(text.data(), text.size()); }, progress, checksums);
}

// The directory to save into: created if absent; an existing one must be empty.
void prepare_empty_directory(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    MMSP_CHECK(fs::is_directory(dir, ec), dir, ": exists and is not a directory; save_hf_directory ",
               "writes a new or empty directory");
    MMSP_CHECK(fs::is_empty(dir, ec) && !ec, dir, ": exists and is not empty; save_hf_directory ",
               "writes a new or empty directory (nothing was written)");
    return;
  }
  fs::create_directories(dir, ec);
  MMSP_CHECK(!ec, dir, ": cannot create directory: ", ec.message());
}

void sync_directory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  MMSP_CHECK(fd.get() >= 0, dir, ": cannot open directory to fsync: ", errno_text());
  ::fsync(fd.get());  // best effort: some filesystems refuse to fsync a directory
}

}  // namespace

at::ScalarType HfDirectory::dominant_dtype() const {
  std::map<at::ScalarType, uint64_t> bytes;
  for (const auto& [name, t] : tensors) bytes[t.entry.scalar_type] += t.bytes();
  at::ScalarType best = at::kFloat;
  uint64_t most = 0;
  for (const auto& [type, n] : bytes)
    if (n > most) best = type, most = n;
  return best;
}

bool is_hf_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && is_regular_file(join(path, kHfConfigFile));
}

HfDirectory open_hf_directory(const std::string& dir) {
  struct stat st {};
  MMSP_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), dir,
             ": not a directory (a Hugging Face model directory holds config.json and *.safetensors)");
  HfDirectory out;
  out.path = dir;
  // checksums.json (mmsp writes one into every hf/; released directories have none):
  // every file it lists is verified before anything is parsed.
  const ManifestVerdict manifest = verify_checksum_manifest(dir);
  out.checksums_verified = manifest.check == ManifestCheck::verified;
  out.checksums_xxh64 = manifest.manifest_xxh64;
  const std::string config_path = join(dir, kHfConfigFile);
  MMSP_CHECK(is_regular_file(config_path), dir, ": has no ", kHfConfigFile, " (not a Hugging Face model directory)");
  check_listed(manifest, dir, kHfConfigFile);
  out.config_json = read_text(config_path);

  const std::string index_path = join(dir, kHfIndexFile);
  std::optional<Index> index;
  // Both a single file and an index: transformers loads model.safetensors, so does mmsp
  // (reading the index would load other weights than transformers from one directory).
  if (is_regular_file(index_path) && !is_regular_file(join(dir, kHfSingleFile))) {
    check_listed(manifest, dir, kHfIndexFile);
    index = parse_index(index_path);
    std::set<std::string> files;
    for (const auto& [name, file] : index->weight_map) files.insert(file);
    out.files.assign(files.begin(), files.end());
    out.indexed = true;
  } else {
    MMSP_CHECK(is_regular_file(join(dir, kHfSingleFile)), dir, ": has neither ", kHfIndexFile, " nor ", kHfSingleFile,
               "; a Hugging Face model directory needs one of them");
    out.files = {kHfSingleFile};
  }

  // Every header first, so a name in two shards is reported as such whatever the index says.
  std::map<std::string, std::string> first_file;  // tensor name -> first shard holding it
  for (const std::string& file : out.files) {
    const std::string path = join(dir, file);
    struct stat shard {};
    const bool exists = ::stat(path.c_str(), &shard) == 0;
    MMSP_CHECK(exists, dir, ": shard file ", file, " is missing (", kHfIndexFile, " lists it)");
    MMSP_CHECK(S_ISREG(shard.st_mode), dir, ": shard file ", file, " is not a regular file (",
               S_ISDIR(shard.st_mode)    ? "a directory"
               : S_ISFIFO(shard.st_mode) ? "a FIFO"
                                         : "a device or socket",
               "); a shard must be a safetensors file");
    check_listed(manifest, dir, file);
    const SafetensorsHeader header = read_safetensors_header(path);
    for (const auto& [name, entry] : header.tensors) {
      const auto [it, fresh] = first_file.emplace(name, file);
      MMSP_CHECK(fresh, dir, ": tensor \"", name, "\" is in two shards, ", it->second, " and ", file,
                 "; each tensor must be in exactly one");
      MMSP_CHECK(loadable_dtype(entry.scalar_type), dir, "/", file, ": tensor \"", name, "\" has dtype ", entry.dtype,
                 "; a model loads from F32, F16, BF16 or F64 only");
      out.tensors.emplace(name, HfTensor{file, entry, 8 + header.header_bytes + entry.data_begin});
      out.total_bytes += entry.data_end - entry.data_begin;
    }
  }
  if (!index) return out;

  for (const auto& [name, t] : out.tensors) {
    const auto listed = index->weight_map.find(name);
    MMSP_CHECK(listed != index->weight_map.end(), dir, ": ", t.file, " holds tensor \"", name, "\", which ",
               kHfIndexFile, " does not list");
    MMSP_CHECK(listed->second == t.file, dir, ": ", kHfIndexFile, " puts tensor \"", name, "\" in ", listed->second,
               " but it is in ", t.file);
  }
  for (const auto& [name, file] : index->weight_map)
    MMSP_CHECK(out.tensors.count(name) == 1, dir, ": ", kHfIndexFile, " lists tensor \"", name, "\" in ", file,
               ", which does not hold it");
  if (index->total_size)
    MMSP_CHECK(*index->total_size == out.total_bytes, dir, ": ", kHfIndexFile, " metadata.total_size is ",
               *index->total_size, " but the shards' tensors hold ", out.total_bytes, " bytes");
  return out;
}

// ---- saving ----

std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<uint64_t>& sizes, uint64_t max_shard_bytes) {
  // huggingface_hub's split_state_dict_into_shards_factory (serialization/_base.py):
  // an oversized tensor becomes a shard of its own at once, ahead of the shard still
  // being filled, which is closed only when a later tensor does not fit it.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + sizes[i] > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += sizes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

namespace {

using NamedTensor = std::pair<std::string, at::Tensor>;

// The config as transformers writes it (std::map keys: sorted), checked with the dtype asked for.
json config_to_save(const std::string& dir, const std::string& config_json, const HfSaveOptions& options) {
  json config;
  try {
    config = json::parse(config_json);
  } catch (const json::exception& e) {
    throw Error(detail::concat(dir, ": the config to save is not valid JSON (", e.what(), ")"));
  }
  MMSP_CHECK(config.is_object(), dir, ": the config to save must be a JSON object, got ", config.type_name());
  if (options.dtype)
    MMSP_CHECK(transformers_dtype_name(*options.dtype) != nullptr, dir, ": cannot save in dtype ", *options.dtype,
               "; choose float32, float64, bfloat16 or float16");
  return config;
}

// The tensors in name order (the order shards are planned in), each defined and named once.
std::vector<const NamedTensor*> sorted_by_name(const std::string& dir, const std::vector<NamedTensor>& tensors) {
  std::vector<const NamedTensor*> order;
  for (const auto& t : tensors) {
    MMSP_CHECK(t.second.defined(), dir, ": tensor \"", t.first, "\" is undefined");
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
  for (size_t i = 1; i < order.size(); ++i)
    MMSP_CHECK(order[i]->first != order[i - 1]->first, dir, ": tensor \"", order[i]->first, "\" is given twice");
  return order;
}

}  // namespace

void save_hf_directory(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::string& config_json, const HfSaveOptions& options) {
  // Everything checked before the directory is touched.
  json config = config_to_save(dir, config_json, options);
  const std::vector<const NamedTensor*> order = sorted_by_name(dir, tensors);

  auto saved_type = [&](const at::Tensor& t) {
    return options.dtype && at::isFloatingType(t.scalar_type()) ? *options.dtype : t.scalar_type();
  };
  std::vector<uint64_t> sizes;
  std::map<at::ScalarType, uint64_t> floating_bytes;
  uint64_t total_bytes = 0, total_parameters = 0;
  for (const auto* t : order) {
    const at::ScalarType type = saved_type(t->second);
    const uint64_t bytes = static_cast<uint64_t>(t->second.numel()) * c10::elementSize(type);
    sizes.push_back(bytes);
    total_bytes += bytes;
    total_parameters += static_cast<uint64_t>(t->second.numel());
    if (at::isFloatingType(type)) floating_bytes[type] += bytes;
  }
  std::optional<at::ScalarType> config_dtype = options.dtype;
  for (const auto& [type, bytes] : floating_bytes)
    if (!options.dtype && (!config_dtype || bytes > floating_bytes[*config_dtype])) config_dtype = type;
  if (config_dtype) {
    const char* name = transformers_dtype_name(*config_dtype);
    MMSP_CHECK(name != nullptr, dir, ": tensors of dtype ", *config_dtype,
               " have no transformers torch_dtype; convert them (HfSaveOptions::dtype)");
    config["torch_dtype"] = name;
    if (config.contains("dtype")) config["dtype"] = name;  // transformers >= 4.56 writes both spellings
  }
  std::vector<std::vector<size_t>> shards = plan_hf_shards(sizes, options.max_shard_bytes);
  if (shards.empty()) shards.emplace_back();  // no tensors: an empty model.safetensors, still a directory that opens

  prepare_empty_directory(dir);
  ChecksumManifest checksums;
  write_text_file(dir, kHfConfigFile, config.dump(2, ' ', true) + "\n", options.progress, &checksums);

  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char numbered[64];
    std::snprintf(numbered, sizeof numbered, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = shards.size() == 1 ? kHfSingleFile : numbered;
    // Converted one shard at a time, so the extra memory is one shard at most.
    std::map<std::string, at::Tensor> shard;
    for (size_t i : shards[s]) {
      const auto& [name, t] = *order[i];
      shard.emplace(name, t.scalar_type() == saved_type(t) ? t : t.to(saved_type(t)));
      weight_map[name] = file;
    }
    write_file_atomically(
        dir, file,
        [&](const auto& sink) {
          write_safetensors(shard, {{"format", "pt"}}, sink);
        },
        options.progress, &checksums);
  }
  if (shards.size() > 1) {
    // transformers >= 4.56 (followed here: 4.57) puts total_parameters beside total_size;
    // json.dumps(index, indent=2, sort_keys=True) + "\n".
    const json index = {{"metadata", {{"total_parameters", total_parameters}, {"total_size", total_bytes}}},
                        {"weight_map", weight_map}};
    write_text_file(dir, kHfIndexFile, index.dump(2, ' ', true) + "\n", options.progress, &checksums);
  }
  // Last: a directory with checksums.json is complete.
  write_text_file(dir, kChecksumFile, checksum_manifest_json(checksums), options.progress);
  sync_directory(dir);
}

}  // namespace mmsp::hf
