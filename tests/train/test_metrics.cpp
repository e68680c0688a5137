// Step metrics: the log line, JSON round trip, the JSONL file, the summary, and the
// counting allocator behind the peak-memory figure.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "mmsp/train/memory/memory_counter.h"
#include "mmsp/train/metrics.h"

namespace mmsp::train {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

StepMetrics sample(int64_t step, double loss, double seconds) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = 3e-4;
  m.grad_norm = 0.8125;
  m.tokens = 1000;
  m.label_tokens = 900;
  m.seconds = seconds;
  m.vision_s = 0.1 * seconds;
  m.attention_s = 0.5 * seconds;
  m.communication_s = 0.2 * seconds;
  m.other_s = 0.2 * seconds;
  m.peak_bytes = 3 * 1024 * 1024 / 2;
  m.update_peak_bytes = 1024 * 1024 + step;
  m.forward_peak_bytes = 1024 * 1024 + 2 * step;
  m.backward_peak_bytes = m.peak_bytes;
  m.attention_bytes = 1024 * 1024 / 8;
  m.vision_bytes = 1024 * 1024 / 32 + step;
  m.grad_bytes = 1024 * 1024 / 4 - m.attention_bytes - 1024 * 1024 / 32;
  m.comm_bytes = m.attention_bytes + m.vision_bytes + m.grad_bytes;
  return m;
}

void expect_equal(const StepMetrics& a, const StepMetrics& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.label_tokens, b.label_tokens);
  EXPECT_EQ(a.seconds, b.seconds);
  EXPECT_EQ(a.vision_s, b.vision_s);
  EXPECT_EQ(a.attention_s, b.attention_s);
  EXPECT_EQ(a.communication_s, b.communication_s);
  EXPECT_EQ(a.other_s, b.other_s);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.update_peak_bytes, b.update_peak_bytes);
  EXPECT_EQ(a.forward_peak_bytes, b.forward_peak_bytes);
  EXPECT_EQ(a.backward_peak_bytes, b.backward_peak_bytes);
  EXPECT_EQ(a.comm_bytes, b.comm_bytes);
  EXPECT_EQ(a.attention_bytes, b.attention_bytes);
  EXPECT_EQ(a.vision_bytes, b.vision_bytes);
  EXPECT_EQ(a.grad_bytes, b.grad_bytes);
}

TEST(Metrics, StepLine) {
  const std::string line = format_step_line(sample(42, 2.34567, 0.5));
  EXPECT_EQ(line,
            "step 42 | loss 2.3457 | lr 3.00e-04 | gnorm 0.812 | 2000 tok/s | 0.500 s = vision 10% "
            "attn 50% comm 20% other 20% | peak 1.5 MiB | sent 0.3 MiB (attn 0.1, vision 0.0, grad 0.1)");
}

TEST(Metrics, JsonRoundTripKeepsEveryFieldExactly) {
  const StepMetrics m = sample(7, 1.0 / 3.0, 0.123456789);
  const StepMetrics back = json::parse(json(m).dump()).get<StepMetrics>();
  expect_equal(m, back);
  EXPECT_EQ(json(m).at("label_tokens"), 900);

  StepMetrics diverged = m;
  diverged.loss = std::nan("");
  const json j = json::parse(json(diverged).dump());
  EXPECT_TRUE(j.at("loss").is_null());
  EXPECT_TRUE(std::isnan(j.get<StepMetrics>().loss));
  EXPECT_EQ(json(m).at("attention_bytes"), m.attention_bytes);
  json missing = json(m);
  missing.erase("comm_bytes");
  EXPECT_THROW(missing.get<StepMetrics>(), json::exception);
}

