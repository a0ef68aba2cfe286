#include "mha/models/tokenizer.h"

#include <unicode/uchar.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "json_file.h"
#include "mha/core/error.h"

namespace mha::models {
namespace {

using CodePoints = std::vector<char32_t>;

// `text` as code points; ill-formed UTF-8 is an error naming the byte offset.
CodePoints decode(std::string_view text, const char* what) {
  CodePoints out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    utf8proc_int32_t c = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                    static_cast<utf8proc_ssize_t>(text.size() - i), &c);
    check(n > 0, what, ": invalid UTF-8 at byte ", i);
    out.push_back(static_cast<char32_t>(c));
    i += static_cast<size_t>(n);
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  utf8proc_uint8_t bytes[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), bytes);
  out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(n));
}

// The general category as Unicode 8.0 gave it (the version of the tables `tokenizers` uses, below):
// utf8proc's, but for the six characters assigned by 8.0 whose category has changed since (found by
// tokenizing every code point with both: U+1734 Mn → Mc, U+1885 and U+1886 Lo → Mn, U+A9BD Mc → Mn,
// U+111C9 Po → Mn, U+166D Po → So).
utf8proc_category_t category(char32_t c) {
  switch (c) {
    case 0x1734: return UTF8PROC_CATEGORY_MN;
    case 0x1885:
    case 0x1886: return UTF8PROC_CATEGORY_LO;
    case 0xA9BD: return UTF8PROC_CATEGORY_MC;
    case 0x111C9:
    case 0x166D: return UTF8PROC_CATEGORY_PO;
    default: return utf8proc_category(static_cast<utf8proc_int32_t>(c));
  }
}

// Assigned by Unicode 8.0, the version of the category tables `tokenizers` uses.
bool in_unicode_8(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  return age[0] <= 8;
}

// Rust's char::is_whitespace: the White_Space property, which is Zs, Zl, Zp and the controls
// \t \n \v \f \r and U+0085.
bool is_whitespace(char32_t c) {
  const auto cat = category(c);
  return (c >= 9 && c <= 13) || c == 0x85 || cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
         cat == UTF8PROC_CATEGORY_ZP;
}

// BertNormalizer's is_control: "other" (Cc, Cf, Co; not Cn) except \t \n \r.
bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto cat = category(c);
  return (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CO ||
          cat == UTF8PROC_CATEGORY_CS) &&
         in_unicode_8(c);
}

// BertPreTokenizer's is_punc: ASCII punctuation, or a P* category.
bool is_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  const auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO && in_unicode_8(c);
}

// The CJK Unified Ideographs blocks BERT puts spaces around: `tokenizers`' is_chinese_char, whose
// Extension E range starts at U+2B920 where BERT's Python _is_chinese_char starts at U+2B820 (the
// 256 code points between are split by the one, kept in the word by the other: `tokenizers` is the
// one Hugging Face runs).
bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

CodePoints nfd(const CodePoints& text) {
  std::string utf8;
  for (char32_t c : text) append_utf8(utf8, c);
  utf8proc_uint8_t* mapped = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                              static_cast<utf8proc_ssize_t>(utf8.size()), &mapped, UTF8PROC_DECOMPOSE);
  check(n >= 0, "tokenizer: NFD failed: ", utf8proc_errmsg(n));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  return decode(std::string_view(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n)), "tokenizer: NFD");
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, WordPieceConfig config)
    : vocab_(std::move(vocab)), config_(std::move(config)) {
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const auto [it, inserted] = ids_.emplace(vocab_[i], static_cast<int64_t>(i));
    check(inserted, "WordPieceTokenizer: vocab: token '", vocab_[i], "' appears twice (ids ", it->second, " and ", i,
          ")");
  }
  for (const std::string* special : {&config_.unk_token, &config_.cls_token, &config_.sep_token, &config_.pad_token}) {
    check(ids_.count(*special) != 0, "WordPieceTokenizer: vocab: the special token '", *special,
          "' is not in the vocabulary");
    specials_.push_back(*special);
  }
  if (ids_.count(config_.mask_token) != 0) specials_.push_back(config_.mask_token);
  check(config_.max_input_chars_per_word >= 1, "WordPieceTokenizer: max_input_chars_per_word: expected >= 1, got ",
        config_.max_input_chars_per_word);
  check(config_.model_max_length >= 2, "WordPieceTokenizer: model_max_length: expected >= 2, got ",
        config_.model_max_length);
  // Longest first, so that one special token that is a prefix of another never wins.
  std::sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const std::string& s : specials_) special_code_points_.push_back(decode(s, "WordPieceTokenizer: special token"));
}

