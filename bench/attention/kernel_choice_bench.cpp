// The measured kernel choice as a benchmark; see kernel_choice_bench.h.
#include "kernel_choice_bench.h"

#include "mmsp/attention/kernel_choice.h"
#include "mmsp/core/check.h"

namespace mmsp::bench {

nlohmann::json bench_kernel_choice(const FusedAttentionBenchOptions& o) {
  MMSP_CHECK(o.repeats > 0, "--repeats ", o.repeats, " must be positive");
  attention::ChoiceInputs in;
  in.device = o.device;
  in.repeats = o.repeats;
  for (const attention::LocalKernel* k : attention::local_kernels()) in.candidates.push_back(k);
  nlohmann::json choices = nlohmann::json::array();
  for (int64_t T : o.tokens) {
    const attention::ChoiceKey key = attention::choice_key(bench_dtype(o.dtype), o.heads, o.kv_heads, o.dim, T, true);
    in.timing_tokens = T;  // the length asked for, not its bucket
    const attention::KernelChoice c = attention::choose_kernel(key, in);
    nlohmann::json rows = nlohmann::json::array();
    for (const attention::CandidateRow& r : c.table)
      rows.push_back({{"kernel", r.kernel},
                      {"implementation", r.implementation},
                      {"passed", r.passed},
                      {"reason", r.reason},
                      {"out_error", r.out_error},
                      {"lse_error", r.lse_error},
                      {"grad_error", r.grad_error},
                      {"seconds", r.seconds}});
    choices.push_back({{"tokens", T},
                       {"key", key.text()},
                       {"chosen", c.chosen->name()},
                       {"table", rows},
                       {"table_text", c.table_text()}});
  }
  return {{"device", o.device.str()}, {"dtype", o.dtype}, {"choices", choices}};
}

}  // namespace mmsp::bench
