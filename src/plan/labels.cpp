// Labels shifted within a sequence; the loss normaliser counts the labels kept.
#include "mmsp/plan/labels.h"

#include "mmsp/core/check.h"

namespace mmsp::plan {

bool is_vision_placeholder(int64_t token, const ModelConventions& c) {
  return token == c.image_token_id || (c.video_token_id >= 0 && token == c.video_token_id);
}

void fill_labels(const Sequence& seq, const ModelConventions& c, int64_t begin, int64_t count, int64_t* out) {
  const int64_t n = static_cast<int64_t>(seq.input_ids.size());
  MMSP_ASSERT(begin >= 0 && count >= 0 && begin + count <= n);
  const bool masked = !seq.loss_mask.empty();
  for (int64_t k = 0; k < count; ++k) {
    const int64_t target = begin + k + 1;
    int64_t label = kIgnoreIndex;
    if (target < n) {
      const int64_t tok = seq.input_ids[target];
      if (!is_vision_placeholder(tok, c) && (!masked || seq.loss_mask[target] != 0)) label = tok;
    }
    out[k] = label;
  }
}

int64_t count_labels(const Sequence& seq, const ModelConventions& c) {
  const int64_t n = static_cast<int64_t>(seq.input_ids.size());
  const bool masked = !seq.loss_mask.empty();
  const int64_t image = c.image_token_id, video = c.video_token_id;  // video may be -1
  const int64_t* ids = seq.input_ids.data();
  int64_t count = 0;
  for (int64_t t = 1; t < n; ++t) count += ids[t] != image && ids[t] != video && (!masked || seq.loss_mask[t] != 0);
  return count;
}

int64_t count_labels(const Sequence& seq, const ParsedSequence& parsed, const ModelConventions& c) {
  if (!seq.loss_mask.empty()) return count_labels(seq, c);
  // Targets are tokens 1..n-1; placeholders among them are ignored.
  int64_t placeholders = 0;
  for (const VisionBlock& b : parsed.blocks) placeholders += b.size() - (b.start == 0 ? 1 : 0);
  return parsed.length - 1 - placeholders;
}

}  // namespace mmsp::plan
