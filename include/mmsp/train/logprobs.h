// `mmsp logprobs`: the log-probability of every labelled token of a .jsonl given its
// prefix, under softmax(logits / temperature), and optionally the entropy of that
// distribution: a forward over the whole file on the mesh, in file order, with the train
// planner and no gradients (an RL trainer's old-policy and reference log-probs). The LM
// head runs in the loss's blocks of vocabulary rows: [T, V] logits are never whole. Each
// rank writes its slots' values into a zero vector of the step's tokens and one all-reduce
// over the world adds them (every token is one rank's); rank 0 writes one JSON line per
// sample to a temporary file beside --out and renames it into place at the end.
// Output format: docs/rl.md ("mmsp logprobs").
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "mmsp/dist/mesh.h"
#include "mmsp/train/train_options.h"

namespace mmsp::train {

struct LogprobsOptions {
  std::string out;           // the JSON-lines file rank 0 writes
  double temperature = 1.0;  // the logits are divided by it
  bool entropy = false;      // also the entropy per labelled token
};

// --out and --temperature, checked on every rank before any collective (naming the value
// and the rule): the temperature finite and > 0; --out given, not a directory, not --data,
// in a directory that exists.
void check_logprobs_options(const LogprobsOptions& l, const TrainOptions& o);

struct LogprobsReport {
  int64_t samples = 0, label_tokens = 0, steps = 0;
  double seconds = 0;
};

// Runs the pass on this rank (every rank calls it: collectives); rank 0 writes l.out and
// says what it wrote on `log`. `o` holds the model, the data, the budget and the mesh's
// options as `mmsp train` takes them (shuffle off: file order).
LogprobsReport write_logprobs(const TrainOptions& o, const LogprobsOptions& l, const dist::Mesh& mesh,
                              std::ostream& log);

}  // namespace mmsp::train
