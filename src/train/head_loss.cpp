// The step's loss through the head as it is held; see head_loss.h.
#include "head_loss.h"

#include "mmsp/train/loss/chunked_loss.h"

namespace mmsp::train {
namespace {

// The rows a rank gives each round of a row-sharded head (the loss's rounds).
int64_t round_rows_of(const model::RowShardedWeight& head, const at::Tensor& hidden, int64_t loss_chunk,
                      int64_t tokens_per_rank) {
  return row_sharded_block(loss_chunk, tokens_per_rank, head.vocab(), static_cast<int>(head.ranks()),
                           head.width() * static_cast<int64_t>(hidden.element_size()),
                           static_cast<int64_t>(hidden.element_size()) + 12);
}

}  // namespace

at::Tensor head_loss(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk, int64_t tokens_per_rank) {
  // The head through the decoder: --shard parameters gathers its weight around the loss.
  // Under it the head is row-sharded: read in rounds of rows, never whole.
  return vlm.decoder().apply_head(
      [&](const at::Tensor& hidden, const at::Tensor& weight) {
        return chunked_lm_loss(hidden, weight, out.labels, out.label_count, loss_chunk);
      },
      out.hidden,
      [&](const at::Tensor& hidden, model::RowShardedWeight& head) {
        return chunked_lm_loss(hidden, head, out.labels, out.label_count,
                               round_rows_of(head, hidden, loss_chunk, tokens_per_rank));
      });
}

at::Tensor head_label_logprobs(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                               int64_t tokens_per_rank, double temperature) {
  return vlm.decoder().apply_head(
      [&](const at::Tensor& hidden, const at::Tensor& weight) {
        return chunked_label_logprobs(hidden, weight, out.labels, temperature, loss_chunk);
      },
      out.hidden,
      [&](const at::Tensor& hidden, model::RowShardedWeight& head) {
        return chunked_label_logprobs(hidden, head, out.labels, temperature,
                                      round_rows_of(head, hidden, loss_chunk, tokens_per_rank));
      });
}

at::Tensor head_label_values(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                             int64_t tokens_per_rank, double temperature) {
  return vlm.decoder().apply_head(
      [&](const at::Tensor& hidden, const at::Tensor& weight) {
        return chunked_label_values(hidden, weight, out.labels, temperature, loss_chunk);
      },
      out.hidden,
      [&](const at::Tensor& hidden, model::RowShardedWeight& head) {
        return chunked_label_values(hidden, head, out.labels, temperature,
                                    round_rows_of(head, hidden, loss_chunk, tokens_per_rank));
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
        return chunked_token_values(hidden, head, out.labels, temperature,
                                    round_rows_of(head, hidden, loss_chunk, tokens_per_rank));
      });
}

}  // namespace mmsp::train
