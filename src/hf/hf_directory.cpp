// Hugging Face model directories: open (config, index and shard headers checked against
// each other), match file names to parameter names, load by pread, plan shards and save
// the way transformers' save_pretrained does. See hf_directory.h for the contract; the
// family's naming rules come from checkpoint_naming.h.
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

#include "mmsp/core/check.h"
#include "mmsp/core/file_descriptor.h"
#include "mmsp/hf/checksum_manifest.h"
#include "mmsp/core/json_read.h"

namespace mmsp::hf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string errno_text() { return std::strerror(errno); }

std::string join(const std::string& dir, const std::string& file) {
  return dir.empty() || dir.back() == '/' ? dir + file : dir + "/" + file;
}

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

bool loadable_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// dst[begin, begin + n) = src[0, n) in dst's dtype. bf16 -> fp32, the common case of
// loading a released checkpoint for training, is exact and a 16-bit shift: a loop the
// compiler vectorises, several times faster than ATen 1.13's scalar conversion loop.
void convert(const at::Tensor& src, const at::Tensor& dst, int64_t begin, int64_t n) {
  if (src.scalar_type() == dst.scalar_type()) {
    std::memcpy(static_cast<char*>(dst.data_ptr()) + begin * dst.element_size(), src.data_ptr(),
                static_cast<size_t>(n) * dst.element_size());
    return;
  }
  if (src.scalar_type() == at::kBFloat16 && dst.scalar_type() == at::kFloat) {
    const auto* in = static_cast<const uint16_t*>(src.data_ptr());
    auto* out = static_cast<uint32_t*>(dst.data_ptr()) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(in[i]) << 16;
    return;
  }
  dst.narrow(0, begin, n).copy_(src.narrow(0, 0, n));
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
  MMSP_CHECK(w.is_object(), path, ": \"weight_map\" must be an object {tensor name: shard file}, got ",
             w.type_name());
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
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    default: return nullptr;
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
    MMSP_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename ", tmp, " to ", path, ": ",
               errno_text());
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
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         is_regular_file(join(path, kHfConfigFile));
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
  MMSP_CHECK(is_regular_file(config_path), dir, ": has no ", kHfConfigFile,
             " (not a Hugging Face model directory)");
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
    MMSP_CHECK(is_regular_file(join(dir, kHfSingleFile)), dir, ": has neither ", kHfIndexFile,
               " nor ", kHfSingleFile, "; a Hugging Face model directory needs one of them");
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
               S_ISDIR(shard.st_mode) ? "a directory" : S_ISFIFO(shard.st_mode) ? "a FIFO" : "a device or socket",
               "); a shard must be a safetensors file");
    check_listed(manifest, dir, file);
    const SafetensorsHeader header = read_safetensors_header(path);
    for (const auto& [name, entry] : header.tensors) {
      const auto [it, fresh] = first_file.emplace(name, file);
      MMSP_CHECK(fresh, dir, ": tensor \"", name, "\" is in two shards, ", it->second, " and ", file,
                 "; each tensor must be in exactly one");
      MMSP_CHECK(loadable_dtype(entry.scalar_type), dir, "/", file, ": tensor \"", name,
                 "\" has dtype ", entry.dtype, "; a model loads from F32, F16, BF16 or F64 only");
      out.tensors.emplace(name, HfTensor{file, entry, 8 + header.header_bytes + entry.data_begin});
      out.total_bytes += entry.data_end - entry.data_begin;
    }
  }
  if (!index) return out;

  for (const auto& [name, t] : out.tensors) {
    const auto listed = index->weight_map.find(name);
    MMSP_CHECK(listed != index->weight_map.end(), dir, ": ", t.file, " holds tensor \"", name,
               "\", which ", kHfIndexFile, " does not list");
    MMSP_CHECK(listed->second == t.file, dir, ": ", kHfIndexFile, " puts tensor \"", name, "\" in ",
               listed->second, " but it is in ", t.file);
  }
  for (const auto& [name, file] : index->weight_map)
    MMSP_CHECK(out.tensors.count(name) == 1, dir, ": ", kHfIndexFile, " lists tensor \"", name,
               "\" in ", file, ", which does not hold it");
  if (index->total_size)
    MMSP_CHECK(*index->total_size == out.total_bytes, dir, ": ", kHfIndexFile, " metadata.total_size is ",
               *index->total_size, " but the shards' tensors hold ", out.total_bytes, " bytes");
  return out;
}

// ---- matching ----

