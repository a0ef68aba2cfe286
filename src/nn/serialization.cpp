#include "mha/nn/serialization.h"

#include "mha/core/safetensors.h"

namespace mha::nn {

template <class T>
StateDict<T> load_state_dict_file(const std::string& path) {
  namespace st = mha::safetensors;
  StateDict<T> state;
  const st::MappedFile file(path);  // each weight decoded once, straight from the mapping
  for (const auto& [name, data] : file.tensors()) {
    const bool is_float = data.dtype == st::DType::F16 || data.dtype == st::DType::BF16 ||
                          data.dtype == st::DType::F32 || data.dtype == st::DType::F64;
    check(is_float, path, ": tensor '", name, "': expected a float dtype (F16, BF16, F32, F64) for a weight, got ",
          st::to_string(data.dtype));
    state.emplace(name, st::to_tensor<T>(data, path + ": " + name));
  }
  return state;
}

template <class T>
void save_state_dict_file(const StateDict<T>& state, const std::string& path,
                          const std::map<std::string, std::string>& metadata) {
  safetensors::File file;
  file.metadata = metadata;
  for (const auto& [name, tensor] : state) file.tensors.emplace(name, safetensors::from_tensor(tensor));
  safetensors::save(file, path);
}

template StateDict<float> load_state_dict_file(const std::string&);
template StateDict<double> load_state_dict_file(const std::string&);
template void save_state_dict_file(const StateDict<float>&, const std::string&, const std::map<std::string, std::string>&);
template void save_state_dict_file(const StateDict<double>&, const std::string&, const std::map<std::string, std::string>&);
template StateDict<bfloat16> load_state_dict_file(const std::string&);
template StateDict<float16> load_state_dict_file(const std::string&);
template void save_state_dict_file(const StateDict<bfloat16>&, const std::string&, const std::map<std::string, std::string>&);
template void save_state_dict_file(const StateDict<float16>&, const std::string&, const std::map<std::string, std::string>&);

}  // namespace mha::nn