// A line written before the bytes were split by purpose (and the update's peak apart)
// still reads, those as 0.
TEST(Metrics, ReadsALineWithoutTheBytesByPurpose) {
  const json old =
      json::parse(R"({"step":3,"loss":2.5,"lr":0.0003,"grad_norm":0.8125,"tokens":1000,"label_tokens":900,)"
                  R"("seconds":1.0,"vision_s":0.1,"attention_s":0.5,"communication_s":0.2,"other_s":0.2,)"
                  R"("peak_bytes":1572864,"comm_bytes":262147})");
  const StepMetrics m = old.get<StepMetrics>();
  EXPECT_EQ(m.step, 3);
  EXPECT_EQ(m.comm_bytes, 262147);
  EXPECT_EQ(m.attention_bytes, 0);
  EXPECT_EQ(m.vision_bytes, 0);
  EXPECT_EQ(m.grad_bytes, 0);
  EXPECT_EQ(m.update_peak_bytes, 0);
  EXPECT_EQ(m.forward_peak_bytes, 0);
  EXPECT_EQ(m.backward_peak_bytes, 0);
}

TEST(Metrics, WriterAppendsOneFlushedLinePerStep) {
  char name[] = "/tmp/mmsp-metrics-XXXXXX";
  const int fd = ::mkstemp(name);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::filesystem::remove(name);
  {
    MetricsWriter w(name);
    w.write(sample(1, 3.0, 2.0));
    w.write(sample(2, 2.5, 1.0));
    // Flushed: readable while the writer is still open.
    EXPECT_EQ(read_metrics(name).size(), 2u);
  }
  MetricsWriter(name).write(sample(3, 2.0, 1.0));  // a resumed run appends
  std::ifstream in(name);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(json::parse(lines[i]).at("step"), i + 1);
  const std::vector<StepMetrics> back = read_metrics(name);
  ASSERT_EQ(back.size(), 3u);
  expect_equal(back[1], sample(2, 2.5, 1.0));

  std::ofstream(name, std::ios::app) << "{\"step\": 4}\n";
  try {
    read_metrics(name);
    ADD_FAILURE() << "a bad line was accepted";
  } catch (const std::exception& e) { EXPECT_THAT(e.what(), HasSubstr(std::string(name) + ":4: not a metrics line")); }
  std::filesystem::remove(name);
  // The file is opened at the first line: no empty file for a run that fails before it.
  MetricsWriter never_written("/nonexistent-dir/metrics.jsonl");
  EXPECT_THROW(never_written.write(sample(1, 3.0, 2.0)), std::exception);
  { MetricsWriter unused(name); }
  EXPECT_FALSE(std::filesystem::exists(name));
}

// An evaluation's row (--eval-data) sits among the steps' rows: read_metrics (compare-losses)
// reads the steps alone, read_eval_metrics the evaluations alone, each field back as written.
TEST(Metrics, EvaluationRowsAreApartFromTheSteps) {
  const std::string name = testing::TempDir() + "mmsp-eval-metrics.jsonl";
  std::filesystem::remove(name);
  {
    MetricsWriter w(name);
    w.write(sample(1, 3.0, 2.0));
    EvalMetrics e;
    e.step = 1;
    e.loss = 2.75;
    e.tokens = 120;
    e.label_tokens = 113;
    e.seconds = 0.5;
    w.write(json(e));
    w.write(sample(2, 2.5, 1.0));
  }
  ASSERT_EQ(read_metrics(name).size(), 2u);
  const std::vector<EvalMetrics> evals = read_eval_metrics(name);
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].step, 1);
  EXPECT_EQ(evals[0].loss, 2.75);
  EXPECT_EQ(evals[0].label_tokens, 113);
  EXPECT_EQ(format_eval_line(evals[0]), "eval after step 1 | loss 2.7500 | 113 label tokens | 0.500 s");
  std::filesystem::remove(name);
}

// The progress after the step line: the steps left at the mean step time, the FLOP/s, MFU.
TEST(Metrics, ProgressGivesTheEtaAndTheMfu) {
  EXPECT_EQ(format_progress(3, 100, 2.5, 5e12, 2.0, 10), " | 3/100 | ETA 4m03s | 2.5 TFLOP/s, MFU 25.0%");
  EXPECT_EQ(format_progress(10, 5000, 3.0, 0, 1.0, 0), " | 10/5000 | ETA 4h09m | 0 TFLOP/s");
  // 2 FLOPs a parameter a token forward, 4 backward (2 where weights train), attention 12·h a pair
  EXPECT_EQ(step_flops(100, 10, 2, 8, 3, 6.0), 3 * (400.0 + 20.0) + 12.0 * 2 * 8 * 6.0);
}

