// `mha attention` on bad input: a one-line message naming the problem, a non-zero exit, and no
// output file left behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "../support/cli.h"
#include "mha/core/random.h"
#include "mha/core/safetensors.h"
#include "mha/nn/multihead_attention.h"

namespace mha {
namespace {

class AttentionCliErrors : public mha::testing::CliTest {
 protected:
  void SetUp() override {
    st::File inputs;
    inputs.tensors["query"] = st::from_tensor(Tensor<float>({3, 2, 4}, 0.5f));
    inputs.tensors["grad_output"] = st::from_tensor(Tensor<float>({3, 2, 4}, 1.0f));
    st::save(inputs, path("inputs.safetensors"));
  }

  // Runs the command, expects failure with `needle` in the message and no output file.
  void expect_failure(const std::string& arguments, const std::string& needle) {
    const CliResult r = run_cli("attention --output " + path("out.safetensors") + " " + arguments);
    EXPECT_NE(r.exit_code, 0) << arguments;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "message: " << r.output;
    EXPECT_FALSE(fs::exists(path("out.safetensors"))) << arguments;
    for (const auto& entry : fs::directory_iterator(dir_))  // no temp file either
      EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }
};

TEST_F(AttentionCliErrors, RunsWithoutWeightsFromTheSeed) {
  const CliResult r = run_cli("attention --embed-dim 4 --num-heads 2 --backward --inputs " +
                              path("inputs.safetensors") + " --output " + path("out.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const st::File out = st::load(path("out.safetensors"));
  for (const char* name : {"output", "attn_weights", "grad_query", "grad_key", "grad_value",
                           "grad.in_proj_weight", "grad.in_proj_bias", "grad.out_proj.weight", "grad.out_proj.bias"})
    EXPECT_TRUE(out.tensors.count(name)) << name;
  EXPECT_EQ(out.tensors.at("attn_weights").shape, (Shape{2, 3, 3}));
}

// --dtype bfloat16 / float16: BF16 / F16 inputs taken as they are, the module computed in that type
// (weights from --seed), every result written in it: the library's MultiheadAttention<T> on the same
// tensors, bit for bit.
template <class T>
void expect_half_run_is_the_library(const std::function<std::string(const std::string&)>& path, const std::string& dtype,
                                    st::DType stored) {
  Generator gen(5);
  Tensor<T> query({3, 2, 8}), grad_output({3, 2, 8});
  for (auto* x : {&query, &grad_output})
    for (T& v : x->values()) v = narrow<T>(gen.uniform(-1, 1));
  Tensor<bool> padding({2, 3});
  padding[5] = true;
  st::File inputs;
  inputs.tensors["query"] = st::from_tensor(query);
  inputs.tensors["grad_output"] = st::from_tensor(grad_output);
  inputs.tensors["key_padding_mask"] = st::from_tensor(padding);
  ASSERT_EQ(inputs.tensors["query"].dtype, stored);
  st::save(inputs, path("half.safetensors"));
  const CliResult r = run_cli("attention --embed-dim 8 --num-heads 2 --backward --seed 3 --dtype " + dtype +
                              " --inputs " + path("half.safetensors") + " --output " + path("half_out.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const st::File out = st::load(path("half_out.safetensors"));
  nn::MultiheadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  nn::MultiheadAttention<T> module(o, 3);
  module.eval();
  nn::MultiheadAttentionArgs<T> args;
  args.key_padding_mask = padding;
  nn::MultiheadAttentionCache<T> cache;
  const auto y = module.forward(query, query, query, args, &cache);
  module.zero_grad();
  const auto grads = module.backward(grad_output, cache);
  std::map<std::string, const Tensor<T>*> want{{"output", &y.output}, {"attn_weights", &*y.attn_weights},
                                               {"grad_query", &grads.grad_query}, {"grad_key", &grads.grad_key},
                                               {"grad_value", &grads.grad_value}};
  for (const auto& p : module.parameters()) want["grad." + p.name] = p.grad;
  for (const auto& [name, expected] : want) {
    ASSERT_TRUE(out.tensors.count(name)) << name;
    EXPECT_EQ(out.tensors.at(name).dtype, stored) << name;
    const Tensor<T> got = st::to_tensor<T>(out.tensors.at(name), name);
    ASSERT_EQ(got.shape(), expected->shape()) << name;
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got[i].bits, (*expected)[i].bits) << name << " " << i;
  }
}

TEST_F(AttentionCliErrors, HalfDtypesReadAndWriteTheirOwnDtype) {
  const auto in_dir = [this](const std::string& name) { return path(name); };
  expect_half_run_is_the_library<bfloat16>(in_dir, "bfloat16", st::DType::BF16);
  expect_half_run_is_the_library<float16>(in_dir, "float16", st::DType::F16);
}

TEST_F(AttentionCliErrors, ModuleArgumentErrors) {
  const std::string in = " --inputs " + path("inputs.safetensors");
  expect_failure("--embed-dim 4 --num-heads 3" + in, "embed_dim must be divisible by num_heads");
  expect_failure("--embed-dim 6 --num-heads 2" + in, "query: expected last dimension embed_dim = 6");
  expect_failure("--embed-dim 4 --num-heads 2 --dropout 2" + in, "dropout: expected a probability");
  expect_failure("--num-heads 2" + in, "--embed-dim is required");
  expect_failure("--embed-dim 4 --num-heads 2 --no-such-flag" + in, "no-such-flag");
  expect_failure("--embed-dim 4 --num-heads 2 --is-causal" + in, "is_causal: PyTorch requires attn_mask");
}

TEST_F(AttentionCliErrors, InputFileErrors) {
  const std::string flags = "--embed-dim 4 --num-heads 2 --inputs ";
  expect_failure(flags + path("missing.safetensors"), "missing.safetensors");
  std::ofstream(path("corrupt.safetensors"), std::ios::binary) << "this is not a safetensors file";
  expect_failure(flags + path("corrupt.safetensors"), "corrupt.safetensors");

  st::File bad_mask;
  bad_mask.tensors["query"] = st::from_tensor(Tensor<float>({3, 2, 4}));
  bad_mask.tensors["attn_mask"] = st::from_tensor(Tensor<int64_t>({3, 3}));
  st::save(bad_mask, path("bad_mask.safetensors"));
  expect_failure(flags + path("bad_mask.safetensors"), "attn_mask: expected dtype BOOL or a float dtype");

  st::File int_query;
  int_query.tensors["query"] = st::from_tensor(Tensor<int64_t>({3, 2, 4}));
  st::save(int_query, path("int_query.safetensors"));
  expect_failure(flags + path("int_query.safetensors"), "query: expected a float dtype (F16, BF16, F32, F64), got I64");

  st::File no_query;
  no_query.tensors["key"] = st::from_tensor(Tensor<float>({3, 2, 4}));
  st::save(no_query, path("no_query.safetensors"));
  expect_failure(flags + path("no_query.safetensors"), "no tensor named 'query'");

  // A misspelt name is refused, not ignored (key_padding_msk would otherwise run unmasked); the
  // name is escaped and the accepted ones are listed.
  for (const std::string name : {"key_padding_msk", "bad\x1b[2Jname"}) {
    st::File misspelt;
    misspelt.tensors["query"] = st::from_tensor(Tensor<float>({3, 2, 4}));
    misspelt.tensors[name] = st::from_tensor(Tensor<bool>({2, 3}, true));
    st::save(misspelt, path("misspelt.safetensors"));
    const std::string shown = name == "key_padding_msk" ? name : "bad\\x1b[2Jname";
    expect_failure(flags + path("misspelt.safetensors"),
                   "misspelt.safetensors: unknown tensor '" + shown +
                       "' (--inputs takes query, key, value, key_padding_mask, attn_mask, sinks, alibi_slopes, grad_output)");
  }

  st::File no_grad;
  no_grad.tensors["query"] = st::from_tensor(Tensor<float>({3, 2, 4}));
  st::save(no_grad, path("no_grad.safetensors"));
  expect_failure(flags + path("no_grad.safetensors") + " --backward", "no tensor named 'grad_output'");
}

TEST_F(AttentionCliErrors, WeightErrors) {
  st::File weights;
  weights.tensors["in_proj_weight"] = st::from_tensor(Tensor<float>({12, 4}));
  weights.tensors["in_proj_bias"] = st::from_tensor(Tensor<float>({12}));
  weights.tensors["out_proj.weight"] = st::from_tensor(Tensor<float>({4, 3}));
  st::save(weights, path("weights.safetensors"));
  expect_failure("--embed-dim 4 --num-heads 2 --weights " + path("weights.safetensors") + " --inputs " +
                     path("inputs.safetensors"),
                 "tensor 'out_proj.weight': expected shape [4, 4], got [4, 3]");
  const CliResult r = run_cli("attention --embed-dim 4 --num-heads 2 --weights " + path("weights.safetensors") +
                              " --inputs " + path("inputs.safetensors") + " --output " + path("out.safetensors"));
  EXPECT_NE(r.output.find("missing tensor 'out_proj.bias'"), std::string::npos) << r.output;
}

TEST_F(AttentionCliErrors, UnwritableOutputLeavesNothing) {
  const CliResult r = run_cli("attention --embed-dim 4 --num-heads 2 --inputs " + path("inputs.safetensors") +
                              " --output " + path("no_such_dir/out.safetensors"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no_such_dir"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("no_such_dir")));
}

}  // namespace
}  // namespace mha
