// An RL objective's loss on a rank, with the figures it logs: each a share that sums over
// the ranks and the step's micro-batches to the step's figure (StepMetrics::objective).
// Private to train/.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace mmsp::train {

struct ObjectiveLoss {
  at::Tensor loss;                      // this rank's part of the step's loss, to backward
  std::map<std::string, double> parts;  // this rank's shares of the logged figures
};

}  // namespace mmsp::train
