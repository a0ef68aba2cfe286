#pragma once
// The shared shape of every layer in mha::nn.
//
// A layer owns its parameters and their gradients. forward(x, cache) computes the output and,
// when a cache is given, saves what backward needs; backward(grad_output, cache) returns the
// gradient for the input and ADDS parameter gradients into the layer's grad tensors (so several
// backward calls accumulate, as in PyTorch; zero_grad() resets them).
//
// Parameters are listed by name, in PyTorch's state_dict naming, so state_dict() and
// load_state_dict() exchange weights with torch.nn modules unchanged.
#include <map>
#include <string>
#include <vector>

#include "mha/core/tensor.h"

namespace mha::nn {

template <class T>
using StateDict = std::map<std::string, Tensor<T>>;

template <class T>
struct Parameter {
  std::string name;  // e.g. "in_proj_weight", "out_proj.bias"
  Tensor<T>* value;
  Tensor<T>* grad;   // same shape as value
};

template <class T>
class Module {
 public:
  virtual ~Module() = default;

  // Every parameter, in a fixed order, with PyTorch's names.
  virtual std::vector<Parameter<T>> parameters() = 0;

  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  void zero_grad() {
    for (auto& p : parameters()) *p.grad = Tensor<T>(p.value->shape());
  }

  StateDict<T> state_dict() {
    StateDict<T> out;
    for (auto& p : parameters()) out.emplace(p.name, *p.value);
    return out;
  }

  // Strict, like PyTorch's default: a missing, unexpected or wrongly shaped tensor is an
  // mha::Error naming it (all problems are listed on one line, not just the first).
  void load_state_dict(const StateDict<T>& state) {
    std::string problems;
    auto add_problem = [&](const std::string& p) { problems += (problems.empty() ? " " : "; ") + p; };
    auto params = parameters();
    for (auto& p : params) {
      auto it = state.find(p.name);
      if (it == state.end()) {
        add_problem("missing tensor '" + p.name + "' with shape " + to_string(p.value->shape()));
      } else if (it->second.shape() != p.value->shape()) {
        add_problem("tensor '" + p.name + "': expected shape " + to_string(p.value->shape()) + ", got " +
                    to_string(it->second.shape()));
      }
    }
    for (auto& [name, tensor] : state) {
      bool known = false;
      for (auto& p : params) known = known || p.name == name;
      if (!known) add_problem("unexpected tensor '" + name + "' with shape " + to_string(tensor.shape()));
    }
    check(problems.empty(), "load_state_dict: the state dict does not match the module:", problems);
    for (auto& p : params) *p.value = state.at(p.name);
  }

 protected:
  // For composite modules: a child's parameters under "<prefix>.<name>" (PyTorch's naming of
  // submodule parameters), e.g. "weight" of child "out_proj" -> "out_proj.weight".
  static void append_prefixed(std::vector<Parameter<T>>& out, std::vector<Parameter<T>> child,
                              const std::string& prefix) {
    for (auto& p : child) out.push_back({prefix + "." + p.name, p.value, p.grad});
  }

  bool training_ = true;
};

}  // namespace mha::nn
