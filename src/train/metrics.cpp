// Step metrics as text and JSON lines; see metrics.h.
#include "mmsp/train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <fstream>
#include <limits>

#include "mmsp/core/check.h"

namespace mmsp::train {
namespace {

using nlohmann::json;

constexpr double kMiB = 1024.0 * 1024.0;

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buffer[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buffer, sizeof buffer, fmt, args);
  va_end(args);
  return buffer;
}

double read_double(const json& j, const char* key) {
  const json& v = j.at(key);
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
}

double percent(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

}  // namespace

void to_json(json& j, const StepMetrics& m) {
  // nlohmann writes NaN and ±inf as null.
  j = json{{"step", m.step},
           {"loss", m.loss},
           {"lr", m.lr},
           {"grad_norm", m.grad_norm},
           {"tokens", m.tokens},
           {"label_tokens", m.label_tokens},
           {"attention_pairs", m.attention_pairs},
           {"seconds", m.seconds},
           {"vision_s", m.vision_s},
           {"attention_s", m.attention_s},
           {"communication_s", m.communication_s},
           {"other_s", m.other_s},
           {"peak_bytes", m.peak_bytes},
           {"update_peak_bytes", m.update_peak_bytes},
           {"forward_peak_bytes", m.forward_peak_bytes},
           {"backward_peak_bytes", m.backward_peak_bytes},
           {"comm_bytes", m.comm_bytes},
           {"attention_bytes", m.attention_bytes},
           {"vision_bytes", m.vision_bytes},
           {"grad_bytes", m.grad_bytes}};
  if (m.expert_bytes) j["expert_bytes"] = m.expert_bytes;
  if (!m.expert_tokens.empty()) {
    j["expert_tokens"] = m.expert_tokens;
    j["expert_imbalance"] = m.expert_imbalance;
    j["hot_expert"] = m.hot_expert;
  }
  if (!m.objective.empty()) j["objective"] = m.objective;
}

void from_json(const json& j, StepMetrics& m) {
  m.step = j.at("step").get<int64_t>();
  m.loss = read_double(j, "loss");
  m.lr = read_double(j, "lr");
  m.grad_norm = read_double(j, "grad_norm");
  m.tokens = j.at("tokens").get<int64_t>();
  m.label_tokens = j.at("label_tokens").get<int64_t>();
  m.seconds = read_double(j, "seconds");
  m.vision_s = read_double(j, "vision_s");
  m.attention_s = read_double(j, "attention_s");
  m.communication_s = read_double(j, "communication_s");
  m.other_s = read_double(j, "other_s");
  m.peak_bytes = j.at("peak_bytes").get<int64_t>();
  m.comm_bytes = j.at("comm_bytes").get<int64_t>();
  // Files written before the split by purpose (and by phase) lack these.
  m.update_peak_bytes = j.value("update_peak_bytes", int64_t{0});
  m.forward_peak_bytes = j.value("forward_peak_bytes", int64_t{0});
  m.backward_peak_bytes = j.value("backward_peak_bytes", int64_t{0});
  m.attention_pairs = j.value("attention_pairs", 0.0);
  m.attention_bytes = j.value("attention_bytes", int64_t{0});
  m.vision_bytes = j.value("vision_bytes", int64_t{0});
  m.grad_bytes = j.value("grad_bytes", int64_t{0});
  m.expert_bytes = j.value("expert_bytes", int64_t{0});  // mixture-of-experts runs only
  m.expert_tokens = j.value("expert_tokens", std::vector<int64_t>{});
  m.expert_imbalance = j.value("expert_imbalance", 0.0);
  m.hot_expert = j.value("hot_expert", 0.0);
  m.objective = j.value("objective", std::map<std::string, double>{});  // RL objectives only
}

std::string format_step_line(const StepMetrics& m) {
  const double tok_s = m.seconds > 0 ? static_cast<double>(m.tokens) / m.seconds : 0.0;
  return format(
      "step %lld | loss %.4f | lr %.2e | gnorm %.3g | %.0f tok/s | %.3f s = vision %.0f%% "
      "attn %.0f%% comm %.0f%% other %.0f%% | peak %.1f MiB | sent %.1f MiB (attn %.1f, vision %.1f, grad %.1f)",
      static_cast<long long>(m.step), m.loss, m.lr, m.grad_norm, tok_s, m.seconds, percent(m.vision_s, m.seconds),
      percent(m.attention_s, m.seconds), percent(m.communication_s, m.seconds), percent(m.other_s, m.seconds),
      static_cast<double>(m.peak_bytes) / kMiB, static_cast<double>(m.comm_bytes) / kMiB,
      static_cast<double>(m.attention_bytes) / kMiB, static_cast<double>(m.vision_bytes) / kMiB,
      static_cast<double>(m.grad_bytes) / kMiB);
}

std::vector<std::pair<std::string, float>> tensorboard_scalars(const StepMetrics& m) {
  const double tok_s = m.seconds > 0 ? static_cast<double>(m.tokens) / m.seconds : 0.0;
  return {{"train/loss", static_cast<float>(m.loss)},
          {"train/lr", static_cast<float>(m.lr)},
          {"train/grad_norm", static_cast<float>(m.grad_norm)},
          {"train/tokens_per_s", static_cast<float>(tok_s)},
          {"train/peak_mib", static_cast<float>(static_cast<double>(m.peak_bytes) / kMiB)},
          {"train/sent_mib", static_cast<float>(static_cast<double>(m.comm_bytes) / kMiB)},
          {"train/step_s", static_cast<float>(m.seconds)}};
}

std::vector<std::pair<std::string, float>> tensorboard_scalars(const EvalMetrics& m) {
  return {{"eval/loss", static_cast<float>(m.loss)}};
}

double step_flops(int64_t parameters, int64_t trained_parameters, int64_t layers, int64_t hidden, int64_t tokens,
                  double attention_pairs) {
  return static_cast<double>(tokens) *
             (4.0 * static_cast<double>(parameters) + 2.0 * static_cast<double>(trained_parameters)) +
         12.0 * static_cast<double>(layers) * static_cast<double>(hidden) * attention_pairs;
}

std::string format_progress(int64_t step, int64_t last_step, double mean_step_seconds, double flops,
                            double step_seconds, double peak_tflops) {
  const auto left = static_cast<int64_t>(mean_step_seconds * static_cast<double>(last_step - step) + 0.5);
  std::string eta =
      left >= 3600
          ? format("%lldh%02lldm", static_cast<long long>(left / 3600), static_cast<long long>(left % 3600 / 60))
          : format("%lldm%02llds", static_cast<long long>(left / 60), static_cast<long long>(left % 60));
  const double tflops = step_seconds > 0 ? flops / step_seconds / 1e12 : 0.0;
  std::string out = format(" | %lld/%lld | ETA %s | %.3g TFLOP/s", static_cast<long long>(step),
                           static_cast<long long>(last_step), eta.c_str(), tflops);
  if (peak_tflops > 0) out += format(", MFU %.1f%%", 100.0 * tflops / peak_tflops);
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

// Opened at the first line, so a run that fails before its first step leaves no empty
// file. A last line without its newline (a crash mid-write) is cut off first: the step
// it belonged to is repeated by the resumed run, and every reader then sees whole lines.
void MetricsWriter::open() {
  // O_NOFOLLOW: a symlink planted at the metrics path is refused, never written through.
  const int fd = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  const int open_error = errno;
  MMSP_CHECK(fd >= 0, path_, ": cannot open the metrics file for appending: ", std::strerror(open_error),
             open_error == ELOOP ? " (it is a symbolic link: mmsp writes its metrics only to a file of its own)" : "");
  file_ = ::fdopen(fd, "a+");
  if (!file_) ::close(fd);
  MMSP_CHECK(file_ != nullptr, path_, ": cannot open the metrics file for appending: ", std::strerror(errno));
  MMSP_CHECK(std::fseek(file_, 0, SEEK_END) == 0, path_, ": cannot seek: ", std::strerror(errno));
  long size = std::ftell(file_);
  if (size <= 0) return;
  long keep = size;
  char c = 0;
  while (keep > 0) {
    MMSP_CHECK(std::fseek(file_, keep - 1, SEEK_SET) == 0 && std::fread(&c, 1, 1, file_) == 1, path_,
               ": cannot read: ", std::strerror(errno));
    if (c == '\n') break;
    --keep;
  }
  if (keep < size) {
    MMSP_CHECK(::ftruncate(::fileno(file_), keep) == 0, path_,
               ": cannot cut its torn last line: ", std::strerror(errno));
    repaired_bytes_ = size - keep;
  }
  std::fseek(file_, 0, SEEK_END);  // from reading to appending
}

void MetricsWriter::write(const StepMetrics& m) { write(json(m)); }

void MetricsWriter::write(const json& row) {
  if (!file_) open();
  const std::string line = row.dump() + "\n";
  MMSP_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0, path_,
             ": cannot write metrics of step ", row.value("step", int64_t{0}), ": ", std::strerror(errno));
}

void to_json(json& j, const EvalMetrics& m) {
  j = json{{"step", m.step},
           {"eval_loss", std::isfinite(m.loss) ? json(m.loss) : json(nullptr)},
           {"eval_tokens", m.tokens},
           {"eval_label_tokens", m.label_tokens},
           {"eval_seconds", m.seconds}};
}

void from_json(const json& j, EvalMetrics& m) {
  m.step = j.at("step").get<int64_t>();
  m.loss = read_double(j, "eval_loss");
  m.tokens = j.at("eval_tokens").get<int64_t>();
  m.label_tokens = j.at("eval_label_tokens").get<int64_t>();
  m.seconds = read_double(j, "eval_seconds");
}

std::string format_eval_line(const EvalMetrics& m) {
  return format("eval after step %lld | loss %.4f | %lld label tokens | %.3f s", static_cast<long long>(m.step), m.loss,
                static_cast<long long>(m.label_tokens), m.seconds);
}

std::vector<EvalMetrics> read_eval_metrics(const std::string& path) {
  std::ifstream in(path);
  MMSP_CHECK(in.good(), path, ": cannot open the metrics file");
  std::vector<EvalMetrics> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      const json row = json::parse(line);
      if (row.contains("eval_loss")) out.push_back(row.get<EvalMetrics>());
    } catch (const json::exception& e) {
      throw Error(detail::concat(path, ":", number, ": not a metrics line: ", e.what()));
    }
  }
  return out;
}

