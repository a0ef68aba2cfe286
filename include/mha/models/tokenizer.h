#pragma once
// WordPiece tokenization exactly as Hugging Face's BertTokenizerFast (the `tokenizers` library's
// BertNormalizer + BertPreTokenizer + WordPiece + BERT post-processor) for a vocab.txt and its
// tokenizer_config.json:
//   0. the special tokens ([CLS], [SEP], [PAD], [UNK], [MASK]) written in the text itself are
//      those tokens (matched case-sensitively before anything else, as Hugging Face's added tokens)
//   1. clean: drop U+0000, U+FFFD and control characters (categories Cc, Cf, Co, but \t \n \r);
//      whitespace becomes a space
//   2. put spaces around CJK ideographs (tokenize_chinese_chars)
//   3. strip accents (Unicode NFD, drop nonspacing marks) and lower-case, as the config says
//   4. split on whitespace and on punctuation (each punctuation character its own word)
//   5. each word: greedy longest-match against the vocab, continuations prefixed "##";
//      a word that cannot be matched, or longer than max_input_chars_per_word characters,
//      becomes unk_token
//   6. [CLS] pieces [SEP], truncated so the whole fits max_length; batches padded with pad_token
//      to the longest sequence (attention_mask 1 for real tokens, 0 for padding)
// Unicode properties (categories, NFD, case) come from utf8proc. `tokenizers` decides "control",
// "punctuation" and "nonspacing mark" with tables of Unicode 8.0 (the unicode_categories crate),
// so a character assigned later (an emoji modifier, U+2E45, a new script's marks) is none of
// them there: ICU's u_charAge (Debian's libicu) limits those three tests to Unicode 8.0 here too.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "mha/core/tensor.h"

namespace mha::models {

struct WordPieceConfig {
  bool do_lower_case = true;
  std::optional<bool> strip_accents;  // unset: strip exactly when lower-casing (Hugging Face's rule)
  bool tokenize_chinese_chars = true;
  bool clean_text = true;
  std::string unk_token = "[UNK]";
  std::string cls_token = "[CLS]";
  std::string sep_token = "[SEP]";
  std::string pad_token = "[PAD]";
  std::string mask_token = "[MASK]";
  std::string continuing_subword_prefix = "##";
  int64_t max_input_chars_per_word = 100;
  int64_t model_max_length = 512;  // tokenizer_config.json's model_max_length
};

// A batch as Hugging Face returns it with padding=True, truncation=True: (N, longest).
struct TokenizedBatch {
  Tensor<int64_t> input_ids;
  Tensor<int64_t> attention_mask;
};

class WordPieceTokenizer {
 public:
  // vocab: the tokens in id order (vocab.txt's lines). Every special token of the config must
  // be in it, tokens must be distinct: otherwise mha::Error naming the token.
  WordPieceTokenizer(std::vector<std::string> vocab, WordPieceConfig config);

  // A Hugging Face model directory: vocab.txt, and tokenizer_config.json when present
  // (do_lower_case, strip_accents, tokenize_chinese_chars, model_max_length, special tokens).
  // Errors name the file and the field.
  static WordPieceTokenizer from_directory(const std::string& directory);

  const WordPieceConfig& config() const { return config_; }
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::vector<std::string>& vocab() const { return vocab_; }
  // The id of `token`, or nullopt.
  std::optional<int64_t> token_to_id(std::string_view token) const;
  // The token of `id`; mha::Error when out of range.
  const std::string& id_to_token(int64_t id) const;

  // Steps 1–5: the word pieces of `text` (UTF-8; ill-formed bytes are an mha::Error naming the
  // byte offset), no special tokens.
  std::vector<std::string> tokenize(std::string_view text) const;
  // Steps 1–6 for one text: [CLS] ids [SEP], truncated to max_length (>= 2) tokens.
  std::vector<int64_t> encode(std::string_view text, int64_t max_length) const;
  // encode() for each text, padded to the longest.
  TokenizedBatch encode_batch(const std::vector<std::string>& texts, int64_t max_length) const;

 private:
  struct CodePointsView {
    const char32_t* data;
    size_t length;
    CodePointsView(const char32_t* d, size_t n) : data(d), length(n) {}
    const char32_t* begin() const { return data; }
    const char32_t* end() const { return data + length; }
    size_t size() const { return length; }
  };
  void tokenize_segment(const CodePointsView& text, std::vector<std::string>& pieces) const;
  void word_pieces(const std::vector<char32_t>& word, std::vector<std::string>& pieces) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int64_t> ids_;
  WordPieceConfig config_;
  std::vector<std::string> specials_;  // matched in the raw text, longest first
  std::vector<std::vector<char32_t>> special_code_points_;  // the same, decoded
};

}  // namespace mha::models