namespace {

// Up to five examples and the count: `12 missing, e.g. "a", "b"`.
void list_some(std::ostringstream& out, const std::vector<std::string>& items, const char* what) {
  if (items.empty()) return;
  out << "\n  " << items.size() << " " << what << ", e.g. ";
  for (size_t i = 0; i < items.size() && i < 5; ++i) out << (i ? ", " : "") << items[i];
  if (items.size() > 5) out << ", ...";
}

}  // namespace

std::map<std::string, const HfTensor*> match_hf_tensors(const HfDirectory& dir,
                                                       const ExpectedShapes& expected,
                                                       const CheckpointNaming& naming) {
  // The file's tensors under the model's names.
  std::map<std::string, std::pair<std::string, const HfTensor*>> by_model_name;  // -> (file name, tensor)
  std::vector<std::string> ambiguous;
  for (const auto& [file_name, tensor] : dir.tensors) {
    const bool ignored =
        std::any_of(naming.ignored_prefixes.begin(), naming.ignored_prefixes.end(),
                    [&, &file_name = file_name](const std::string& p) { return file_name.rfind(p, 0) == 0; });
    if (ignored) continue;
    std::string name = file_name;
    for (const auto& [file_prefix, model_prefix] : naming.prefix_aliases) {
      if (file_name.rfind(file_prefix, 0) == 0) {
        name = model_prefix + file_name.substr(file_prefix.size());
        break;
      }
    }
    const auto [it, fresh] = by_model_name.emplace(name, std::make_pair(file_name, &tensor));
    if (!fresh)
      ambiguous.push_back(detail::concat("\"", it->second.first, "\" and \"", file_name,
                                         "\" both name \"", name, "\""));
  }
  if (!naming.tied_output.empty()) {
    const auto output = by_model_name.find(naming.tied_output);
    if (output != by_model_name.end()) {
      // The model reads its output projection from the embedding: a file that has both
      // keeps the embedding; one that has only the output feeds the embedding from it.
      if (by_model_name.count(naming.tied_input) == 0) by_model_name.emplace(naming.tied_input, output->second);
      by_model_name.erase(output);
    }
  }

  std::map<std::string, const HfTensor*> out;
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> wanted;
  for (const auto& [name, shape] : expected) {
    wanted.insert(name);
    const auto found = by_model_name.find(name);
    if (found == by_model_name.end()) {
      missing.push_back("\"" + name + "\" " + shape_text(shape));
      continue;
    }
    const HfTensor* t = found->second.second;
    if (t->entry.shape != shape) {
      mismatched.push_back(detail::concat("\"", found->second.first, "\" is ", shape_text(t->entry.shape),
                                          " in ", t->file, ", the model's \"", name, "\" is ",
                                          shape_text(shape)));
      continue;
    }
    out.emplace(name, t);
  }
  for (const auto& [name, source] : by_model_name)
    if (wanted.count(name) == 0) unexpected.push_back("\"" + source.first + "\" in " + source.second->file);

  if (missing.empty() && unexpected.empty() && mismatched.empty() && ambiguous.empty()) return out;
  std::ostringstream message;
  message << dir.path << ": the weights do not match the model (" << expected.size()
          << " parameters, " << dir.tensors.size() << " tensors in the files):";
  list_some(message, missing, "missing from the files");
  list_some(message, unexpected, "unexpected (the model has no such parameter)");
  list_some(message, mismatched, "with the wrong shape");
  list_some(message, ambiguous, "named twice under the family's aliases");
  throw Error(message.str());
}

// ---- loading ----

at::Tensor read_hf_elements(const HfDirectory& dir, const std::string& name, int64_t offset, int64_t length) {
  auto it = dir.tensors.find(name);
  MMSP_CHECK(it != dir.tensors.end(), dir.path, ": has no tensor ", name);
  const HfTensor& t = it->second;
  int64_t numel = 1;
  for (int64_t d : t.entry.shape) numel *= d;
  MMSP_CHECK(offset >= 0 && length >= 0 && offset + length <= numel, dir.path, ": elements [", offset, ", ",
             offset + length, ") of ", name, " lie outside its ", numel);
  at::Tensor out = at::empty({length}, t.entry.scalar_type);
  if (length == 0) return out;
  const std::string path = join(dir.path, t.file);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  MMSP_CHECK(fd.get() >= 0, path, ": cannot open: ", errno_text());
  const uint64_t size = out.element_size();
  pread_exact(fd.get(), out.data_ptr(), static_cast<uint64_t>(length) * size,
              t.file_offset + static_cast<uint64_t>(offset) * size, path);
  return out;
}

