// `mha attention --window LEFT,RIGHT`, `--chunk-size C`, `--softcap C` and the input file's
// `sinks` and `alibi_slopes`: the module's attention variants from the command line.
//   - with --window or --chunk-size the file written (forward and --backward, float64 on the
//     reference backend) is byte for byte the file of the same call given the window or the chunks
//     as a bool attn_mask (True = blocked) built here from the definition: query i sees key j when
//     i + d − LEFT <= j <= i + d + RIGHT, or when ⌊j / C⌋ = ⌊(i + d) / C⌋, d = S − L without
//     causality;
//   - the file written (forward and --backward, float64) holds what the module computes in
//     process with the same options and tensors, bit for bit, grad_sinks included;
//   - ALiBi slopes in the file write, byte for byte, the file of the same call given the biases
//     as a float attn_mask (N·H, L, S) built here from −slope·|i + S − L − j|;
//   - bad windows, a bad soft-cap, chunk or scale, sinks of the wrong shape or non-finite are
//     one-line errors that leave no file.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../support/cli.h"
#include "mha/core/random.h"
#include "mha/core/safetensors.h"
#include "mha/nn/multihead_attention.h"

namespace mha {
namespace {

class AttentionVariantsCli : public mha::testing::CliTest {
 protected:
  static constexpr int64_t kLen = 5, kSrc = 8, kBatch = 2, kEmbed = 8, kHeads = 2;

  // Inputs (L, N, E) with distinct keys and values, sinks and (N, H) slopes.
  void SetUp() override {
    query = random({kLen, kBatch, kEmbed});
    key = random({kSrc, kBatch, kEmbed});
    value = random({kSrc, kBatch, kEmbed});
    grad_output = random({kLen, kBatch, kEmbed});
    sinks = random({kHeads});
    slopes = Tensor<double>({kBatch, kHeads}, {0.5, 0.25, 0.75, 0.125});
  }

  Tensor<double> random(Shape shape) {
    Tensor<double> t(std::move(shape));
    for (auto& x : t.values()) x = gen.normal();
    return t;
  }

  st::File inputs() const {
    st::File f;
    f.tensors["query"] = st::from_tensor(query);
    f.tensors["key"] = st::from_tensor(key);
    f.tensors["value"] = st::from_tensor(value);
    f.tensors["grad_output"] = st::from_tensor(grad_output);
    return f;
  }

  // The window tests' inputs (L = 7, S = 11), and the same with the window 2,1 as a mask, and with
  // chunks of 3.
  void write_window_inputs() {
    static constexpr int64_t kWindowLen = 7, kWindowSrc = 11;
    st::File inputs;
    inputs.tensors["query"] = st::from_tensor(random({kWindowLen, 2, kEmbed}));
    inputs.tensors["key"] = st::from_tensor(random({kWindowSrc, 2, kEmbed}));
    inputs.tensors["value"] = st::from_tensor(random({kWindowSrc, 2, kEmbed}));
    inputs.tensors["grad_output"] = st::from_tensor(random({kWindowLen, 2, kEmbed}));
    st::save(inputs, path("inputs.safetensors"));
    Tensor<bool> blocked({kWindowLen, kWindowSrc});
    for (int64_t i = 0; i < kWindowLen; ++i)
      for (int64_t j = 0; j < kWindowSrc; ++j) {
        const int64_t d = kWindowSrc - kWindowLen;
        blocked[i * kWindowSrc + j] = !(j >= i + d - 2 && j <= i + d + 1);  // window 2,1
      }
    inputs.tensors["attn_mask"] = st::from_tensor(blocked);
    st::save(inputs, path("masked.safetensors"));
    for (int64_t i = 0; i < kWindowLen; ++i)
      for (int64_t j = 0; j < kWindowSrc; ++j) blocked[i * kWindowSrc + j] = j / 3 != (i + kWindowSrc - kWindowLen) / 3;
    inputs.tensors["attn_mask"] = st::from_tensor(blocked);
    st::save(inputs, path("chunk_masked.safetensors"));
  }

