#pragma once
// What the two safetensors targets (safetensors_parse, safetensors_roundtrip) share: same(), the
// property a file read back must keep.
#include "mha/core/safetensors.h"

namespace mha::fuzz {

// The same metadata and the same tensors: names, dtypes, shapes and bytes.
inline bool same(const safetensors::File& a, const safetensors::File& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, tensor] : a.tensors) {
    const auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.dtype != tensor.dtype || it->second.shape != tensor.shape ||
        it->second.bytes != tensor.bytes)
      return false;
  }
  return true;
}

}  // namespace mha::fuzz
