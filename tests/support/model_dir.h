#pragma once
// The real pretrained model the tests use: sentence-transformers/all-MiniLM-L6-v2, put at
// models/all-MiniLM-L6-v2 by `make model` (scripts/install_model.sh; the path comes from the
// build, MHA_MODEL_DIR). A test that needs it fails, saying how to get it, when it is missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace mha::testing {

inline std::string minilm_dir() { return MHA_MODEL_DIR; }

inline ::testing::AssertionResult have_minilm() {
  if (std::filesystem::exists(minilm_dir() + "/model.safetensors")) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << minilm_dir()
                                       << "/model.safetensors is missing: run `make model` (scripts/install_model.sh)";
}

}  // namespace mha::testing