WordPieceTokenizer WordPieceTokenizer::from_directory(const std::string& directory) {
  const std::string vocab_path = directory + "/vocab.txt";
  std::ifstream in(vocab_path, std::ios::binary);
  check(in.good(), vocab_path, ": cannot open the file (a WordPiece tokenizer needs its vocab.txt)");
  std::vector<std::string> vocab;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    decode(line, (vocab_path + ": line " + std::to_string(vocab.size() + 1)).c_str());
    vocab.push_back(std::move(line));
  }
  check(!in.bad(), vocab_path, ": cannot read the file");
  WordPieceConfig config;
  const std::string config_path = directory + "/tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    using namespace detail;
    const Json json = read_json_file(config_path);
    config.do_lower_case = optional_bool(json, "do_lower_case", config_path).value_or(true);
    config.strip_accents = optional_bool(json, "strip_accents", config_path);
    config.tokenize_chinese_chars = optional_bool(json, "tokenize_chinese_chars", config_path).value_or(true);
    check(optional_bool(json, "do_basic_tokenize", config_path).value_or(true), config_path,
          ": field 'do_basic_tokenize': false is not supported");
    // Hugging Face writes a huge number (int(1e30)) for "no limit".
    if (auto it = json.find("model_max_length"); it != json.end() && !it->is_null()) {
      check(it->is_number() && it->get<double>() >= 2, config_path,
            ": field 'model_max_length': expected a number >= 2, got ", it->dump());
      config.model_max_length = it->get<double>() >= 1e18 ? int64_t{1} << 62 : it->get<int64_t>();
    }
    // Special tokens: a string, or an object {"content": ...} (Hugging Face's AddedToken).
    auto special = [&](const char* field, std::string& target) {
      const auto it = json.find(field);
      if (it == json.end() || it->is_null()) return;
      if (it->is_object() && it->contains("content")) {
        target = string_field(*it, "content", config_path + ": field '" + field + "'");
      } else {
        target = string_field(json, field, config_path);
      }
    };
    special("unk_token", config.unk_token);
    special("cls_token", config.cls_token);
    special("sep_token", config.sep_token);
    special("pad_token", config.pad_token);
    special("mask_token", config.mask_token);
  }
  try {
    return WordPieceTokenizer(std::move(vocab), std::move(config));
  } catch (const Error& e) {
    throw Error(directory + ": " + e.what());
  }
}

