// The built-in tokenizer of the shapes dataset: whitespace-separated words of a small fixed
// vocabulary (specials, caption words, Qwen3-VL timestamp words), ids 0 .. size() - 1.
// Real data comes already tokenized (jsonl_dataset); this exists so the built-in
// dataset needs no tokenizer files.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "mmsp/model/config/config.h"
#include "mmsp/model/family.h"

namespace mmsp::train {

class WordTokenizer {
 public:
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2;

  // Checks every word id against `config`: below text.vocab_size and none equal to a
  // vision placeholder / marker id of its conventions (errors name the word and the id).
  explicit WordTokenizer(const model::ModelConfig& config);

  // Words separated by spaces; an unknown word is an error naming it and its position.
  std::vector<int64_t> encode(const std::string& text) const;
  int64_t id(const std::string& word) const;

  // Words joined by spaces; the conventions' vision tokens print as <|vision_start|>,
  // <|image_pad|>, <|video_pad|>, <|vision_end|> (the family's words: LLaVA <image>, InternVL
  // <img> <IMG_CONTEXT> </img>); any other id is an error.
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t size() const { return static_cast<int64_t>(words_.size()); }
  const std::vector<std::string>& words() const { return words_; }

  // The fixed vocabulary, in id order.
  static const std::vector<std::string>& vocabulary();

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, int64_t> ids_;
  plan::ModelConventions conventions_;
  model::VisionTokenWords vision_words_;  // the family's (family.h)
};

}  // namespace mmsp::train
