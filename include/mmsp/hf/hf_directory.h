// Hugging Face model directories, the layout `save_pretrained` writes: config.json plus
// either one model.safetensors or shards model-0000k-of-0000n.safetensors listed in
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: file}}).
// Opening reads config.json, the index and every shard's header, and checks them against
// each other without reading tensor data; loading then preads each tensor's bytes once,
// in small pieces that are copied or converted into the destination. Which tensor belongs to which
// parameter (the family's naming conventions, tied embeddings) comes from the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "mmsp/hf/safetensors.h"

namespace mmsp::hf {

constexpr const char* kHfConfigFile = "config.json";
constexpr const char* kHfSingleFile = "model.safetensors";
constexpr const char* kHfIndexFile = "model.safetensors.index.json";
// transformers' default max_shard_size ("5GB" = 5 * 10^9 bytes).
constexpr uint64_t kHfDefaultShardBytes = 5'000'000'000ULL;
// Loading reads each tensor in pieces of at most this many bytes into a small buffer
// and copies or converts each into the parameter (the only extra memory a load needs,
// per source dtype); 1 MiB stays in L2, so each piece is used from cache right after
// it is read.
constexpr uint64_t kHfLoadPieceBytes = 1ULL << 20;

// One tensor of the directory: the shard holding it and where its bytes are.
struct HfTensor {
  std::string file;        // shard file name, relative to the directory
  SafetensorsEntry entry;  // dtype, shape, offsets within the shard's data section
  uint64_t file_offset;    // absolute byte offset of the tensor's data in the shard
  uint64_t bytes() const { return entry.data_end - entry.data_begin; }
};

// A checked directory: every shard exists and its header is valid, the index and the
// shards agree name for name, no name is in two shards, total_size is the sum of the
// tensors' bytes, and every dtype is one a model can be loaded from (F32, F16, BF16,
// F64). Errors name the directory, the file and the value.
struct HfDirectory {
  std::string path;                         // the directory as given
  std::string config_json;                  // config.json's text
  std::map<std::string, HfTensor> tensors;  // by the file's names
  std::vector<std::string> files;           // shard files, in order
  bool indexed = false;                     // has model.safetensors.index.json
  uint64_t total_bytes = 0;                 // tensor data bytes, all shards
  bool checksums_verified = false;          // its checksums.json was there and matched
  std::string checksums_xxh64;              // that manifest's own checksum ("" without one)
  // The dtype that holds the most bytes (the "dtype the model was loaded in").
  at::ScalarType dominant_dtype() const;
};

// True when `path` is a directory holding config.json (a candidate HF model dir).
bool is_hf_directory(const std::string& path);

// Opens and checks `dir` (reads headers only; see HfDirectory). When `dir` holds
// checksums.json, every file it lists is verified first (a mismatch names the file).
HfDirectory open_hf_directory(const std::string& dir);

// How a family's parameter names relate to the names in released files.
struct CheckpointNaming {
  // (file prefix, model prefix): a file name that begins with a file prefix is read as
  // the model's name with the prefix replaced (first match wins), e.g. Qwen2-VL's
  // legacy "visual." for the new "model.visual.". Names that match no pair are taken
  // as they are.
  std::vector<std::pair<std::string, std::string>> prefix_aliases;
  // File tensors dropped without a word (transformers' _keys_to_ignore_on_load_unexpected,
  // e.g. Qwen3.5's multi-token-prediction head "mtp.").
  std::vector<std::string> ignored_prefixes;
  // Tied embeddings (tie_word_embeddings): the model has no parameter `tied_output`
  // (e.g. "lm_head.weight"); a file tensor of that name is ignored when `tied_input`
  // ("model.embed_tokens.weight") is in the file, and read into it when it is not.
  // Empty: not tied.
  std::string tied_output, tied_input;
  // File tensors of rank 3 that may come with their last two dimensions swapped: model names
  // ending in one of these read either layout, transposed on load into the model's
  // (transformers >= 5 writes Qwen3-VL-MoE's fused experts as [E, 2I, h] where the released
  // files hold [E, h, 2I], and reads both). A shape that is the same both ways reads as the model's.
  std::vector<std::string> transposable_suffixes;
  // Parameters holding rows [first, first + rows) of their file tensor's first dimension,
  // which has `total` rows (expert parallelism: a rank's experts of a fused expert tensor),
  // by the end of their model names.
  struct RowSlice {
    int64_t first = 0, rows = 0, total = 0;
  };
  std::vector<std::pair<std::string, RowSlice>> row_slices;
  // Tensors of parameters other ranks hold (expert parallelism: the other experts' weights),
  // by model name: skipped rather than unexpected. Unset: none.
  std::function<bool(const std::string& model_name)> held_elsewhere;
};

// The model's parameters by name with their shapes (values unused: meta tensors do).
using ExpectedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// For every expected parameter, the directory's tensor that feeds it (whole, or its rows
// and layout as the naming's row_slices and transposable_suffixes say). Throws one
// mmsp::Error that lists every missing tensor, every unexpected one and every shape
// mismatch (the first few of each, with counts), naming the directory.
std::map<std::string, const HfTensor*> match_hf_tensors(const HfDirectory& dir, const ExpectedShapes& expected,
                                                        const CheckpointNaming& naming);

// Matches (as above) and reads each tensor into the parameter of the same name,
// converting its dtype to the parameter's. Parameters are CPU, contiguous, floating.
// Reads each tensor once with pread, in bounded pieces copied or converted into the
// parameter, so the extra memory is small against the parameters. Throws before any parameter changes if
// the match fails.
void load_hf_weights(const HfDirectory& dir, const std::vector<std::pair<std::string, at::Tensor>>& params,
                     const CheckpointNaming& naming);

// Elements [offset, offset + length) of the flattened tensor `name` (the directory's own
// name), in the file's dtype; reads only those bytes (a sharded optimizer's resume).
at::Tensor read_hf_elements(const HfDirectory& dir, const std::string& name, int64_t offset, int64_t length);

// Shard plan exactly as huggingface_hub's split_torch_state_dict_into_shards (used by
// transformers' save_pretrained): tensors taken in the given order; one larger than
// max_shard_bytes is a shard of its own; otherwise a tensor that would take the
// current shard over the limit starts a new one. Returns the shards, each a list of
// indices into `sizes`.
std::vector<std::vector<size_t>> plan_hf_shards(const std::vector<uint64_t>& sizes, uint64_t max_shard_bytes);

struct HfSaveOptions {
  uint64_t max_shard_bytes = kHfDefaultShardBytes;
  std::optional<at::ScalarType> dtype;  // convert floating tensors to it; unset: as they are
  // Called with the size of every piece as it is written, in write order (the
  // checkpoint's crash-test hook counts bytes through it). Unset: nothing.
  std::function<void(uint64_t bytes)> progress;
};

// Writes `dir` (created; must not exist or be empty) the way save_pretrained does:
// config.json (the text given, with "torch_dtype" set to the saved dtype), then one
// model.safetensors when everything fits one shard, else model-0000k-of-0000n.safetensors
// in name order and model.safetensors.index.json (sorted keys, indent 2). Each file is
// written to a temporary name, fsync'd and renamed; then checksums.json, the XXH64 of
// every file as written (hf/checksum_manifest.h; transformers ignores it); the
// directory is fsync'd last.
void save_hf_directory(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::string& config_json, const HfSaveOptions& options = {});

}  // namespace mmsp::hf
