// What a rank is about to do in a step, as a few named 64-bit hashes (the batch's
// identity and the plan's sizes, routes and collectives), and the check, once per
// step before its first collective, that every rank is about to do the same: a rank
// that differs ends the job naming itself and the first field that differs, instead
// of two ranks waiting in different collectives until the timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "mmsp/plan/sequence.h"
#include "mmsp/plan/step_plan.h"

namespace c10d {
class Store;
}

namespace mmsp::train {

struct FingerprintField {
  std::string name;
  uint64_t hash = 0;
  bool operator==(const FingerprintField& o) const { return name == o.name && hash == o.hash; }
};
using StepFingerprint = std::vector<FingerprintField>;

// Fields, in order: samples (indices), sequence sizes (tokens and grids), token ids,
// packing (rows, segments, shard length), labels (count), vision routes (items,
// encoder ranks, rows), collectives (the ordered collectives the plan determines with
// their element counts). Only what is the same on every rank of a healthy job.
StepFingerprint step_fingerprint(const std::vector<int64_t>& samples, const plan::Batch& batch,
                                 const plan::StepPlan& plan);

// "samples=0123456789abcdef;..." and back (malformed: an empty fingerprint).
std::string encode_fingerprint(const StepFingerprint& f);
StepFingerprint decode_fingerprint(const std::string& text);

// Throws mmsp::Error unless every rank's fingerprint is equal: the odd rank is the
// one that differs from the most common fingerprint (ties: rank 0's), named with the
// first differing field, e.g. "step 3: rank 2 is about to run another step than
// ranks 0, 1, 3 (first difference: samples): …".
void check_same_step(int64_t step, const std::vector<StepFingerprint>& per_rank);

// A key prefix of its own for one run over `store` ("mmsp/fingerprint/3/"): ranks call
// it in the same order (one per train() call), so runs that share a store and reuse
// step numbers (tests, several meshes) never read each other's keys.
std::string fingerprint_key_prefix(c10d::Store& store, int rank);

// Posts this rank's fingerprint in `store` under `prefix`, waits (up to `timeout`) for
// every other rank's, and checks them (check_same_step). Keys of two steps back are
// deleted.
void agree_on_step(c10d::Store& store, const std::string& prefix, int64_t step, const StepFingerprint& mine, int rank,
                   int world_size, std::chrono::milliseconds timeout);

}  // namespace mmsp::train
