// Flag limits and the --out probe; see run_checks.h.
#include "mmsp/train/run_checks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "mmsp/core/check.h"

namespace mmsp::train {
namespace {

namespace fs = std::filesystem;

void check_count(const char* flag, int64_t value, int64_t max, const char* what) {
  MMSP_CHECK(value <= max, flag, " ", value, " is too large: at most ", max, " (", what, ")");
}

void check_finite(const char* flag, double value) {
  MMSP_CHECK(std::isfinite(value), flag, " ", value, " must be a finite number");
}

}  // namespace

void check_train_limits(const TrainOptions& o) {
  check_count("--steps", o.steps, kMaxSteps, "optimizer steps of the schedule");
  check_count("--stop-after", o.stop_after, kMaxSteps, "a step of the schedule");
  check_count("--warmup", o.warmup_steps, kMaxSteps, "steps");
  check_count("--checkpoint-every", o.checkpoint_every, kMaxSteps, "steps");
  check_count("--tokens-per-rank", o.tokens_per_rank, kMaxTokensPerRank,
              "tokens of one rank per step; a step holds this × world");
  check_count("--data-rows", o.data_rows, kMaxTokensPerRank, "rows of a step");
  check_count("--shapes-samples", o.shapes_samples, kMaxShapesSamples, "samples of one shapes epoch");
  check_count("--attention-block", o.attention_block, kMaxAttentionBlock, "query/key block of the kernel");
  MMSP_CHECK(o.max_image_pixels >= 1 && o.max_image_pixels <= kMaxImagePixelsBound, "--max-image-pixels ",
             o.max_image_pixels, " must be in [1, ", kMaxImagePixelsBound, "] (width × height of one image)");
  check_finite("--lr", o.lr);
  check_finite("--min-lr", o.min_lr);
  check_finite("--weight-decay", o.weight_decay);
  check_finite("--clip", o.clip_norm);
}

void probe_out_dir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  MMSP_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "--out ", dir,
             " is not a directory (a file of that name is in the way); give a directory path");
  fs::create_directories(dir, ec);
  MMSP_CHECK(!ec, "--out ", dir, ": cannot create the directory: ", ec.message());
  // Hidden and marked ".tmp-": a probe left by a crash is removed with the next save's leftovers.
  char host[128] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string probe = dir + "/.out-probe-" + host + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  const int error = errno;
  MMSP_CHECK(fd >= 0, "--out ", dir, " is not writable: ", std::strerror(error),
             " (metrics and checkpoints go there; give a directory this rank can write)");
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_error = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  MMSP_CHECK(wrote, "--out ", dir, " is not writable: ", std::strerror(write_error));
}

}  // namespace mmsp::train