std::vector<StepMetrics> read_metrics(const std::string& path) {
  std::ifstream in(path);
  MMSP_CHECK(in.good(), path, ": cannot open the metrics file");
  std::vector<StepMetrics> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    try {
      const json row = json::parse(line);
      if (row.contains("eval_loss")) continue;  // an evaluation's row (read_eval_metrics)
      out.push_back(row.get<StepMetrics>());
    } catch (const json::exception& e) {
      throw Error(detail::concat(path, ":", number, ": not a metrics line: ", e.what()));
    }
  }
  return out;
}

void StepSummary::add(const StepMetrics& m) {
  if (count_ == 0) first_ = lowest_ = m;
  if (m.loss < lowest_.loss) lowest_ = m;
  last_ = m;
  ++count_;
  peak_ = std::max(peak_, m.peak_bytes);
  sent_ += m.comm_bytes;
  attention_sent_ += m.attention_bytes;
  vision_sent_ += m.vision_bytes;
  grad_sent_ += m.grad_bytes;
  // The first step is in the means only while it is the only one.
  if (count_ == 2) seconds_ = vision_ = attention_ = communication_ = other_ = 0, tokens_ = 0;
  seconds_ += m.seconds;
  vision_ += m.vision_s;
  attention_ += m.attention_s;
  communication_ += m.communication_s;
  other_ += m.other_s;
  tokens_ += m.tokens;
}

