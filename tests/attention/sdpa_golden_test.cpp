// sdpa_forward / sdpa_backward against PyTorch's scaled_dot_product_attention goldens
// (tests/goldens/sdpa) and the score variants computed by their anchors' own code (tests/goldens/variants:
// Gemma 2, gpt-oss, Bloom, FlashAttention-2): float32 under the FlashAttention rule, float64 at 1e-10.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <type_traits>

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

// One metadata string as a settings field of type V: Causal by name, an optional as absent when
// empty, bool as true/false, numbers as written.
template <class V>
V parse_field(const std::string& text, const std::string& name) {
  if constexpr (std::is_same_v<V, Causal>) {
    return parse_causal(text);
  } else if constexpr (requires(V v) { v.has_value(); v.reset(); }) {
    if (text.empty()) return std::nullopt;
    return parse_field<typename V::value_type>(text, name);
  } else if constexpr (std::is_same_v<V, bool>) {
    EXPECT_TRUE(text == "true" || text == "false") << name << ": " << text;
    return text == "true";
  } else if constexpr (std::is_floating_point_v<V>) {
    return static_cast<V>(std::stod(text));
  } else if constexpr (std::is_unsigned_v<V>) {
    return static_cast<V>(std::stoull(text));
  } else if constexpr (std::is_integral_v<V>) {
    return static_cast<V>(std::stoll(text));
  } else {
    static_assert(std::is_enum_v<V>, "a Scoring field type the goldens' metadata cannot give");
    return static_cast<V>(std::stoll(text));
  }
}

// Every Scoring field that the metadata names (for_each_field: a nested struct's as
// "outer.inner"); a field it does not name keeps its default.
void read_fields(const std::map<std::string, std::string>& metadata, Scoring& settings) {
  for_each_field(settings, [&](const std::string& key, auto& value) {
    if (auto it = metadata.find(key); it != metadata.end()) value = parse_field<std::decay_t<decltype(value)>>(it->second, key);
  });
}

// Runs one golden case in precision T and returns the results under the golden's names.
template <class T>
st::File run_case(const st::File& inputs) {
  auto input = [&](const char* name) { return st::to_tensor<T>(st::require(inputs, name, "inputs"), name); };
  const Tensor<T> q = input("query"), k = input("key"), v = input("value"), dout = input("grad_output");
  Options<T> opt;
  read_fields(inputs.metadata, static_cast<Scoring&>(opt));
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
  // The variant goldens' per-head tensors: sinks and ALiBi slopes.
  std::optional<Tensor<T>> sinks, slopes;
  if (inputs.tensors.count("sinks")) opt.sinks = *(sinks = input("sinks"));
  if (inputs.tensors.count("alibi_slopes")) opt.alibi_slopes = *(slopes = input("alibi_slopes"));
  // Packed sequences' offsets (int64).
  std::optional<Tensor<int64_t>> cu_q, cu_k;
  if (inputs.tensors.count("cu_seqlens_q")) {
    opt.cu_seqlens_q = *(cu_q = st::to_tensor<int64_t>(inputs.tensors.at("cu_seqlens_q"), "cu_seqlens_q"));
    opt.cu_seqlens_k = *(cu_k = st::to_tensor<int64_t>(st::require(inputs, "cu_seqlens_k", "inputs"), "cu_seqlens_k"));
  }
  auto fwd = sdpa_forward(q, k, v, opt);
  auto grads = sdpa_backward(q, k, v, fwd.output, fwd.logsumexp, dout, opt);
  st::File out;
  out.tensors["output"] = st::from_tensor(fwd.output);
  out.tensors["grad_query"] = st::from_tensor(grads.grad_query);
  out.tensors["grad_key"] = st::from_tensor(grads.grad_key);
  out.tensors["grad_value"] = st::from_tensor(grads.grad_value);
  if (grads.grad_sinks) out.tensors["grad_sinks"] = st::from_tensor(*grads.grad_sinks);
  return out;
}

class SdpaGolden : public ::testing::TestWithParam<fs::path> {};

TEST_P(SdpaGolden, MatchesPyTorch) {
  const fs::path dir = GetParam();
  const st::File inputs = st::load(dir / "inputs.safetensors");
  const st::File expected = st::load(dir / "expected_f64.safetensors");
  const st::File torch32 = testing::load_peer(dir / "torch_f32.safetensors");
  const std::string name = dir.filename().string();
  const double worst32 = testing::expect_matches_golden(run_case<float>(inputs), expected, torch32, name + " float32");
  const double worst64 = testing::expect_matches_golden(run_case<double>(inputs), expected, torch32, name + " float64", 1e-10);
  std::cout << "[golden] " << dir.parent_path().filename().string() << " " << name << " largest fraction of the allowed error: float32 " << worst32 << ", float64 " << worst64 << "\n";
}

// The metadata is read through Scoring's field list: a field it names is set, one it omits keeps
// its default, a nested field is "whole_call.<name>", and other keys are ignored.
TEST(SdpaGoldenMetadata, ReadsEveryScoringFieldItNames) {
  Scoring s;
  read_fields({{"causal", "bottom_right"}, {"scale", "-0.45"}, {"dropout_seed", "7"}, {"whole_call.key_len", "9"},
               {"description", "ignored"}},
              s);
  Scoring want;
  want.causal = Causal::bottom_right;
  want.scale = -0.45;
  want.dropout_seed = 7;
  want.whole_call.key_len = 9;
  EXPECT_EQ(s, want);
  read_fields({{"scale", ""}, {"dropout_p", "0.25"}}, s);
  want.scale.reset();
  want.dropout_p = 0.25;
  EXPECT_EQ(s, want);
}

INSTANTIATE_TEST_SUITE_P(Reference, SdpaGolden, ::testing::ValuesIn(testing::golden_cases("sdpa")),
                         [](const auto& info) { return info.param.filename().string(); });
// The score variants, computed by the anchors' own code (scripts/goldens/make_variant_goldens.py).
INSTANTIATE_TEST_SUITE_P(Variants, SdpaGolden, ::testing::ValuesIn(testing::golden_cases("variants")),
                         [](const auto& info) { return info.param.filename().string(); });

}  // namespace
}  // namespace mha::attention
