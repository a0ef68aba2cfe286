#pragma once
// State dicts as .safetensors files, so weights move between mha and PyTorch unchanged
// (torch: safetensors.torch.save_file(module.state_dict(), path) / load_file(path)).
#include <map>
#include <string>

#include "mha/nn/module.h"

namespace mha::nn {

// Reads every tensor of the file, converting any float dtype (F16, BF16, F32, F64) to T.
// A tensor of another dtype is an mha::Error naming the file and the tensor.
template <class T>
StateDict<T> load_state_dict_file(const std::string& path);

// Writes the tensors as F32 (float) or F64 (double), atomically.
template <class T>
void save_state_dict_file(const StateDict<T>& state, const std::string& path,
                          const std::map<std::string, std::string>& metadata = {});

}  // namespace mha::nn
