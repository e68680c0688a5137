// The decoder's attention for one rank's step, planned from the step's groups: the model
// takes a planned attention::StepAttention (model::decoder_context) and never sees a
// group; this is where the groups become one.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "mmsp/attention/local_attention.h"
#include "mmsp/attention/step_attention.h"
#include "mmsp/model/config/text_config.h"
#include "mmsp/model/layers/decoder.h"
#include "mmsp/model/rank_inputs.h"
#include "mmsp/plan/model_conventions.h"

namespace mmsp::parallel {

// The attention of one rank's step for a decoder of `text`, planned once from `groups`
// and `inputs`' ring shares (and, for hybrid decoders, Gated DeltaNet's ring runs and
// index for `linear_chunk`); masks and indices on `device`.
std::shared_ptr<const attention::StepAttention> plan_decoder_attention(
    const model::RankInputs& inputs, const model::TextConfig& text, const attention::ContextGroups& groups,
    const attention::AttentionOptions& attention, const at::Device& device,
    int64_t linear_chunk = attention::kGatedDeltaChunk);

// plan_decoder_attention and model::decoder_context in one call, in the dtype and on the
// device of `like` (decoder-only tests and benchmarks).
model::DecoderContext decoder_context(const model::RankInputs& inputs, const model::TextConfig& text,
                                      const plan::ModelConventions& conventions, const attention::ContextGroups& groups,
                                      const attention::AttentionOptions& attention, const at::Tensor& like,
                                      int64_t linear_chunk = attention::kGatedDeltaChunk);

}  // namespace mmsp::parallel
