#pragma once
// Comparing mha's results with PyTorch goldens (tests/goldens/README.md).
//
// The FlashAttention rule: a float32 result passes when its error against PyTorch's float64
// result is at most twice PyTorch's own float32 error against it, plus 1e-6 of the tensor's
// largest magnitude (so a tensor PyTorch happens to compute exactly still has a budget):
//   max|ours − f64| ≤ 2·max|torch_f32 − f64| + 1e-6·max|f64|
// PyTorch's float32 results (the peer's) are computed on this machine, from the committed
// inputs, by the ctest fixture goldens.peers (scripts/goldens/peers_here.py): load_peer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "mha/core/safetensors.h"

namespace mha::testing {

inline std::string goldens_dir() { return MHA_GOLDENS_DIR; }

// The peer's tensors of golden file `golden` (a path under goldens_dir()), as PyTorch computed
// them on this machine: the file at the same relative path under MHA_PEERS_DIR.
inline safetensors::File load_peer(const std::filesystem::path& golden) {
  const std::filesystem::path relative = std::filesystem::path(golden).lexically_relative(goldens_dir());
  if (relative.empty() || *relative.begin() == "..")
    throw Error("load_peer: " + golden.string() + " is not under " + goldens_dir());
  const std::filesystem::path peer = std::filesystem::path(MHA_PEERS_DIR) / relative;
  if (!std::filesystem::exists(peer))
    throw Error("load_peer: " + peer.string() + " is missing: run `ctest -R goldens.peers` (or " +
                "scripts/goldens/peers_here.py " + MHA_PEERS_DIR + ")");
  return safetensors::load(peer.string());
}

// Case folders under tests/goldens/<kind>/, sorted.
inline std::vector<std::filesystem::path> golden_cases(const std::string& kind) {
  std::vector<std::filesystem::path> cases;
  for (const auto& entry : std::filesystem::directory_iterator(goldens_dir() + "/" + kind))
    if (entry.is_directory()) cases.push_back(entry.path());
  std::sort(cases.begin(), cases.end());
  return cases;
}

inline double max_abs(const Tensor<double>& t) {
  double m = 0;
  for (double x : t.values()) m = std::max(m, std::abs(x));
  return m;
}

inline double max_abs_diff(const Tensor<double>& a, const Tensor<double>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::abs(a[i] - b[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

struct GoldenComparison {
  double error = 0;        // max|ours − f64|
  double torch_error = 0;  // max|torch_f32 − f64|
  double bound = 0;
  double scale = 0;        // max|f64|
  bool pass() const { return error <= bound; }
};

inline GoldenComparison compare_with_golden(const Tensor<double>& ours, const Tensor<double>& expected,
                                            const Tensor<double>& torch_f32) {
  GoldenComparison c;
  c.error = max_abs_diff(ours, expected);
  c.torch_error = max_abs_diff(torch_f32, expected);
  c.scale = max_abs(expected);
  c.bound = 2 * c.torch_error + 1e-6 * c.scale;
  return c;
}

// Compares every tensor of `expected_f64` with the same-named tensor of `ours` (which must
// have exactly the same names and shapes), under the rule above. With `exact_bound` set
// (ours computed in float64) the rule is instead max|ours − f64| ≤ exact_bound·max(1, max|f64|).
// Returns, for the report, the largest fraction of the allowed error used: error / bound under
// the float32 rule, error / (exact_bound·max(1, max|f64|)) in float64 mode.
inline double expect_matches_golden(const safetensors::File& ours, const safetensors::File& expected_f64,
                                    const safetensors::File& torch_f32, const std::string& case_name,
                                    double exact_bound = 0) {
  std::vector<std::string> our_names, expected_names;
  for (const auto& [name, t] : ours.tensors) our_names.push_back(name);
  for (const auto& [name, t] : expected_f64.tensors) expected_names.push_back(name);
  EXPECT_EQ(our_names, expected_names) << case_name << ": tensor names differ";
  double worst = 0;
  for (const auto& [name, data] : expected_f64.tensors) {
    if (!ours.tensors.count(name)) continue;
    const Tensor<double> expected = safetensors::to_tensor<double>(data, name);
    const Tensor<double> mine = safetensors::to_tensor<double>(ours.tensors.at(name), name);
    const Tensor<double> torch32 = safetensors::to_tensor<double>(safetensors::require(torch_f32, name, case_name), name);
    EXPECT_EQ(mine.shape(), expected.shape()) << case_name << ": " << name;
    if (mine.shape() != expected.shape()) continue;
    const GoldenComparison c = compare_with_golden(mine, expected, torch32);
    if (exact_bound > 0) {
      const double allowed = exact_bound * std::max(1.0, c.scale);
      EXPECT_LE(c.error, allowed) << case_name << ": " << name << " (float64)";
      worst = std::max(worst, c.error / allowed);
    } else {
      EXPECT_TRUE(c.pass()) << case_name << ": " << name << ": mha error " << c.error << " > bound " << c.bound
                            << " (PyTorch float32 error " << c.torch_error << ", scale " << c.scale << ")";
      worst = std::max(worst, c.bound > 0 ? c.error / c.bound : (c.error > 0 ? INFINITY : 0.0));
    }
  }
  return worst;
}

}  // namespace mha::testing
