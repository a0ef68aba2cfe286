// sdpa_forward / sdpa_backward against PyTorch's scaled_dot_product_attention goldens
// (tests/goldens/sdpa): float32 under the FlashAttention rule, float64 at 1e-10.
#include <gtest/gtest.h>

#include "../support/golden.h"
#include "mha/attention/attention.h"

namespace mha::attention {
namespace {

namespace fs = std::filesystem;
namespace st = mha::safetensors;

Causal parse_causal(const std::string& s) {
  if (s == "top_left") return Causal::top_left;
  if (s == "bottom_right") return Causal::bottom_right;
  EXPECT_EQ(s, "none");
  return Causal::none;
}

// Runs one golden case in precision T and returns the results under the golden's names.
template <class T>
st::File run_case(const st::File& inputs) {
  auto input = [&](const char* name) { return st::to_tensor<T>(st::require(inputs, name, "inputs"), name); };
  const Tensor<T> q = input("query"), k = input("key"), v = input("value"), dout = input("grad_output");
  Options<T> opt;
  opt.causal = parse_causal(inputs.metadata.at("causal"));
  if (!inputs.metadata.at("scale").empty()) opt.scale = std::stod(inputs.metadata.at("scale"));
  // PyTorch's bool mask has SDPA polarity (True = may attend), the same as attend_mask.
  std::optional<Tensor<bool>> attend;
  std::optional<Tensor<T>> additive;
  if (auto it = inputs.tensors.find("attn_mask"); it != inputs.tensors.end()) {
    if (it->second.dtype == st::DType::BOOL) {
      attend = st::to_tensor<bool>(it->second, "attn_mask");
      opt.attend_mask = *attend;
    } else {
      additive = st::to_tensor<T>(it->second, "attn_mask");
      opt.additive_mask = *additive;
    }
  }
  auto fwd = sdpa_forward(q, k, v, opt);
  auto grads = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
  st::File out;
  out.tensors["output"] = st::from_tensor(fwd.output);
  out.tensors["grad_query"] = st::from_tensor(grads.grad_query);
  out.tensors["grad_key"] = st::from_tensor(grads.grad_key);
  out.tensors["grad_value"] = st::from_tensor(grads.grad_value);
  return out;
}

class SdpaGolden : public ::testing::TestWithParam<fs::path> {};

TEST_P(SdpaGolden, MatchesPyTorch) {
  const fs::path dir = GetParam();
  const st::File inputs = st::load(dir / "inputs.safetensors");
  const st::File expected = st::load(dir / "expected_f64.safetensors");
  const st::File torch32 = st::load(dir / "torch_f32.safetensors");
  const std::string name = dir.filename().string();
  const double worst32 = testing::expect_matches_golden(run_case<float>(inputs), expected, torch32, name + " float32");
  const double worst64 = testing::expect_matches_golden(run_case<double>(inputs), expected, torch32, name + " float64", 1e-10);
  std::cout << "[golden] sdpa " << name << " largest fraction of the allowed error: float32 " << worst32 << ", float64 " << worst64 << "\n";
}

INSTANTIATE_TEST_SUITE_P(Reference, SdpaGolden, ::testing::ValuesIn(testing::golden_cases("sdpa")),
                         [](const auto& info) { return info.param.filename().string(); });

}  // namespace
}  // namespace mha::attention
