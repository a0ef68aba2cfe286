// Fuzz target: the WordPiece tokenizer on arbitrary bytes (text from users and files).
//
// The first byte holds the normaliser's options (bit 0 lower case, bits 1–2 strip_accents unset /
// false / true, bit 3 CJK split, bit 4 clean_text); the second gives max_length (0 to 40, so the
// invalid 0 and 1 occur too); the rest is the text. Properties: encode returns or throws
// mha::Error, nothing else; what it returns starts with [CLS], ends with [SEP], has at most
// max_length ids, each in the vocabulary; tokenize's pieces are all vocabulary tokens.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz.h"
#include "mha/core/error.h"
#include "mha/models/tokenizer.h"

using mha::fuzz::finding;

namespace {

// A small vocabulary with multi-byte pieces, continuations and CJK.
const std::vector<std::string>& vocab() {
  static const std::vector<std::string> v = {
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a",   "b",  "##a", "##b", "ab",  "##ab", "é",   "##é",
      "e",     "##e",   "东",    "京",    "!",      ",",   "[",  "]",   "mask", "i",  "##i",  "ı",   "ß"};
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mha::fuzz::FuzzInput in(data, size);
  const uint8_t options = in.byte();
  const int64_t max_length = in.byte() % 41;
  const size_t header = std::min<size_t>(2, size);
  const std::string_view text(reinterpret_cast<const char*>(data) + header, size - header);
  mha::models::WordPieceConfig config;
  config.do_lower_case = (options & 1) != 0;
  const int strip = (options >> 1) & 3;
  if (strip == 1) config.strip_accents = false;
  if (strip >= 2) config.strip_accents = true;
  config.tokenize_chinese_chars = (options & 8) != 0;
  config.clean_text = (options & 16) != 0;
  const mha::models::WordPieceTokenizer tokenizer(vocab(), config);
  try {
    for (const std::string& piece : tokenizer.tokenize(text))
      if (!tokenizer.token_to_id(piece)) finding("tokenize returned a piece that is not in the vocabulary");
    const std::vector<int64_t> ids = tokenizer.encode(text, max_length);
    if (ids.size() < 2 || static_cast<int64_t>(ids.size()) > max_length) finding("encode's length is out of [2, max_length]");
    if (ids.front() != 2 || ids.back() != 3) finding("encode does not start with [CLS] and end with [SEP]");
    for (int64_t id : ids)
      if (id < 0 || id >= tokenizer.vocab_size()) finding("encode returned an id outside the vocabulary");
  } catch (const mha::Error& e) {
    mha::fuzz::check_printable_message(e.what());
  }
  return 0;
}