std::optional<int64_t> WordPieceTokenizer::token_to_id(std::string_view token) const {
  const auto it = ids_.find(std::string(token));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string& WordPieceTokenizer::id_to_token(int64_t id) const {
  check(id >= 0 && id < vocab_size(), "WordPieceTokenizer: id: expected in [0, ", vocab_size(), "), got ", id);
  return vocab_[static_cast<size_t>(id)];
}

// Steps 1–5 on text without special tokens, appending pieces.
void WordPieceTokenizer::tokenize_segment(const CodePointsView& text, std::vector<std::string>& pieces) const {
  // 1, 2: clean, space around CJK ideographs.
  std::vector<char32_t> cleaned;
  cleaned.reserve(text.size());
  for (char32_t c : text) {
    if (config_.clean_text) {
      if (c == 0 || c == 0xFFFD || is_control(c)) continue;
      if (is_whitespace(c)) c = ' ';
    }
    if (config_.tokenize_chinese_chars && is_chinese(c)) {
      cleaned.push_back(' ');
      cleaned.push_back(c);
      cleaned.push_back(' ');
    } else {
      cleaned.push_back(c);
    }
  }
  // 3: accents (NFD, nonspacing marks dropped), then lower case.
  if (config_.strip_accents.value_or(config_.do_lower_case)) {
    std::vector<char32_t> kept;
    for (char32_t c : nfd(cleaned))
      if (!(category(c) == UTF8PROC_CATEGORY_MN && in_unicode_8(c))) kept.push_back(c);
    cleaned = std::move(kept);
  }
  if (config_.do_lower_case) {
    std::vector<char32_t> lower;
    lower.reserve(cleaned.size());
    for (char32_t c : cleaned) {
      if (c == 0x130) {  // İ: the one unconditional multi-character lower case (SpecialCasing.txt)
        lower.push_back('i');
        lower.push_back(0x307);
      } else {
        lower.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
      }
    }
    cleaned = std::move(lower);
  }
  // 4: words: split on whitespace; each punctuation character is a word of its own.
  std::vector<char32_t> word;
  auto flush = [&] {
    if (!word.empty()) word_pieces(word, pieces);
    word.clear();
  };
  for (char32_t c : cleaned) {
    if (is_whitespace(c)) {
      flush();
    } else if (is_punctuation(c)) {
      flush();
      word.push_back(c);
      flush();
    } else {
      word.push_back(c);
    }
  }
  flush();
}

// 5: greedy longest match of `word` against the vocabulary.
void WordPieceTokenizer::word_pieces(const std::vector<char32_t>& word, std::vector<std::string>& pieces) const {
  if (static_cast<int64_t>(word.size()) > config_.max_input_chars_per_word) {
    pieces.push_back(config_.unk_token);
    return;
  }
  std::string utf8;
  std::vector<size_t> offset{0};  // byte offset of each code point, and the end
  for (char32_t c : word) {
    append_utf8(utf8, c);
    offset.push_back(utf8.size());
  }
  std::vector<std::string> found;
  for (size_t start = 0; start < word.size();) {
    size_t end = word.size();
    std::string match;
    for (; end > start; --end) {
      std::string candidate = (start > 0 ? config_.continuing_subword_prefix : std::string()) +
                              utf8.substr(offset[start], offset[end] - offset[start]);
      if (ids_.count(candidate) != 0) {
        match = std::move(candidate);
        break;
      }
    }
    if (end == start) {  // no piece fits: the whole word is unknown
      pieces.push_back(config_.unk_token);
      return;
    }
    found.push_back(std::move(match));
    start = end;
  }
  pieces.insert(pieces.end(), std::make_move_iterator(found.begin()), std::make_move_iterator(found.end()));
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  const CodePoints cps = decode(text, "tokenizer: text");
  std::vector<std::string> pieces;
  // 0: special tokens written in the text are matched first, on the raw text.
  size_t segment = 0;
  for (size_t i = 0; i < cps.size();) {
    const std::string* special = nullptr;
    size_t length = 0;
    for (size_t s = 0; s < specials_.size(); ++s) {
      const std::vector<char32_t>& sc = special_code_points_[s];
      if (i + sc.size() <= cps.size() && std::equal(sc.begin(), sc.end(), cps.begin() + static_cast<std::ptrdiff_t>(i))) {
        special = &specials_[s];
        length = sc.size();
        break;
      }
    }
    if (special == nullptr) {
      ++i;
      continue;
    }
    tokenize_segment(CodePointsView(cps.data() + segment, i - segment), pieces);
    pieces.push_back(*special);
    i += length;
    segment = i;
  }
  tokenize_segment(CodePointsView(cps.data() + segment, cps.size() - segment), pieces);
  return pieces;
}

std::vector<int64_t> WordPieceTokenizer::encode(std::string_view text, int64_t max_length) const {
  check(max_length >= 2, "WordPieceTokenizer::encode: max_length: expected >= 2 (room for ", config_.cls_token,
        " and ", config_.sep_token, "), got ", max_length);
  const std::vector<std::string> pieces = tokenize(text);
  const size_t kept = std::min(pieces.size(), static_cast<size_t>(max_length - 2));
  std::vector<int64_t> ids;
  ids.reserve(kept + 2);
  ids.push_back(ids_.at(config_.cls_token));
  for (size_t i = 0; i < kept; ++i) ids.push_back(ids_.at(pieces[i]));
  ids.push_back(ids_.at(config_.sep_token));
  return ids;
}

TokenizedBatch WordPieceTokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length) const {
  std::vector<std::vector<int64_t>> rows;
  rows.reserve(texts.size());
  size_t longest = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      rows.push_back(encode(texts[i], max_length));
    } catch (const Error& e) {
      throw Error("text " + std::to_string(i) + ": " + e.what());
    }
    longest = std::max(longest, rows.back().size());
  }
  const auto n = static_cast<int64_t>(rows.size()), l = static_cast<int64_t>(longest);
  TokenizedBatch batch{Tensor<int64_t>({n, l}, ids_.at(config_.pad_token)), Tensor<int64_t>({n, l})};
  for (int64_t r = 0; r < n; ++r) {
    const auto& row = rows[static_cast<size_t>(r)];
    for (size_t c = 0; c < row.size(); ++c) {
      batch.input_ids[r * l + static_cast<int64_t>(c)] = row[c];
      batch.attention_mask[r * l + static_cast<int64_t>(c)] = 1;
    }
  }
  return batch;
}

}  // namespace mha::models
