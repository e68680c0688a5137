// What rank 0 reports of a run as it goes: each step's line (with where the run is, its ETA
// and the FLOP/s it achieves), metrics.jsonl and TensorBoard's event files under --out
// (DIR/tensorboard/), and each evaluation's line and rows. The other ranks report nothing.
// Private to train/.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>

#include "mmsp/train/memory/memory_estimate.h"
#include "mmsp/train/metrics.h"
#include "mmsp/train/tensorboard_writer.h"
#include "mmsp/train/train_options.h"

namespace mmsp::train {

class RunOutput {
 public:
  // `layout`: the model's parameters (the FLOP estimate's sizes); `first_step`, `last_step`:
  // the steps this call runs.
  RunOutput(const TrainOptions& o, const model::ModelConfig& config, const ParameterLayout& layout, bool rank0,
            int64_t first_step, int64_t last_step, std::ostream& log);
  void step(const StepMetrics& m);
  void eval(const EvalMetrics& e);

 private:
  const TrainOptions& o_;
  std::ostream& log_;
  bool rank0_;
  int64_t first_step_, last_step_;
  int64_t parameters_ = 0, trained_ = 0, layers_ = 0, hidden_ = 0;
  double seconds_ = 0;  // of the steps so far
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace mmsp::train