void load_hf_weights(const HfDirectory& dir,
                     const std::vector<std::pair<std::string, at::Tensor>>& params,
                     const CheckpointNaming& naming) {
  // Parameters on a GPU: read into host tensors of their shape and dtype, then copy over
  // (the reads below write through data pointers, which must be host memory).
  bool on_device = false;
  for (const auto& [name, p] : params) on_device = on_device || (p.defined() && !p.device().is_cpu());
  if (on_device) {
    std::vector<std::pair<std::string, at::Tensor>> host;
    for (const auto& [name, p] : params)
      host.emplace_back(name, p.defined() && !p.device().is_cpu() ? at::empty(p.sizes(), p.options().device(at::kCPU))
                                                                   : p);
    load_hf_weights(dir, host, naming);
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i)
      if (!params[i].second.device().is_cpu()) params[i].second.detach().copy_(host[i].second);
    return;
  }
  ExpectedShapes expected;
  std::set<std::string> seen;
  for (const auto& [name, p] : params) {
    MMSP_CHECK(seen.insert(name).second, "load_hf_weights: parameter \"", name, "\" is given twice");
    MMSP_CHECK(p.defined() && p.device().is_cpu() && p.is_contiguous() && loadable_dtype(p.scalar_type()),
               "load_hf_weights: parameter \"", name,
               "\" must be a defined, contiguous tensor of float32/float64/bfloat16/float16, got ",
               p.defined() ? p.toString() : "undefined", p.defined() && !p.is_contiguous() ? " (not contiguous)" : "");
    expected.emplace_back(name, p.sizes().vec());
  }
  const std::map<std::string, const HfTensor*> matched = match_hf_tensors(dir, expected, naming);

  // Open every shard before writing a parameter, so a file that vanished fails cleanly.
  std::map<std::string, Fd> fds;
  for (const auto& [name, t] : matched) {
    if (fds.count(t->file)) continue;
    const std::string path = join(dir.path, t->file);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    MMSP_CHECK(fd.get() >= 0, path, ": cannot open: ", errno_text());
    fds.emplace(t->file, std::move(fd));
  }

  at::NoGradGuard no_grad;
  std::map<at::ScalarType, at::Tensor> buffers;  // one conversion buffer per source dtype
  for (const auto& [name, param] : params) {
    const HfTensor& t = *matched.at(name);
    const std::string path = join(dir.path, t.file);
    const int fd = fds.at(t.file).get();
    const at::ScalarType source = t.entry.scalar_type;
    // Pieces of at most kHfLoadPieceBytes through a small buffer, each copied or
    // converted into its slice of the parameter. Even without a conversion this beats
    // pread straight into the parameter: its pages are fresh (mmap'd, untouched), and
    // the kernel faulting them in inside pread costs ~5x a user-space memcpy's faults
    // here (mmap bench load: 1 GB bf16 on 4 ranks, 1.0 s vs 5.2 s).
    const int64_t element = static_cast<int64_t>(c10::elementSize(source));
    const int64_t piece = static_cast<int64_t>(kHfLoadPieceBytes) / element;
    const int64_t numel = param.numel();
    at::Tensor& buffer = buffers[source];
    if (!buffer.defined()) buffer = at::empty({piece}, at::TensorOptions().dtype(source));
    at::Tensor flat = param.detach().view({-1});
    for (int64_t begin = 0; begin < numel; begin += piece) {
      const int64_t n = std::min(piece, numel - begin);
      pread_exact(fd, buffer.data_ptr(), static_cast<uint64_t>(n * element),
                  t.file_offset + static_cast<uint64_t>(begin * element), path);
      convert(buffer, flat, begin, n);
      // Non-finite weights would surface only as a NaN loss in step 1, blamed on the
      // learning rate: refused here, naming the file (a converted value that overflows
      // the parameter's dtype counts too).
      const at::Tensor loaded = flat.narrow(0, begin, n);
      if (!loaded.isfinite().all().item<bool>()) {
        const int64_t first = begin + loaded.isfinite().logical_not().nonzero()[0][0].item<int64_t>();
        std::string file_name = name;
        for (const auto& [n, entry] : dir.tensors)
          if (&entry == &t) file_name = n;
        MMSP_FAIL(path, ": tensor \"", file_name, "\" (parameter ", name,
                  ") holds a NaN or infinite value at element ", first, " (as ", c10::toString(param.scalar_type()),
                  "): the file is damaged or was saved from a run that diverged; mmsp trains only from finite weights");
      }
    }
  }
}

// ---- saving ----

std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<uint64_t>& sizes,
                                                uint64_t max_shard_bytes) {
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
    MMSP_CHECK(transformers_dtype_name(*options.dtype) != nullptr, dir, ": cannot save in dtype ",
               *options.dtype, "; choose float32, float64, bfloat16 or float16");
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

void save_hf_directory(const std::string& dir,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
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
        dir, file, [&](const auto& sink) { write_safetensors(shard, {{"format", "pt"}}, sink); },
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
