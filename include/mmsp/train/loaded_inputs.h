// What a rank is about to load, as short identities, and the check that every rank loads
// the same before the first collective. --model and --resume may be per-host copies (each
// node its own disk): copies that differ would train replicas that silently diverge (other
// weights) or wait in different collectives until the timeout (checkpoints of other
// steps). The identities cost little: a checksums.json's own checksum covers every byte
// it lists (verified as the files are opened); a released model directory without one is
// hashed once, XXH64 over its weight files.
#pragma once

#include <chrono>
#include <string>

#include "mmsp/dist/flag_agreement.h"
#include "mmsp/dist/job_hosts.h"
#include "mmsp/train/builtin_models.h"
#include "mmsp/train/checkpoint/checkpoint.h"
#include "mmsp/train/trainer.h"

namespace c10d {
class Store;
}

namespace mmsp::train {

// {"--model", "config xxh64 …, weights …"} (not the path: copies may sit elsewhere) and, with a checkpoint,
// {"--resume", "step N, checkpoint xxh64 …"}. A checkpoint's own weights stand for the
// model's (a resume does not read --model's weights).
dist::AgreedFlags loaded_inputs(const TrainOptions& o, const ResolvedModel& model, const Checkpoint* checkpoint);

// Exchanges `mine` through the store (under `prefix`) and throws mmsp::Error, the same
// text on every rank, when the ranks differ: "the ranks loaded different inputs: --resume
// is step 30 … on ranks 0, 1 on host node0 (…) and step 20 … on ranks 2, 3 on host node1
// (…). …".
void agree_on_loaded_inputs(c10d::Store& store, const std::string& prefix, const dist::AgreedFlags& mine, int rank,
                            int world_size, std::chrono::milliseconds timeout, const dist::JobHosts& hosts);

}  // namespace mmsp::train
