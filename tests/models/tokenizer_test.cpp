// The WordPiece tokenizer: ids identical to Hugging Face's tokenizer (the `tokenizers` library)
// on every line of a hard corpus (tests/goldens/tokenizer, scripts/goldens/make_tokenizer_goldens.py)
// with the real all-MiniLM-L6-v2 vocabulary, and with the normaliser's options changed; small
// cases derived by hand on a vocabulary of a few tokens; every bad input an error naming it.
#include "mha/models/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/assertions.h"
#include "../support/cli.h"
#include "../support/model_dir.h"
#include "mha/core/escape.h"
#include "mha/core/safetensors.h"
#include "mha/models/text_lines.h"

namespace {

using mha::Tensor;
using mha::models::WordPieceConfig;
using mha::models::WordPieceTokenizer;
using mha::testing::have_minilm;
using mha::testing::minilm_dir;
using mha::testing::throws_error;

const std::string kGoldens = std::string(MHA_GOLDENS_DIR) + "/tokenizer";

// Every corpus line through `tokenizer` against ids[offsets[i]:offsets[i+1]]; the first few
// mismatches are reported with the line (escaped) and both id lists.
void expect_corpus_matches(const WordPieceTokenizer& tokenizer, const std::string& suffix, size_t lines_checked) {
  const std::vector<std::string> corpus = mha::models::read_lines(kGoldens + "/corpus.txt");
  ASSERT_GE(corpus.size(), 2000u);
  const mha::safetensors::MappedFile file(kGoldens + "/ids.safetensors");
  const Tensor<int64_t> ids = file.to_tensor<int64_t>("ids" + suffix);
  const Tensor<int64_t> offsets = file.to_tensor<int64_t>("offsets" + suffix);
  const size_t n = std::min(corpus.size(), lines_checked);
  ASSERT_EQ(offsets.numel(), static_cast<int64_t>(n) + 1);
  size_t matching = 0, reported = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int64_t> ours = tokenizer.encode(corpus[i], 256);
    const std::vector<int64_t> theirs(ids.data() + offsets[static_cast<int64_t>(i)],
                                      ids.data() + offsets[static_cast<int64_t>(i) + 1]);
    if (ours == theirs) {
      ++matching;
    } else if (reported++ < 5) {
      std::string a, b;
      for (int64_t id : ours) a += " " + std::to_string(id);
      for (int64_t id : theirs) b += " " + std::to_string(id);
      ADD_FAILURE() << "line " << i + 1 << " \"" << mha::escape(corpus[i]) << "\"\n  mha:" << a << "\n  hf: " << b;
    }
  }
  EXPECT_EQ(matching, n) << "lines with identical ids";
  std::printf("%zu of %zu corpus lines identical%s\n", matching, n, suffix.c_str());
}

TEST(Tokenizer, EveryCorpusLineMatchesHuggingFace) {
  ASSERT_TRUE(have_minilm());
  expect_corpus_matches(WordPieceTokenizer::from_directory(minilm_dir()), "", 100000);
}

TEST(Tokenizer, NormaliserOptionsMatchHuggingFace) {
  ASSERT_TRUE(have_minilm());
  const WordPieceTokenizer base = WordPieceTokenizer::from_directory(minilm_dir());
  struct Variant {
    const char* name;
    bool lower;
    std::optional<bool> strip;
    bool chinese;
  };
  for (const Variant& v : {Variant{"cased", false, std::nullopt, true}, Variant{"lower_keep_accents", true, false, true},
                           Variant{"cased_strip_accents", false, true, true},
                           Variant{"no_chinese_split", true, std::nullopt, false}}) {
    WordPieceConfig config = base.config();
    config.do_lower_case = v.lower;
    config.strip_accents = v.strip;
    config.tokenize_chinese_chars = v.chinese;
    SCOPED_TRACE(v.name);
    expect_corpus_matches(WordPieceTokenizer(base.vocab(), config), std::string("_") + v.name, 400);
  }
}

// A vocabulary small enough to derive every result by hand.
WordPieceTokenizer tiny() {
  return WordPieceTokenizer({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", ",", "world", "!", "un", "##aff",
                             "##able", "##a", "cafe", "東", "京", "x", "i"},
                            WordPieceConfig{});
}