TEST(Metrics, ATornLastLineIsCutWhenTheFileIsOpenedAgain) {
  const std::string name = testing::TempDir() + "mmsp-torn-metrics.jsonl";
  std::filesystem::remove(name);
  MetricsWriter(name).write(sample(1, 3.0, 2.0));
  std::ofstream(name, std::ios::app) << "{\"step\": 2, \"lo";  // a crash mid-write
  MetricsWriter resumed(name);
  resumed.write(sample(2, 2.5, 1.0));
  EXPECT_EQ(resumed.repaired_bytes(), 15);
  const std::vector<StepMetrics> back = read_metrics(name);
  ASSERT_EQ(back.size(), 2u);
  expect_equal(back[1], sample(2, 2.5, 1.0));
  MetricsWriter again(name);  // whole lines: nothing to cut
  again.write(sample(3, 2.0, 1.0));
  EXPECT_EQ(again.repaired_bytes(), 0);
  std::filesystem::remove(name);
}

TEST(Metrics, SummaryExcludesTheFirstStepFromTheMeans) {
  std::vector<StepMetrics> steps = {sample(1, 3.0, 10.0), sample(2, 1.5, 1.0), sample(3, 2.0, 1.0)};
  steps[1].peak_bytes = 10 * 1024 * 1024;
  const std::string table = summary_table(steps);
  EXPECT_THAT(table, HasSubstr("steps          3 (1 .. 3)"));
  EXPECT_THAT(table, HasSubstr("loss           first 3.0000  last 2.0000  min 1.5000 (step 2)"));
  EXPECT_THAT(table, HasSubstr("tokens/s       1000 (mean over 2 steps, first excluded)"));
  EXPECT_THAT(table, HasSubstr("1.000 s mean = vision 10.0%  attention 50.0%  communication 20.0%  other 20.0%"));
  EXPECT_THAT(table, HasSubstr("peak memory    10.0 MiB"));
  EXPECT_THAT(table, HasSubstr("sent           0.8 MiB total (attention 0.4, vision 0.1, grad 0.3), 0.3 MiB per step"));
  EXPECT_EQ(summary_table({}), "no steps recorded\n");
  EXPECT_THAT(summary_table({sample(1, 3.0, 2.0)}), HasSubstr("500 (mean over 1 step)"));
}

TEST(MemoryCounter, CountsCpuTensorsAndTheirPeak) {
  MemoryCounter memory;
  EXPECT_EQ(memory.current_bytes(), 0);
  {
    at::Tensor t = at::empty({1 << 20}, at::kByte);
    EXPECT_GE(memory.current_bytes(), 1 << 20);
  }
  EXPECT_LT(memory.current_bytes(), 1 << 20);
  EXPECT_GE(memory.peak_bytes(), 1 << 20);
  memory.reset_peak();
  EXPECT_EQ(memory.peak_bytes(), memory.current_bytes());
}

// Each counter counts from its own start, and only the tensors allocated since then:
// freeing an older tensor does not lower it.
TEST(MemoryCounter, TwoCountersKeepTheirOwnCounts) {
  auto first = std::make_unique<MemoryCounter>();
  at::Tensor older = at::empty({1 << 20}, at::kByte);  // counted by the first only
  MemoryCounter second;
  EXPECT_GE(first->current_bytes(), 1 << 20);
  EXPECT_LT(second.current_bytes(), 1 << 20);
  at::Tensor both = at::empty({2 << 20}, at::kByte);
  EXPECT_GE(first->current_bytes(), 3 << 20);
  EXPECT_GE(second.current_bytes(), 2 << 20);
  EXPECT_LT(second.current_bytes(), 3 << 20);
  older = at::Tensor();
  EXPECT_LT(first->current_bytes(), 3 << 20);
  EXPECT_GE(second.current_bytes(), 2 << 20);  // not its tensor
  EXPECT_GE(first->peak_bytes(), 3 << 20);
  first.reset();  // a counter that ends stops counting; the other goes on
  both = at::Tensor();
  EXPECT_LT(second.current_bytes(), 1 << 20);
  EXPECT_GE(second.peak_bytes(), 2 << 20);
}

}  // namespace
}  // namespace mmsp::train
