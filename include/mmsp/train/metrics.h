// Per-step training metrics: one human line for the log, one JSON object per line
// for a metrics file, and an end-of-run summary. Measuring is the trainer's job.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mmsp::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;           // before clipping
  int64_t tokens = 0;               // real (unpadded) tokens in the global batch
  int64_t label_tokens = 0;         // tokens with a label in the global batch
  double attention_pairs = 0;       // causal (query, key) pairs of its sequences, Σ n(n+1)/2: attention's work
  double seconds = 0.0;             // the whole step, wall clock
  double vision_s = 0.0;            // parts of `seconds`: vision encoder,
  double attention_s = 0.0;         //   attention (local + its collectives),
  double communication_s = 0.0;     //   other communication (routing, grad sync),
  double other_s = 0.0;             //   everything else
  int64_t peak_bytes = 0;           // the largest rank's peak tensor memory during the step,
  int64_t update_peak_bytes = 0;    //   and during its weight update alone (gradient sync,
                                    //   clipping, AdamW, the model's copy);
  int64_t forward_peak_bytes = 0;   //   the same up to the loss (forward and loss),
  int64_t backward_peak_bytes = 0;  //   and in the backward alone: the preflight's moments
  int64_t comm_bytes = 0;           // bytes sent during the step by the rank that sent the most;
  int64_t attention_bytes = 0;      //   its parts by purpose: attention (ring and Ulysses groups),
  int64_t vision_bytes = 0;         //   vision routing (context group),
  int64_t grad_bytes = 0;           //   gradient sync and weight update (world and dp groups),
  int64_t expert_bytes = 0;         //   tokens to their experts' ranks and back (expert group)
  // Mixture-of-experts models: the (token, expert) rows each rank of the expert group ran
  // through its experts this step, summed over the sparse layers; the busiest rank's rows
  // over the mean, in the layer where that is largest (1: even); the same for the busiest
  // single expert. Empty / 0 for a dense model.
  std::vector<int64_t> expert_tokens;
  double expert_imbalance = 0;
  double hot_expert = 0;
  // An RL objective's figures (--objective grpo|ppo|dpo; docs/rl.md), by verl's and TRL's
  // names: "pg_loss", "kl", "pg_clipfrac"; DPO's "rewards/chosen", "rewards/rejected",
  // "rewards/accuracies", "rewards/margins". Empty for the cross-entropy.
  std::map<std::string, double> objective;
};

// JSON with the field names above; a non-finite double is written as null and read
// back as NaN. from_json requires every field but the byte parts, which files written
// before them lack (read as 0).
void to_json(nlohmann::json& j, const StepMetrics& m);
void from_json(const nlohmann::json& j, StepMetrics& m);

// "step 42 | loss 2.3456 | lr 3.00e-04 | gnorm 0.812 | 12345 tok/s | 1.234 s =
//  vision 10% attn 45% comm 20% other 25% | peak 1234.5 MiB |
//  sent 56.7 MiB (attn 40.1, vision 1.2, grad 15.4)"
std::string format_step_line(const StepMetrics& m);

// The step's figures as TensorBoard scalars (train/loss, train/lr, train/grad_norm,
// train/tokens_per_s, train/peak_mib, train/sent_mib, train/step_s), and an evaluation's
// (eval/loss).
std::vector<std::pair<std::string, float>> tensorboard_scalars(const StepMetrics& m);

// " | 3/100 | ETA 4m10s | 0.31 TFLOP/s, MFU 12.0%": where the run is, when it should end at
// the mean step time so far, and the model FLOPs the step's time achieves (an estimate: 2
// FLOPs a parameter a token forward, 4 backward of which 2 only where weights train, and
// causal attention's 12·h a layer a (query, key) pair); MFU against `peak_tflops` when given.
std::string format_progress(int64_t step, int64_t last_step, double mean_step_seconds, double step_flops,
                            double step_seconds, double peak_tflops);
// That estimate for a step of `tokens` tokens and `attention_pairs` pairs.
double step_flops(int64_t parameters, int64_t trained_parameters, int64_t layers, int64_t hidden, int64_t tokens,
                  double attention_pairs);

// Appends one JSON object per line to `path` (created if missing), flushed to the
// OS after each line, so every line written before a crash is in the file.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends one line (the file is opened, and a torn last line cut, at the first).
  void write(const StepMetrics& m);
  // Appends another kind of row (an evaluation's: EvalMetrics), the same way.
  void write(const nlohmann::json& row);
  const std::string& path() const { return path_; }
  // Bytes of a torn last line cut when the file was opened (0: none).
  long repaired_bytes() const { return repaired_bytes_; }

 private:
  void open();
  std::string path_;
  std::FILE* file_ = nullptr;
  long repaired_bytes_ = 0;
};

// The held-out set's loss after a step (--eval-data): a row of its own in metrics.jsonl,
// told from the steps' rows by its "eval_loss" key.
struct EvalMetrics {
  int64_t step = 0;   // the optimizer steps done when it was measured
  double loss = 0.0;  // mean cross-entropy over every label token of the file
  int64_t tokens = 0, label_tokens = 0;
  double seconds = 0.0;
};
void to_json(nlohmann::json& j, const EvalMetrics& m);
void from_json(const nlohmann::json& j, EvalMetrics& m);
// "eval after step 42 | loss 2.3456 | 123 label tokens | 0.812 s"
std::string format_eval_line(const EvalMetrics& m);
std::vector<std::pair<std::string, float>> tensorboard_scalars(const EvalMetrics& m);  // eval/loss

// Reads a file written by MetricsWriter (one StepMetrics per line; the evaluation rows are
// skipped: read_eval_metrics reads them); errors name the file and the line.
std::vector<StepMetrics> read_metrics(const std::string& path);
std::vector<EvalMetrics> read_eval_metrics(const std::string& path);

// A few lines for the end of a run: steps, loss (first / last / min), mean tokens/s
// and the mean time split over the steps after the first (the first pays for
// warm-up; with one step, that step), peak memory, total bytes sent.
std::string summary_table(const std::vector<StepMetrics>& steps);

// The same figures folded step by step, so that a run of any length holds a fixed amount
// of them (a soak of 4,000 steps grew each rank by ~0.15 MB keeping every StepMetrics).
class StepSummary {
 public:
  void add(const StepMetrics& m);
  int64_t count() const { return count_; }
  std::string table() const;  // summary_table's text

 private:
  StepMetrics first_, last_, lowest_;
  int64_t count_ = 0, peak_ = 0, sent_ = 0, attention_sent_ = 0, vision_sent_ = 0, grad_sent_ = 0;
  // sums over the steady steps: all but the first (the first alone when it is the only one)
  double seconds_ = 0, vision_ = 0, attention_ = 0, communication_ = 0, other_ = 0;
  int64_t tokens_ = 0;
};

}  // namespace mmsp::train
