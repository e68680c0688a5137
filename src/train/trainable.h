// The model on this rank, identical on every rank, as parts (torchtitan's model_parts: one
// part today, a pipeline's stages later), each spread over the mesh by parallel::parallelize,
// and their weight update (AdamW over the masters, replicated or over ZeRO's shards), with
// the model directory's weights when given. What parallelize installed is taken off when
// the Trainable goes, before the update and the model (an RAII guard), on every exit path.
// Private to train/.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "mmsp/dist/mesh.h"
#include "mmsp/model/vlm.h"
#include "mmsp/parallel/parallelize.h"
#include "mmsp/train/weight_update.h"
#include "run_inputs.h"

namespace mmsp::train {

// Takes off what parallelize installed on a part (its hooks hold the sharded model) when it
// goes: declared after the update, it goes first.
class Parallelized {
 public:
  explicit Parallelized(std::shared_ptr<model::Vlm> part) : part_(std::move(part)) {}
  Parallelized(const Parallelized&) = delete;
  Parallelized& operator=(const Parallelized&) = delete;
  Parallelized(Parallelized&& other) noexcept : part_(std::move(other.part_)) {}
  ~Parallelized() {
    if (part_) parallel::unparallelize(*part_);
  }

 private:
  std::shared_ptr<model::Vlm> part_;
};

struct Trainable {
  std::vector<std::shared_ptr<model::Vlm>> model_parts;  // one until pipeline stages exist
  std::vector<parallel::ModelParallelism> parallelisms;  // [part]
  std::unique_ptr<WeightUpdate> update;                  // over every part's parameters
  std::vector<Parallelized> installed;                   // [part]: goes first, then the update

  // The one part a step runs (a pipeline schedule would run them in turn).
  const model::Vlm& model() const { return *model_parts.front(); }
  const parallel::ModelParallelism& parallelism() const { return parallelisms.front(); }
};

// The groups the model is spread over, by name from the mesh: the step's (context, ring,
// ulysses) and the one whose ranks sum each weight's gradient (the world: dp × context).
parallel::ParallelizeOptions parallelize_options(const TrainOptions& o, const dist::Mesh& mesh);

// `decoder_kernel`: the decoder's local attention kernel (attention_choice.h); by default
// --attention-kernel's.
Trainable build_trainable(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh,
                          std::optional<attention::AttentionKernel> decoder_kernel = std::nullopt);

}  // namespace mmsp::train
