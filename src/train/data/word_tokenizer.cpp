// The fixed word vocabulary and its checks against a model's token ids.
#include "mmsp/train/data/word_tokenizer.h"

#include <sstream>

#include "mmsp/core/check.h"

namespace mmsp::train {

const std::vector<std::string>& WordTokenizer::vocabulary() {
  static const std::vector<std::string> words = {
      "<pad>", "<bos>", "<eos>",
      // captions (shapes_dataset)
      "a", "and", "small", "big", "red", "green", "blue", "yellow", "white", "magenta", "circle", "square", "triangle",
      "cross", "on", "at", "in", "the", "left", "right", "top", "bottom", "centre", "moves", "up", "down",
      // Qwen3-VL timestamps before each temporal patch of a video: "<1.0 seconds>"
      "<0.0", "<1.0", "<2.0", "<3.0", "<4.0", "<5.0", "<6.0", "<7.0", "<8.0", "<9.0", "seconds>"};
  return words;
}

WordTokenizer::WordTokenizer(const model::ModelConfig& config)
    : words_(vocabulary()),
      conventions_(config.conventions),
      vision_words_(model::family_for(config.model_type).token_words()) {
  const plan::ModelConventions& c = conventions_;
  const int64_t vocab = config.text.vocab_size;
  MMSP_CHECK(size() <= vocab, "word tokenizer: word \"", words_[vocab], "\" has id ", vocab,
             " but the model's text vocab_size is ", vocab, "; the built-in vocabulary needs ", size(), " ids (0..",
             size() - 1, ")");
  for (int64_t i = 0; i < size(); ++i) {
    ids_.emplace(words_[i], i);
    for (const auto& [name, special] : {std::pair<const char*, int64_t>{"image_token_id", c.image_token_id},
                                        {"video_token_id", c.video_token_id},
                                        {"vision_start_token_id", c.vision_start_token_id},
                                        {"vision_end_token_id", c.vision_end_token_id}})
      MMSP_CHECK(i != special, "word tokenizer: word \"", words_[i], "\" has id ", i, ", which the model uses as its ",
                 name, "; the built-in vocabulary takes ids 0..", size() - 1);
  }
}

int64_t WordTokenizer::id(const std::string& word) const {
  const auto it = ids_.find(word);
  MMSP_CHECK(it != ids_.end(), "word tokenizer: unknown word \"", word, "\" (the built-in vocabulary has ", size(),
             " words: the shapes captions' words, ", "<pad>, <bos>, <eos> and timestamp words)");
  return it->second;
}

std::vector<int64_t> WordTokenizer::encode(const std::string& text) const {
  std::istringstream in(text);
  std::vector<int64_t> ids;
  for (std::string word; in >> word;) {
    const auto it = ids_.find(word);
    MMSP_CHECK(it != ids_.end(), "word tokenizer: unknown word \"", word, "\" at word ", ids.size(), " of \"", text,
               "\"");
    ids.push_back(it->second);
  }
  return ids;
}

std::string WordTokenizer::decode(const std::vector<int64_t>& ids) const {
  const plan::ModelConventions& c = conventions_;
  const model::VisionTokenWords& v = vision_words_;
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int64_t t = ids[k];
    const char* word = nullptr;
    if (t >= 0 && t < size())
      word = words_[t].c_str();
    else if (t == c.image_token_id)
      word = v.image.c_str();
    else if (t == c.video_token_id && c.supports_video())
      word = v.video.c_str();
    else if (t == c.vision_start_token_id && c.has_block_markers())
      word = v.start.c_str();
    else if (t == c.vision_end_token_id && c.has_block_markers())
      word = v.end.c_str();
    MMSP_CHECK(word != nullptr, "word tokenizer: cannot decode id ", t, " at position ", k, ": not a word id (0..",
               size() - 1, ") nor a vision token of the model");
    if (!out.empty()) out += ' ';
    out += word;
  }
  return out;
}

}  // namespace mmsp::train
