// Which file names feed which of mmsp's parameters: each family says (its registry
// entry, model/families/<name>/); see checkpoint_naming.h.
#include "mmsp/model/checkpoint_naming.h"

#include "mmsp/model/family.h"

namespace mmsp::model {

CheckpointNaming checkpoint_naming(const ModelConfig& config) {
  return family_for(config.model_type).checkpoint_naming(config);
}

}  // namespace mmsp::model
