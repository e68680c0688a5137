// `mmsp bench logprobs`: per-token log-probabilities of one long sample split over the
// world's ranks (issue 72's figure), three ways from the same decoder output (each rank's
// [T/P, h] hidden states; the decoder's own memory is the same for all three and left
// out): mmsp's (the head in blocks of vocabulary rows, never [T/P, V], and one all-reduce
// of the T values), the local-logits way (each rank's [T/P, V] logits whole, then its
// values gathered: verl's logprobs_from_logits + gather_outputs_and_unpad under Ulysses),
// and the naive way (each rank's logits gathered to [T, V] on every rank, then
// log_softmax). Each row: the busiest rank's peak tensor bytes, the bytes each rank sent
// (measured, next to the formula), the seconds, and the largest difference of its values
// from mmsp's. Run under `mmsp-run -n 4`.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "mmsp/dist/rank_env.h"

namespace mmsp::bench {

struct LogprobsBenchOptions {
  std::string model = "shapes-qwen2-vl";  // its hidden size and vocabulary (built in)
  int64_t vocab = 8192;    // the vocabulary (0: the model's; the naive way needs T·V·4 bytes twice on every rank)
  int64_t tokens = 32768;  // the sample's tokens, split evenly over the ranks
  int64_t loss_chunk = 0;  // mmsp's blocks (0: the training default)
};

// Every rank calls it; rank 0's result holds the rows.
nlohmann::json bench_logprobs(const dist::RankEnv& env, const LogprobsBenchOptions& options);

}  // namespace mmsp::bench
