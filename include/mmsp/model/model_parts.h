// The parts of a vision-language model a fine-tuning run freezes or trains (--freeze), as
// LLaMA-Factory (freeze_vision_tower, freeze_multi_modal_projector, freeze_language_model)
// and ms-swift (freeze_vit, freeze_aligner, freeze_llm) name them. Which parameter is in
// which part comes from the model's structure (the decoder's own parameters) and, inside
// the tower, from the projector's names each family gives it; what freezing does with
// them (no gradient, no master, no optimizer state, no reduction) is train/'s business.
#pragma once

#include <string>
#include <vector>

#include "mmsp/model/named_params.h"

namespace mmsp::model {

class Vlm;

enum class ModelPart {
  vision,      // the vision encoder: patch embedding, position table, blocks, its norms
  merger,      // what maps its rows into the decoder's width: Qwen's merger (and Qwen3-VL's
               // deepstack mergers), LLaVA's and InternVL's multi_modal_projector
  llm,         // the decoder's layers, final norm and untied LM head
  embeddings,  // the token embedding (with a tied LM head, the head too: one tensor)
};

std::string to_string(ModelPart part);
// "vision,merger": each named once; an unknown or repeated name is an error naming it and
// the parts there are. Empty: none.
std::vector<ModelPart> parse_model_parts(const std::string& list, const std::string& flag = "--freeze");
std::string to_string(const std::vector<ModelPart>& parts);  // "vision,merger"; "" for none

// The part of each of `params` (the model's named_parameters(), in order).
std::vector<ModelPart> parameter_parts(const Vlm& vlm, const NamedParams& params);

}  // namespace mmsp::model