std::string StepSummary::table() const {
  if (count_ == 0) return "no steps recorded\n";
  const bool first_excluded = count_ > 1;
  const int64_t counted = first_excluded ? count_ - 1 : count_;
  std::string out;
  out += format("steps          %lld (%lld .. %lld)\n", static_cast<long long>(count_),
                static_cast<long long>(first_.step), static_cast<long long>(last_.step));
  out += format("loss           first %.4f  last %.4f  min %.4f (step %lld)\n", first_.loss, last_.loss, lowest_.loss,
                static_cast<long long>(lowest_.step));
  out += format("tokens/s       %.0f (mean over %lld step%s%s)\n",
                seconds_ > 0 ? static_cast<double>(tokens_) / seconds_ : 0.0, static_cast<long long>(counted),
                counted == 1 ? "" : "s", first_excluded ? ", first excluded" : "");
  out += format(
      "step time      %.3f s mean = vision %.1f%%  attention %.1f%%  communication %.1f%%"
      "  other %.1f%%\n",
      seconds_ / static_cast<double>(counted), percent(vision_, seconds_), percent(attention_, seconds_),
      percent(communication_, seconds_), percent(other_, seconds_));
  out += format("peak memory    %.1f MiB\n", static_cast<double>(peak_) / kMiB);
  out += format("sent           %.1f MiB total (attention %.1f, vision %.1f, grad %.1f), %.1f MiB per step\n",
                static_cast<double>(sent_) / kMiB, static_cast<double>(attention_sent_) / kMiB,
                static_cast<double>(vision_sent_) / kMiB, static_cast<double>(grad_sent_) / kMiB,
                static_cast<double>(sent_) / kMiB / static_cast<double>(count_));
  return out;
}

std::string summary_table(const std::vector<StepMetrics>& steps) {
  StepSummary summary;
  for (const StepMetrics& m : steps) summary.add(m);
  return summary.table();
}

}  // namespace mmsp::train
