// Which file names feed which of mmsp's parameters, per family. mmsp names parameters
// as the model's own module tree does (qwen_vl.cpp, llava.cpp); the aliases below let
// a directory in either transformers layout load, as transformers' own
// _checkpoint_conversion_mapping does when it reads an older file.
#include "mmsp/model/checkpoint_naming.h"

#include "mmsp/core/check.h"

namespace mmsp::model {

CheckpointNaming checkpoint_naming(const ModelConfig& config) {
  CheckpointNaming naming;
  std::string embedding;
  const std::string& type = config.model_type;
  if (type == "qwen2_vl" || type == "qwen2_5_vl") {
    // mmsp: visual.*, model.*, lm_head.* (the released files' layout). transformers
    // >= 4.52 names them model.visual.*, model.language_model.*, lm_head.* and maps
    // the released layout in through
    //   _checkpoint_conversion_mapping = {"^visual": "model.visual",
    //       r"^model(?!\.(language_model|visual))": "model.language_model"}
    // (models/qwen2_vl/modeling_qwen2_vl.py, qwen2_5_vl likewise); here the reverse.
    naming.prefix_aliases = {{"model.visual.", "visual."}, {"model.language_model.", "model."}};
    embedding = "model.embed_tokens.weight";
  } else if (type == "qwen3_vl" || type == "qwen3_5") {
    // mmsp and the released Qwen3-VL / Qwen3.5 files: model.visual.*,
    // model.language_model.*, lm_head.*. The Qwen2-VL-style legacy layout (visual.*,
    // model.*) is accepted too, as transformers' conversion mapping accepts it for
    // Qwen2-VL: the identity pairs come first so that "model.visual." is not read as
    // a legacy "model." name.
    naming.prefix_aliases = {{"model.visual.", "model.visual."},
                             {"model.language_model.", "model.language_model."},
                             {"visual.", "model.visual."},
                             {"model.", "model.language_model."}};
    embedding = "model.language_model.embed_tokens.weight";
    // Qwen3.5's multi-token-prediction head: transformers drops it on load
    // (_keys_to_ignore_on_load_unexpected = [r"^mtp.*"], models/qwen3_5).
    if (type == "qwen3_5") naming.ignored_prefixes = {"mtp."};
  } else if (type == "llava" || type == "internvl") {
    // mmsp and the released llava-1.5-*-hf files: vision_tower.*, multi_modal_projector.*,
    // language_model.model.*, language_model.lm_head.*. transformers >= 4.52 names them
    // model.vision_tower.*, model.multi_modal_projector.*, model.language_model.*,
    // lm_head.* and reads the released ones through
    //   _checkpoint_conversion_mapping = {"^language_model.model": "model.language_model",
    //       "^vision_tower": "model.vision_tower",
    //       "^multi_modal_projector": "model.multi_modal_projector",
    //       "^language_model.lm_head": "lm_head"}
    // (models/llava/modeling_llava.py; models/internvl/modeling_internvl.py the same); here the reverse.
    naming.prefix_aliases = {{"model.language_model.", "language_model.model."},
                             {"model.vision_tower.", "vision_tower."},
                             {"model.multi_modal_projector.", "multi_modal_projector."},
                             {"lm_head.", "language_model.lm_head."}};
    embedding = "language_model.model.embed_tokens.weight";
  } else {
    MMSP_CHECK(false, "model_type \"", type, "\" has no checkpoint naming; supported: qwen2_vl, ",
               "qwen2_5_vl, qwen3_vl, qwen3_5, llava, internvl");
  }
  if (config.tie_word_embeddings) {
    naming.tied_input = embedding;
    naming.tied_output = type == "llava" || type == "internvl" ? "language_model.lm_head.weight" : "lm_head.weight";
  }
  return naming;
}

}  // namespace mmsp::model
