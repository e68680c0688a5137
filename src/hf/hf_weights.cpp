// A model directory's weights into parameters: file names matched to the model's (the
// family's aliases, tied embeddings, a transposable layout, expert parallelism's row
// slices and experts held elsewhere), then each tensor pread in bounded pieces and copied
// or converted into its parameter. See hf_directory.h.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "hf_io.h"
#include "mmsp/core/check.h"
#include "mmsp/core/file_descriptor.h"
#include "mmsp/hf/hf_directory.h"

namespace mmsp::hf {
namespace {

using Fd = FileDescriptor;
using io::errno_text;
using io::join;
using io::shape_text;

// Up to five examples and the count: `12 missing, e.g. "a", "b"`.
void list_some(std::ostringstream& out, const std::vector<std::string>& items, const char* what) {
  if (items.empty()) return;
  out << "\n  " << items.size() << " " << what << ", e.g. ";
  for (size_t i = 0; i < items.size() && i < 5; ++i) out << (i ? ", " : "") << items[i];
  if (items.size() > 5) out << ", ...";
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

// Where a parameter's values are in its file tensor.
struct Source {
  const HfTensor* tensor = nullptr;
  std::string file_name;
  int64_t first_row = 0;    // of the tensor's first dimension (row slices)
  bool transposed = false;  // its last two dimensions are the model's swapped
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The file's tensors under the model's names (aliases applied, tied output folded in);
// ambiguous names are listed.
std::map<std::string, std::pair<std::string, const HfTensor*>> by_model_name(const HfDirectory& dir,
                                                                             const CheckpointNaming& naming,
                                                                             std::vector<std::string>& ambiguous) {
  std::map<std::string, std::pair<std::string, const HfTensor*>> out;  // -> (file name, tensor)
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
    if (naming.held_elsewhere && naming.held_elsewhere(name)) continue;
    const auto [it, fresh] = out.emplace(name, std::make_pair(file_name, &tensor));
    if (!fresh)
      ambiguous.push_back(
          detail::concat("\"", it->second.first, "\" and \"", file_name, "\" both name \"", name, "\""));
  }
  if (!naming.tied_output.empty()) {
    const auto output = out.find(naming.tied_output);
    if (output != out.end()) {
      // The model reads its output projection from the embedding: a file that has both
      // keeps the embedding; one that has only the output feeds the embedding from it.
      if (out.count(naming.tied_input) == 0) out.emplace(naming.tied_input, output->second);
      out.erase(output);
    }
  }
  return out;
}

// The row slice a model name holds (naming.row_slices), or null.
const CheckpointNaming::RowSlice* row_slice(const std::string& name, const CheckpointNaming& naming) {
  for (const auto& [suffix, slice] : naming.row_slices)
    if (ends_with(name, suffix)) return &slice;
  return nullptr;
}

// How the file's shape `file` feeds a parameter of shape `shape`: whole, a row slice, or
// transposed (last two dimensions); false when it cannot.
bool fits(const std::string& name, std::vector<int64_t> shape, const std::vector<int64_t>& file,
          const CheckpointNaming& naming, Source& source) {
  if (const CheckpointNaming::RowSlice* slice = row_slice(name, naming)) {
    if (shape.empty() || shape[0] != slice->rows) return false;
    shape[0] = slice->total;
    source.first_row = slice->first;
  }
  if (file == shape) return true;
  const bool transposable =
      shape.size() == 3 && std::any_of(naming.transposable_suffixes.begin(), naming.transposable_suffixes.end(),
                                       [&](const std::string& s) { return ends_with(name, s); });
  if (!transposable) return false;
  std::swap(shape[1], shape[2]);
  source.transposed = file == shape;
  return source.transposed;
}

std::map<std::string, Source> match_sources(const HfDirectory& dir, const ExpectedShapes& expected,
                                            const CheckpointNaming& naming) {
  std::vector<std::string> ambiguous;
  const auto files = by_model_name(dir, naming, ambiguous);
  std::map<std::string, Source> out;
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> wanted;
  for (const auto& [name, shape] : expected) {
    wanted.insert(name);
    const auto found = files.find(name);
    if (found == files.end()) {
      missing.push_back("\"" + name + "\" " + shape_text(shape));
      continue;
    }
    Source source{found->second.second, found->second.first};
    if (!fits(name, shape, source.tensor->entry.shape, naming, source)) {
      const CheckpointNaming::RowSlice* slice = row_slice(name, naming);
      mismatched.push_back(detail::concat(
          "\"", found->second.first, "\" is ", shape_text(source.tensor->entry.shape), " in ", source.tensor->file,
          ", the model's \"", name, "\" is ", shape_text(shape),
          slice ? detail::concat(" (rows ", slice->first, " to ", slice->first + slice->rows, " of ", slice->total, ")")
                : std::string()));
      continue;
    }
    out.emplace(name, source);
  }
  for (const auto& [name, source] : files)
    if (wanted.count(name) == 0) unexpected.push_back("\"" + source.first + "\" in " + source.second->file);

  if (missing.empty() && unexpected.empty() && mismatched.empty() && ambiguous.empty()) return out;
  std::ostringstream message;
  message << dir.path << ": the weights do not match the model (" << expected.size() << " parameters, "
          << dir.tensors.size() << " tensors in the files):";
  list_some(message, missing, "missing from the files");
  list_some(message, unexpected, "unexpected (the model has no such parameter)");
  list_some(message, mismatched, "with the wrong shape");
  list_some(message, ambiguous, "named twice under the family's aliases");
  throw Error(message.str());
}

// Non-finite weights would surface only as a NaN loss in step 1, blamed on the learning
// rate: refused here, naming the file (a converted value that overflows the parameter's
// dtype counts too).
void check_finite(const at::Tensor& loaded, int64_t begin, const std::string& path, const Source& s,
                  const std::string& name, at::ScalarType dtype) {
  if (loaded.isfinite().all().item<bool>()) return;
  const int64_t first = begin + loaded.isfinite().logical_not().nonzero()[0][0].item<int64_t>();
  MMSP_FAIL(path, ": tensor \"", s.file_name, "\" (parameter ", name, ") holds a NaN or infinite value at element ",
            first, " (as ", c10::toString(dtype),
            "): the file is damaged or was saved from a run that diverged; mmsp trains only from finite weights");
}

// The parameter's elements, from `offset` in the file tensor: pieces of at most
// kHfLoadPieceBytes through a small buffer, each copied or converted into its slice of the
// parameter. Even without a conversion this beats pread straight into the parameter: its
// pages are fresh (mmap'd, untouched), and the kernel faulting them in inside pread costs
// ~5x a user-space memcpy's faults here (mmap bench load: 1 GB bf16 on 4 ranks, 1.0 s vs 5.2 s).
void read_into(int fd, const std::string& path, const Source& s, int64_t offset, const at::Tensor& flat,
               at::Tensor& buffer, const std::string& name) {
  const at::ScalarType source = s.tensor->entry.scalar_type;
  const int64_t element = static_cast<int64_t>(c10::elementSize(source));
  const int64_t piece = static_cast<int64_t>(kHfLoadPieceBytes) / element;
  if (!buffer.defined()) buffer = at::empty({piece}, at::TensorOptions().dtype(source));
  const int64_t numel = flat.numel();
  for (int64_t begin = 0; begin < numel; begin += piece) {
    const int64_t n = std::min(piece, numel - begin);
    pread_exact(fd, buffer.data_ptr(), static_cast<uint64_t>(n * element),
                s.tensor->file_offset + static_cast<uint64_t>((offset + begin) * element), path);
    convert(buffer, flat, begin, n);
    check_finite(flat.narrow(0, begin, n), begin, path, s, name, flat.scalar_type());
  }
}

void load_one(int fd, const std::string& path, const Source& s, const at::Tensor& param, at::Tensor& buffer,
              const std::string& name) {
  const std::vector<int64_t>& file_shape = s.tensor->entry.shape;
  int64_t row = 1;
  for (size_t d = 1; d < file_shape.size(); ++d) row *= file_shape[d];
  const int64_t offset = s.first_row * row;
  if (!s.transposed) return read_into(fd, path, s, offset, param.detach().view({-1}), buffer, name);
  // The file's layout first (one parameter's worth), then swapped into the parameter's.
  at::Tensor staged = at::empty({param.size(0), file_shape[1], file_shape[2]}, param.options());
  read_into(fd, path, s, offset, staged.view({-1}), buffer, name);
  param.detach().copy_(staged.transpose(1, 2));
}

}  // namespace

std::map<std::string, const HfTensor*> match_hf_tensors(const HfDirectory& dir, const ExpectedShapes& expected,
                                                        const CheckpointNaming& naming) {
  std::map<std::string, const HfTensor*> out;
  for (const auto& [name, source] : match_sources(dir, expected, naming)) out.emplace(name, source.tensor);
  return out;
}

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

void load_hf_weights(const HfDirectory& dir, const std::vector<std::pair<std::string, at::Tensor>>& params,
                     const CheckpointNaming& naming) {
  // Parameters on a GPU: read into host tensors of their shape and dtype, then copy over
  // (the reads below write through data pointers, which must be host memory).
  bool on_device = false;
  for (const auto& [name, p] : params) on_device = on_device || (p.defined() && !p.device().is_cpu());
  if (on_device) {
    std::vector<std::pair<std::string, at::Tensor>> host;
    for (const auto& [name, p] : params)
      host.emplace_back(name,
                        p.defined() && !p.device().is_cpu() ? at::empty(p.sizes(), p.options().device(at::kCPU)) : p);
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
    MMSP_CHECK(p.defined() && p.device().is_cpu() && p.is_contiguous() && io::loadable_dtype(p.scalar_type()),
               "load_hf_weights: parameter \"", name,
               "\" must be a defined, contiguous tensor of float32/float64/bfloat16/float16, got ",
               p.defined() ? p.toString() : "undefined", p.defined() && !p.is_contiguous() ? " (not contiguous)" : "");
    expected.emplace_back(name, p.sizes().vec());
  }
  const std::map<std::string, Source> matched = match_sources(dir, expected, naming);

  // Open every shard before writing a parameter, so a file that vanished fails cleanly.
  std::map<std::string, Fd> fds;
  for (const auto& [name, s] : matched) {
    if (fds.count(s.tensor->file)) continue;
    const std::string path = join(dir.path, s.tensor->file);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    MMSP_CHECK(fd.get() >= 0, path, ": cannot open: ", errno_text());
    fds.emplace(s.tensor->file, std::move(fd));
  }

  at::NoGradGuard no_grad;
  std::map<at::ScalarType, at::Tensor> buffers;  // one conversion buffer per source dtype
  for (const auto& [name, param] : params) {
    const Source& s = matched.at(name);
    load_one(fds.at(s.tensor->file).get(), join(dir.path, s.tensor->file), s, param,
             buffers[s.tensor->entry.scalar_type], name);
  }
}

}  // namespace mmsp::hf
