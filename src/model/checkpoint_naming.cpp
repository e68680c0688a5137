// Which file names feed which of mmsp's parameters: each family says (its registry
// entry, model/families/<name>/); see checkpoint_naming.h.
#include "mmsp/model/checkpoint_naming.h"

#include "mmsp/model/family.h"

namespace mmsp::model {

hf::CheckpointNaming checkpoint_naming(const ModelConfig& config) {
  return family_for(config.model_type).checkpoint_naming(config);
}

hf::CheckpointNaming llava_layout_naming(bool tie_word_embeddings) {
  hf::CheckpointNaming naming;
  naming.prefix_aliases = {{"model.language_model.", "language_model.model."},
                           {"model.vision_tower.", "vision_tower."},
                           {"model.multi_modal_projector.", "multi_modal_projector."},
                           {"lm_head.", "language_model.lm_head."}};
  if (tie_word_embeddings) {
    naming.tied_input = "language_model.model.embed_tokens.weight";
    naming.tied_output = "language_model.lm_head.weight";
  }
  return naming;
}

}  // namespace mmsp::model
