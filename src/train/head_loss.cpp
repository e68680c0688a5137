// The step's loss through the head as it is held; see head_loss.h.
#include "head_loss.h"

#include "mmsp/train/loss/chunked_loss.h"

namespace mmsp::train {
namespace {

// `f(hidden, head, block)` on the head as the decoder holds it: whole (`head` its weight,
// `block` the loss chunk; --shard parameters gathers it around the call), or row-sharded
// under --shard parameters (`head` the table, `block` the rows a rank gives each round, so
// that it is read in rounds of rows, never whole). `f` takes either (a generic lambda).
template <typename F>
at::Tensor on_head(const model::Vlm& vlm, const at::Tensor& hidden, int64_t loss_chunk, int64_t tokens_per_rank,
                   const F& f) {
  return vlm.decoder().apply_head(
      [&](const at::Tensor& h, const at::Tensor& weight) { return f(h, weight, loss_chunk); }, hidden,
      [&](const at::Tensor& h, model::RowShardedWeight& head) {
        const int64_t block =
            row_sharded_block(loss_chunk, tokens_per_rank, head.vocab(), static_cast<int>(head.ranks()),
                              head.width() * h.element_size(), h.element_size() + 12);
        return f(h, head, block);
      });
}

}  // namespace

at::Tensor head_loss(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk, int64_t tokens_per_rank) {
  return on_head(vlm, out.hidden, loss_chunk, tokens_per_rank, [&](const at::Tensor& h, auto& head, int64_t block) {
    return chunked_lm_loss(h, head, out.labels, out.label_count, block);
  });
}

at::Tensor head_label_logprobs(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                               int64_t tokens_per_rank, double temperature) {
  return on_head(vlm, out.hidden, loss_chunk, tokens_per_rank, [&](const at::Tensor& h, auto& head, int64_t block) {
    return chunked_label_logprobs(h, head, out.labels, temperature, block);
  });
}

at::Tensor head_label_values(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                             int64_t tokens_per_rank, double temperature) {
  return on_head(vlm, out.hidden, loss_chunk, tokens_per_rank, [&](const at::Tensor& h, auto& head, int64_t block) {
    return chunked_label_values(h, head, out.labels, temperature, block);
  });
}

at::Tensor head_token_values(const model::Vlm& vlm, const model::StepOutput& out, int64_t loss_chunk,
                             int64_t tokens_per_rank, double temperature) {
  return on_head(vlm, out.hidden, loss_chunk, tokens_per_rank, [&](const at::Tensor& h, auto& head, int64_t block) {
    return chunked_token_values(h, head, out.labels, temperature, block);
  });
}

}  // namespace mmsp::train
