// Rank 0's reports of a run; see run_output.h.
#include "run_output.h"

#include <filesystem>

namespace mmsp::train {

RunOutput::RunOutput(const TrainOptions& o, const model::ModelConfig& config, const ParameterLayout& layout, bool rank0,
                     int64_t first_step, int64_t last_step, std::ostream& log)
    : o_(o), log_(log), rank0_(rank0), first_step_(first_step), last_step_(last_step) {
  for (size_t i = 0; i < layout.shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : layout.shapes[i].second) n *= d;
    parameters_ += n;
    if (layout.frozen.empty() || !layout.frozen[i]) trained_ += n;
  }
  layers_ = config.text.num_hidden_layers;
  hidden_ = config.text.hidden_size;
  if (!rank0_ || o.output.out.empty()) return;
  std::filesystem::create_directories(o.output.out);
  metrics_ = std::make_unique<MetricsWriter>(o.output.out + "/metrics.jsonl");
  tensorboard_ = std::make_unique<TensorBoardWriter>(o.output.out + "/tensorboard");
}

void RunOutput::step(const StepMetrics& m) {
  if (!rank0_) return;
  seconds_ += m.seconds;
  if (!o_.output.quiet) {
    const double mean = seconds_ / static_cast<double>(m.step - first_step_ + 1);
    const double flops = step_flops(parameters_, trained_, layers_, hidden_, m.tokens, m.attention_pairs);
    log_ << format_step_line(m) << format_progress(m.step, last_step_, mean, flops, m.seconds, o_.output.peak_tflops)
         << std::endl;
  }
  if (metrics_) {
    metrics_->write(m);
    // at the run's first step, the note of a torn last line a crash had left (cut when opened)
    if (metrics_->repaired_bytes() > 0 && m.step == first_step_)
      log_ << "note: " << metrics_->path() << ": cut the torn last line (" << metrics_->repaired_bytes()
           << " bytes) a crash had left" << std::endl;
  }
  if (tensorboard_) tensorboard_->scalars(m.step, tensorboard_scalars(m));
}

void RunOutput::eval(const EvalMetrics& e) {
  if (!rank0_) return;
  if (!o_.output.quiet) log_ << format_eval_line(e) << std::endl;
  if (metrics_) metrics_->write(nlohmann::json(e));
  if (tensorboard_) tensorboard_->scalars(e.step, tensorboard_scalars(e));
}

}  // namespace mmsp::train
