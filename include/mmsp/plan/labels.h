// Labels: token i of a sequence learns token i+1 of the same sequence (shifted before
// sharding, so no rank needs its neighbour's tokens). Ignored (-100): the last token,
// a target that is a vision placeholder, a target whose loss_mask is 0, and padding.
#pragma once

#include <cstdint>

#include "mmsp/plan/model_conventions.h"
#include "mmsp/plan/sequence.h"

namespace mmsp::plan {

constexpr int64_t kIgnoreIndex = -100;

bool is_vision_placeholder(int64_t token, const ModelConventions& conventions);

// Labels of tokens [begin, begin + count) of the sequence into out.
void fill_labels(const Sequence& sequence, const ModelConventions& conventions, int64_t begin, int64_t count,
                 int64_t* out);

// Number of labels that are not ignored.
int64_t count_labels(const Sequence& sequence, const ModelConventions& conventions);
// The same from the parsed blocks: O(blocks) when there is no loss_mask.
int64_t count_labels(const Sequence& sequence, const ParsedSequence& parsed, const ModelConventions& conventions);

}  // namespace mmsp::plan
