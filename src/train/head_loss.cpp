// The step's loss through the head as it is held; see head_loss.h.
#include "head_loss.h"

#include "mmsp/train/loss/chunked_loss.h"

namespace mmsp::train {

at::Tensor head_loss(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk, int64_t tokens_per_rank) {
  // The head through the decoder: --shard parameters gathers its weight around the loss.
  // Under it the head is row-sharded: read in rounds of rows, never whole.
  return vlm.decoder().apply_head(
      [&](const at::Tensor& hidden, const at::Tensor& weight) {
        return chunked_lm_loss(hidden, weight, out.labels, out.label_count, loss_chunk);
      },
      out.hidden,
      [&](const at::Tensor& hidden, model::RowShardedWeight& head) {
        return chunked_lm_loss(
            hidden, head, out.labels, out.label_count,
            row_sharded_block(loss_chunk, tokens_per_rank, head.vocab(), static_cast<int>(head.ranks()),
                              head.width() * static_cast<int64_t>(hidden.element_size()),
                              static_cast<int64_t>(hidden.element_size()) + 12));
      });
}

at::Tensor head_token_values(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                             int64_t tokens_per_rank, double temperature) {
  return vlm.decoder().apply_head(
      [&](const at::Tensor& hidden, const at::Tensor& weight) {
        return chunked_token_values(hidden, weight, out.labels, temperature, loss_chunk);
      },
      out.hidden,
      [&](const at::Tensor& hidden, model::RowShardedWeight& head) {
        return chunked_token_values(
            hidden, head, out.labels, temperature,
            row_sharded_block(loss_chunk, tokens_per_rank, head.vocab(), static_cast<int>(head.ranks()),
                              head.width() * static_cast<int64_t>(hidden.element_size()),
                              static_cast<int64_t>(hidden.element_size()) + 12));
      });
}

}  // namespace mmsp::train