  std::string bytes(const std::string& name) const {
    std::ifstream in(path(name), std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  // `command --inputs IN --output OUT` (files of the test's directory) succeeds; else what it printed.
  ::testing::AssertionResult writes(const std::string& command, const std::string& inputs,
                                    const std::string& output) const {
    const CliResult r = run_cli(command + "--inputs " + path(inputs) + " --output " + path(output));
    if (r.exit_code == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "exit code " << r.exit_code << ": " << r.output;
  }

  Generator gen{6};
  Tensor<double> query, key, value, grad_output, sinks, slopes;
};

constexpr const char* kCommon = "attention --embed-dim 8 --num-heads 2 --dtype float64 --backward --seed 4 ";

TEST_F(AttentionVariantsCli, WritesWhatTheModuleComputes) {
  st::File in = inputs();
  in.tensors["sinks"] = st::from_tensor(sinks);
  in.tensors["alibi_slopes"] = st::from_tensor(slopes);
  st::save(in, path("inputs.safetensors"));
  ASSERT_TRUE(writes(std::string(kCommon) + "--softcap 1.5 ", "inputs.safetensors", "out.safetensors"));
  const st::File out = st::load(path("out.safetensors"));

  nn::MultiheadAttentionOptions o;
  o.embed_dim = kEmbed;
  o.num_heads = kHeads;
  o.scoring.softcap = 1.5;
  nn::MultiheadAttention<double> module(o, 4);
  nn::MultiheadAttentionArgs<double> args;
  args.sinks = sinks;
  args.alibi_slopes = slopes;
  nn::MultiheadAttentionCache<double> cache;
  const auto fwd = module.forward(query, key, value, args, &cache);
  const auto grads = module.backward(grad_output, cache);
  auto same = [&](const char* name, const Tensor<double>& want) {
    const Tensor<double> got = st::to_tensor<double>(st::require(out, name, "out"), name);
    EXPECT_EQ(got.shape(), want.shape()) << name;
    EXPECT_TRUE(std::equal(got.values().begin(), got.values().end(), want.values().begin())) << name;
  };
  same("output", fwd.output);
  same("grad_query", grads.grad_query);
  same("grad_key", grads.grad_key);
  same("grad_sinks", *grads.grad_sinks);
}

TEST_F(AttentionVariantsCli, AlibiWritesTheFileOfItsBiasAsAMask) {
  st::File in = inputs();
  in.tensors["alibi_slopes"] = st::from_tensor(slopes);
  st::save(in, path("alibi.safetensors"));
  st::File masked = inputs();
  Tensor<double> bias({kBatch * kHeads, kLen, kSrc});
  for (int64_t bh = 0; bh < kBatch * kHeads; ++bh)
    for (int64_t i = 0; i < kLen; ++i)
      for (int64_t j = 0; j < kSrc; ++j)
        bias[(bh * kLen + i) * kSrc + j] = -slopes[bh] * static_cast<double>(std::abs(i + kSrc - kLen - j));
  masked.tensors["attn_mask"] = st::from_tensor(bias);
  st::save(masked, path("masked.safetensors"));
  ASSERT_TRUE(writes(kCommon, "alibi.safetensors", "alibi_out.safetensors"));
  ASSERT_TRUE(writes(kCommon, "masked.safetensors", "masked_out.safetensors"));
  EXPECT_EQ(bytes("alibi_out.safetensors"), bytes("masked_out.safetensors"));
}

TEST_F(AttentionVariantsCli, BadValuesAreRefused) {
  st::File in = inputs();
  st::save(in, path("plain.safetensors"));
  in.tensors["sinks"] = st::from_tensor(Tensor<double>({3}, 0.0));
  st::save(in, path("three_sinks.safetensors"));
  in.tensors["sinks"] = st::from_tensor(Tensor<double>({2}, {0.0, std::nan("")}));
  st::save(in, path("nan_sink.safetensors"));
  for (auto [flags, needle] : {
           std::pair<std::string, std::string>{"--softcap -1 --inputs " + path("plain.safetensors"),
                                               "softcap: expected 0 (none) or a finite cap > 0, got -1"},
           {"--softcap inf --inputs " + path("plain.safetensors"), "softcap"},
           {"--chunk-size -2 --inputs " + path("plain.safetensors"),
            "chunk_size: expected 0 (no chunks) or a number of keys > 0, got -2"},
           {"--scale inf --inputs " + path("plain.safetensors"), "scale"},
           {"--inputs " + path("three_sinks.safetensors"), "sinks: expected shape (Hq) = [2], one per query head, got [3]"},
           {"--inputs " + path("nan_sink.safetensors"), "sinks: expected finite logits (or -inf: no sink), got nan"}}) {
    const CliResult r = run_cli(std::string(kCommon) + flags + " --output " + path("out.safetensors"));
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.output.find(needle), std::string::npos) << flags << ": " << r.output;
    EXPECT_FALSE(fs::exists(path("out.safetensors"))) << flags;
  }
}

TEST_F(AttentionVariantsCli, WindowWritesTheFileOfTheWindowAsAMask) {
  write_window_inputs();
  const std::string common = kCommon;
  ASSERT_TRUE(writes(common + "--window 2,1 ", "inputs.safetensors", "windowed.safetensors"));
  ASSERT_TRUE(writes(common, "masked.safetensors", "masked_out.safetensors"));
  ASSERT_TRUE(writes(common, "inputs.safetensors", "plain.safetensors"));
  EXPECT_EQ(bytes("windowed.safetensors"), bytes("masked_out.safetensors"));
  EXPECT_NE(bytes("windowed.safetensors"), bytes("plain.safetensors"));  // the window does something
  ASSERT_TRUE(writes(common + "--chunk-size 3 ", "inputs.safetensors", "chunked.safetensors"));
  ASSERT_TRUE(writes(common, "chunk_masked.safetensors", "chunk_masked_out.safetensors"));
  EXPECT_EQ(bytes("chunked.safetensors"), bytes("chunk_masked_out.safetensors"));
  EXPECT_NE(bytes("chunked.safetensors"), bytes("plain.safetensors"));
}

TEST_F(AttentionVariantsCli, BadWindowsAreRefused) {
  write_window_inputs();
  const std::string common = "attention --embed-dim 8 --num-heads 2 --inputs " + path("inputs.safetensors") +
                             " --output " + path("out.safetensors") + " --window ";
  for (auto [window, needle] : {std::pair<std::string, std::string>{"-2,0", "window_left: expected -1 (unbounded)"},
                                {"3,-9", "window_right: expected -1 (unbounded)"},
                                {"3", "--window"},
                                {"a,b", "--window"}}) {
    const CliResult r = run_cli(common + window);
    EXPECT_NE(r.exit_code, 0) << window;
    EXPECT_NE(r.output.find(needle), std::string::npos) << window << ": " << r.output;
    EXPECT_FALSE(fs::exists(path("out.safetensors"))) << window;
  }
}

}  // namespace
}  // namespace mha
