#pragma once
// The --backend option of the commands that run attention (`mha attention`, `mha bench`).
#include <CLI/CLI.hpp>
#include <string>

#include "mha/attention/options.h"

namespace mha::tools {

inline void add_backend_option(CLI::App* cmd, std::string& name) {
  cmd->add_option("--backend", name, "attention backend (automatic: decode for float32 with at most 16 query rows and no weights, cpu_flash "
                  "for other float32 calls, reference for float64)")
      ->check(CLI::IsMember({"automatic", "reference", "cpu_flash", "decode"}))
      ->capture_default_str();
}

inline attention::Backend parse_backend(const std::string& name) {
  if (name == "reference") return attention::Backend::reference;
  if (name == "cpu_flash") return attention::Backend::cpu_flash;
  if (name == "decode") return attention::Backend::decode;
  return attention::Backend::automatic;
}

}  // namespace mha::tools