TEST(Tokenizer, SmallCasesDerivedByHand) {
  const WordPieceTokenizer t = tiny();
  using V = std::vector<std::string>;
  EXPECT_EQ(t.tokenize("Hello, World!"), (V{"hello", ",", "world", "!"}));      // lower case, punctuation split
  EXPECT_EQ(t.tokenize("unaffable"), (V{"un", "##aff", "##able"}));              // greedy longest match
  EXPECT_EQ(t.tokenize("unaffablex"), (V{"[UNK]"}));                             // no "##x": the word is unknown
  EXPECT_EQ(t.tokenize("Cafe\u0301\u6771\u4eac"), (V{"cafe", "東", "京"}));      // NFD accent dropped, CJK split
  EXPECT_EQ(t.tokenize("x\u200bx\u00adx"), (V{"[UNK]"}));                        // zero-width, soft hyphen dropped: "xxx"
  EXPECT_EQ(t.tokenize("x\u3000x\tx"), (V{"x", "x", "x"}));                       // Unicode spaces split
  EXPECT_EQ(t.tokenize("hello[MASK]x"), (V{"hello", "[MASK]", "x"}));            // special token in the text
  EXPECT_EQ(t.tokenize("\u0130"), (V{"i"}));                                     // İ → I (accent stripped) → i
  EXPECT_EQ(t.tokenize(std::string(100, 'x')), (V{"[UNK]"}));                    // no "##x" either way
  EXPECT_EQ(t.tokenize(""), V{});
  EXPECT_EQ(t.tokenize(" \t "), V{});
  // [CLS] pieces [SEP], truncated to max_length.
  EXPECT_EQ(t.encode("hello world !", 16), (std::vector<int64_t>{2, 5, 7, 8, 3}));
  EXPECT_EQ(t.encode("hello world !", 4), (std::vector<int64_t>{2, 5, 7, 3}));
  EXPECT_EQ(t.encode("hello world !", 2), (std::vector<int64_t>{2, 3}));
  const auto batch = t.encode_batch({"hello", "hello world", ""}, 16);
  EXPECT_EQ(batch.input_ids.shape(), (mha::Shape{3, 4}));
  const std::vector<int64_t> ids(batch.input_ids.data(), batch.input_ids.data() + 12);
  const std::vector<int64_t> mask(batch.attention_mask.data(), batch.attention_mask.data() + 12);
  EXPECT_EQ(ids, (std::vector<int64_t>{2, 5, 3, 0, 2, 5, 7, 3, 2, 3, 0, 0}));
  EXPECT_EQ(mask, (std::vector<int64_t>{1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(t.encode_batch({}, 8).input_ids.shape(), (mha::Shape{0, 0}));
}

class TokenizerFiles : public mha::testing::TempDirTest<> {};

TEST_F(TokenizerFiles, BadInputsAreErrorsNamingThem) {
  const WordPieceTokenizer t = tiny();
  EXPECT_TRUE(throws_error([&] { t.encode("hello", 1); }, {"max_length", ">= 2", "got 1"}));
  EXPECT_TRUE(throws_error([&] { t.tokenize("ab\xff"); }, {"invalid UTF-8 at byte 2"}));
  EXPECT_TRUE(throws_error([&] { t.encode_batch({"ok", "\xc3"}, 8); }, {"text 1", "invalid UTF-8 at byte 0"}));
  EXPECT_TRUE(throws_error([&] { t.id_to_token(18); }, {"id", "[0, 18)", "got 18"}));
  EXPECT_TRUE(throws_error([] { WordPieceTokenizer({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "a"}, {}); },
                           {"vocab", "'a' appears twice", "ids 4 and 5"}));
  EXPECT_TRUE(throws_error([] { WordPieceTokenizer({"[PAD]", "[UNK]", "[CLS]"}, {}); },
                           {"vocab", "special token '[SEP]'", "not in the vocabulary"}));
  const std::string dir = dir_.string();
  EXPECT_TRUE(throws_error([&] { WordPieceTokenizer::from_directory(dir); }, {"vocab.txt", "cannot open"}));
  std::ofstream(path("vocab.txt")) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n";
  EXPECT_EQ(WordPieceTokenizer::from_directory(dir).vocab_size(), 5);
  std::ofstream(path("tokenizer_config.json")) << "{\"do_lower_case\": \"yes\"}";
  EXPECT_TRUE(throws_error([&] { WordPieceTokenizer::from_directory(dir); },
                           {"tokenizer_config.json", "'do_lower_case'", "true or false", "\"yes\""}));
  std::ofstream(path("tokenizer_config.json")) << "{\"do_lower_case\": true,";
  EXPECT_TRUE(throws_error([&] { WordPieceTokenizer::from_directory(dir); }, {"tokenizer_config.json", "not valid JSON"}));
  std::ofstream(path("tokenizer_config.json")) << "{\"unk_token\": {\"content\": \"<unk>\"}}";
  EXPECT_TRUE(throws_error([&] { WordPieceTokenizer::from_directory(dir); }, {"special token '<unk>'", "not in the vocabulary"}));
  std::ofstream(path("tokenizer_config.json")) << "{\"model_max_length\": 1}";
  EXPECT_TRUE(throws_error([&] { WordPieceTokenizer::from_directory(dir); }, {"'model_max_length'", ">= 2"}));
  std::ofstream(path("tokenizer_config.json")) << "{}";
  std::ofstream(path("vocab.txt")) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n\xff\n";
  EXPECT_TRUE(throws_error([&] { WordPieceTokenizer::from_directory(dir); }, {"vocab.txt: line 5", "invalid UTF-8"}));
}

TEST_F(TokenizerFiles, LinesAreReadAsTheCommandLineReadsThem) {
  std::ofstream(path("a.txt"), std::ios::binary) << "one\r\ntwo\n\nthree\rstill three\nlast";
  EXPECT_EQ(mha::models::read_lines(path("a.txt")),
            (std::vector<std::string>{"one", "two", "", "three\rstill three", "last"}));
  std::ofstream(path("empty.txt"), std::ios::binary) << "";
  EXPECT_TRUE(mha::models::read_lines(path("empty.txt")).empty());
  std::ofstream(path("bad.txt"), std::ios::binary) << "fine\nalso fine\nbad \xe2\x82 here\n";
  EXPECT_TRUE(throws_error([&] { mha::models::read_lines(path("bad.txt")); },
                           {"bad.txt", "line 3", "invalid UTF-8 at byte 4"}));
  EXPECT_TRUE(throws_error([&] { mha::models::read_lines(path("missing.txt")); }, {"missing.txt", "cannot open"}));
  // A directory opens as a stream that reads as empty: an error, not zero lines.
  std::filesystem::create_directory(path("a_directory"));
  EXPECT_TRUE(throws_error([&] { mha::models::read_lines(path("a_directory")); }, {"a_directory", "is a directory"}));
}

}  // namespace
