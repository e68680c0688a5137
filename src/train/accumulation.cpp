// A step's micro-batches; see accumulation.h.
#include "accumulation.h"

#include <string>

namespace mmsp::train {

StepFingerprint StepBatches::fingerprint() const {
  if (micro.size() == 1) return step_fingerprint(micro[0].samples, micro[0].batch, micro[0].plan);
  StepFingerprint all;
  for (size_t k = 0; k < micro.size(); ++k)
    for (FingerprintField f : step_fingerprint(micro[k].samples, micro[k].batch, micro[k].plan)) {
      f.name += "[" + std::to_string(k) + "]";
      all.push_back(std::move(f));
    }
  return all;
}

StepBatches plan_step_batches(const Dataset& data, const StepPacker& packer, const StepWatch& watch,
                              const plan::ModelConventions& conventions, const plan::PlanOptions& options, int rank,
                              int64_t count, DataPosition& position) {
  StepBatches out;
  for (int64_t k = 0; k < count; ++k) {
    MicroBatch m;
    m.samples = watch.samples(packer.next_step(position));
    m.batch = make_batch(data, m.samples);
    m.plan = plan::make_step_plan(m.batch, conventions, options, rank);
    out.label_count += m.plan.label_count;
    out.micro.push_back(std::move(m));
  }
  return out;
}

void count_step_batches(StepMetrics& m, const StepBatches& batches) {
  m.tokens = 0;
  m.attention_pairs = 0;
  for (const MicroBatch& micro : batches.micro)
    for (const auto& s : micro.batch.sequences) {
      const double n = static_cast<double>(s.input_ids.size());
      m.tokens += static_cast<int64_t>(s.input_ids.size());
      m.attention_pairs += 0.5 * n * (n + 1);
    }
  m.label_tokens = batches.label_count;
}

}  // namespace mmsp::train
