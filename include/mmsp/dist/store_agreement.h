// Values every rank must share that are known only once the ranks run (what each one
// loaded, what each one sees in its --out), exchanged through the job's store before the
// first collective that depends on them: a rank that differs is named by the caller's
// verdict (value_disagreement) instead of hanging or training a diverged replica.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "mmsp/dist/flag_agreement.h"

namespace c10d {
class Store;
}

namespace mmsp::dist {

// Posts `mine` under `key` ("mmsp/agree/<key>/<rank>"), waits up to `timeout` for every
// other rank's and returns them all in rank order (an unreadable one as
// {{"(unreadable)", ""}}). Throws mmsp::Error naming the key when a rank does not post in
// time. `key` must be unique to the exchange within the job.
std::vector<AgreedFlags> exchange_through_store(c10d::Store& store, const std::string& key, int rank, int world_size,
                                                std::chrono::milliseconds timeout, const AgreedFlags& mine);

}  // namespace mmsp::dist
