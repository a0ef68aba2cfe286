// `mha tokenize` and `mha embed` as black boxes, on the real all-MiniLM-L6-v2: what they write is
// what the library computes (the library's own tests hold it to Hugging Face and
// sentence-transformers); standard input; empty input; bad input gives a one-line message naming
// what is wrong and leaves no file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/cli.h"
#include "../support/model_dir.h"
#include "mha/core/safetensors.h"
#include "mha/models/sentence_encoder.h"
#include "mha/models/text_lines.h"

namespace mha {
namespace {

using mha::testing::minilm_dir;
using mha::testing::shell_quote;

class SentenceCli : public mha::testing::CliTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(mha::testing::have_minilm());
    std::ofstream(path("in.txt"), std::ios::binary)
        << "A man is eating food.\r\nCafé 東京 😀\n\n" + std::string(600, 'x') + long_line() + "\n[MASK] last line";
  }
  std::string model() const { return shell_quote(minilm_dir()); }

  // `command --model MODEL --input INPUT` fails with `needle` in its message and writes no --output.
  void expect_failure(const std::string& command, const std::string& model, const std::string& input,
                      const std::string& needle) {
    const CliResult r =
        run_cli(command + " --model " + model + " --input " + input + " --output " + path("out.safetensors"));
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_NE(r.output.find(needle), std::string::npos) << command << ": " << r.output;
    EXPECT_FALSE(std::filesystem::exists(path("out.safetensors"))) << command;
  }
  static std::string long_line() {  // 300 words: truncated to 256 tokens
    std::string line;
    for (int i = 0; i < 300; ++i) line += " word";
    return line;
  }
};

TEST_F(SentenceCli, TokenizeWritesTheLibrarysIdsPaddedToTheLongest) {
  const CliResult r = run_cli("tokenize --model " + model() + " --input " + path("in.txt") + " --output " + path("t.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
  const st::File file = st::load(path("t.safetensors"));
  const Tensor<int64_t> ids = st::to_tensor<int64_t>(st::require(file, "input_ids", "t"), "input_ids");
  const Tensor<int64_t> mask = st::to_tensor<int64_t>(st::require(file, "attention_mask", "t"), "attention_mask");
  EXPECT_EQ(file.tensors.at("input_ids").dtype, st::DType::I64);
  const auto tokenizer = models::WordPieceTokenizer::from_directory(minilm_dir());
  const auto expected = tokenizer.encode_batch(models::read_lines(path("in.txt")), 256);  // max_seq_length
  ASSERT_EQ(ids.shape(), (Shape{5, 256}));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ASSERT_EQ(ids[i], expected.input_ids[i]) << i;
    ASSERT_EQ(mask[i], expected.attention_mask[i]) << i;
  }
  // --max-length, and standard input.
  const CliResult r2 = run_cli("tokenize --model " + model() + " --input - --max-length 4 --output " +
                               path("t2.safetensors") + " < " + path("in.txt"));
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  const st::File file2 = st::load(path("t2.safetensors"));
  EXPECT_EQ(file2.tensors.at("input_ids").shape, (Shape{5, 4}));
}

TEST_F(SentenceCli, EmbedWritesTheLibrarysEmbeddings) {
  const CliResult r = run_cli("embed --model " + model() + " --input " + path("in.txt") + " --output " +
                              path("e.safetensors") + " --batch-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
  const st::File file = st::load(path("e.safetensors"));
  EXPECT_EQ(file.tensors.at("embeddings").dtype, st::DType::F32);
  const Tensor<float> got = st::to_tensor<float>(st::require(file, "embeddings", "e"), "embeddings");
  const models::SentenceEncoder encoder(minilm_dir());
  const Tensor<float> expected = encoder.encode(models::read_lines(path("in.txt")));
  ASSERT_EQ(got.shape(), (Shape{5, 384}));
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got[i], expected[i]) << i;  // batch size changes nothing
}

// --dtype bfloat16: the library's bfloat16 encoder with the same batch size, bit for bit, still
// written as F32; a dtype it does not know is one line naming the flag, before anything is read.
TEST_F(SentenceCli, EmbedInBfloat16) {
  const CliResult r = run_cli("embed --model " + model() + " --input " + path("in.txt") + " --output " +
                              path("e.safetensors") + " --batch-size 2 --dtype bfloat16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const st::File file = st::load(path("e.safetensors"));
  EXPECT_EQ(file.tensors.at("embeddings").dtype, st::DType::F32);
  const Tensor<float> got = st::to_tensor<float>(st::require(file, "embeddings", "e"), "embeddings");
  const models::SentenceEncoder encoder(minilm_dir(), models::Dtype::bfloat16);
  const Tensor<float> expected = encoder.encode(models::read_lines(path("in.txt")), 2);
  ASSERT_EQ(got.shape(), (Shape{5, 384}));
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got[i], expected[i]) << i;
  const CliResult bad = run_cli("embed --model " + model() + " --input " + path("in.txt") + " --output " +
                                path("out.safetensors") + " --dtype float16");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_EQ(bad.output, "mha: error: --dtype: expected \"float32\" or \"bfloat16\", got \"float16\"\n");
  EXPECT_FALSE(std::filesystem::exists(path("out.safetensors")));
}

TEST_F(SentenceCli, EmptyInputGivesNoRows) {
  std::ofstream(path("empty.txt")) << "";
  ASSERT_EQ(run_cli("embed --model " + model() + " --input " + path("empty.txt") + " --output " + path("e.safetensors")).exit_code, 0);
  EXPECT_EQ(st::load(path("e.safetensors")).tensors.at("embeddings").shape, (Shape{0, 384}));
  ASSERT_EQ(run_cli("tokenize --model " + model() + " --input " + path("empty.txt") + " --output " + path("t.safetensors")).exit_code, 0);
  EXPECT_EQ(st::load(path("t.safetensors")).tensors.at("input_ids").shape, (Shape{0, 0}));
}

TEST_F(SentenceCli, BadInputIsOneLineNamingItAndLeavesNoFile) {
  std::ofstream(path("bad.txt"), std::ios::binary) << "fine\nnot \xff fine\n";
  for (const char* command : {"tokenize", "embed"}) {
    expect_failure(command, model(), path("bad.txt"), "line 2: invalid UTF-8 at byte 4");
    expect_failure(command, path("nowhere"), path("in.txt"), "vocab.txt: cannot open");
  }
  // A directory as --input used to read as an empty file: exit 0 with empty outputs.
  std::filesystem::create_directory(path("a_directory"));
  for (const char* command : {"tokenize", "embed"})
    expect_failure(command, model(), path("a_directory"), "--input: expected a text file, got a directory");
  const CliResult b = run_cli("embed --model " + model() + " --input " + path("in.txt") + " --output " +
                              path("out.safetensors") + " --batch-size 0");
  EXPECT_NE(b.exit_code, 0);
  EXPECT_EQ(b.output, "mha: error: --batch-size: expected an integer >= 1, got 0 (see --help)\n");
  const CliResult d = run_cli("tokenize --model " + model() + " --input " + path("in.txt") + " --output " +
                              path("no/such/dir/out.safetensors"));
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE(d.output.find("--output"), std::string::npos) << d.output;
}

}  // namespace
}  // namespace mha
