// The decoder's attention planned from a step's groups; see decoder_attention.h.
#include "mmsp/parallel/decoder_attention.h"

#include <optional>

namespace mmsp::parallel {

std::shared_ptr<const attention::StepAttention> plan_decoder_attention(const model::RankInputs& in,
                                                                       const model::TextConfig& text,
                                                                       const attention::ContextGroups& groups,
                                                                       const attention::AttentionOptions& attention,
                                                                       const at::Device& device, int64_t linear_chunk) {
  std::optional<attention::LinearAttentionShape> linear;
  for (int64_t i = 0; i < text.num_hidden_layers; ++i)
    if (text.layer_kind(i) == model::LayerKind::linear_attention) linear = {text.linear_conv_kernel_dim, linear_chunk};
  return attention::plan_step_attention(groups, in.ring_shares, attention, device, linear, in.split_slots);
}

model::DecoderContext decoder_context(const model::RankInputs& in, const model::TextConfig& text,
                                      const plan::ModelConventions& conventions, const attention::ContextGroups& groups,
                                      const attention::AttentionOptions& attention, const at::Tensor& like,
                                      int64_t linear_chunk) {
  return model::decoder_context(in, text, conventions,
                                plan_decoder_attention(in, text, groups, attention, like.device(), linear_chunk), like,
                                linear_chunk);
}

}  // namespace mmsp::parallel
