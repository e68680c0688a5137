// The decoder's attention kernel, measured on CUDA; see attention_choice.h.
#include "attention_choice.h"

#include "mmsp/attention/kernel_choice.h"

namespace mmsp::train {

attention::AttentionKernel decoder_attention_kernel(const TrainOptions& o, const RunInputs& in, const dist::Mesh& mesh,
                                                    std::ostream& log) {
  if (!o.parallel.attention_kernel.automatic() || !o.parallel.device.is_cuda()) return o.parallel.attention_kernel;
  const model::TextConfig& t = in.resolved.config.text;
  // What the local kernel sees: Ulysses gives each rank H/U query heads and its K/V heads
  // (repeated up to U when fewer), the ring a share of tokens_per_rank × U tokens.
  const int U = mesh.shape().ulysses;
  const int64_t heads = t.num_attention_heads / U;
  const int64_t kv_heads = t.num_key_value_heads >= U ? t.num_key_value_heads / U : 1;
  const attention::ChoiceKey key =
      attention::choice_key(o.inputs.dtype, heads, kv_heads, t.head_dim, o.inputs.tokens_per_rank * U, true);
  attention::ChoiceInputs inputs;
  inputs.device = o.parallel.device;
  inputs.agree = attention::agree_over(mesh.world());
  const attention::KernelChoice choice = attention::choose_kernel(key, inputs);
  if (mesh.rank() == 0 && !o.output.quiet)
    log << "--attention-kernel auto: " << choice.chosen->name() << " for " << key.text() << " on "
        << o.parallel.device.str() << " (probe against the blockwise kernel, then forward + backward timed; "
        << "every rank's slowest time):\n"
        << choice.table_text() << std::flush;
  return {choice.chosen};
}

}  // namespace mmsp::train
