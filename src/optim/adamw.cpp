#include "mha/optim/adamw.h"

#include <cmath>
#include <set>
#include <string>

namespace mha::optim {

void check_options(const AdamWOptions& o) {
  check(std::isfinite(o.lr) && o.lr >= 0, "AdamW: lr: expected a finite value >= 0, got ", o.lr);
  check(std::isfinite(o.beta1) && o.beta1 >= 0 && o.beta1 < 1, "AdamW: beta1: expected a value in [0, 1), got ",
        o.beta1);
  check(std::isfinite(o.beta2) && o.beta2 >= 0 && o.beta2 < 1, "AdamW: beta2: expected a value in [0, 1), got ",
        o.beta2);
  check(std::isfinite(o.eps) && o.eps >= 0, "AdamW: eps: expected a finite value >= 0, got ", o.eps);
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
        "AdamW: weight_decay: expected a finite value >= 0, got ", o.weight_decay);
}

template <class T>
AdamW<T>::AdamW(std::vector<nn::Parameter<T>> parameters, const AdamWOptions& options)
    : parameters_(std::move(parameters)), options_(options) {
  check_options(options_);
  std::set<std::string> names;
  for (const auto& p : parameters_) {
    check(p.value != nullptr && p.grad != nullptr && p.value->defined(), "AdamW: parameter '", p.name,
          "': expected a defined value and gradient");
    check(names.insert(p.name).second, "AdamW: parameter names must be unique, got '", p.name, "' twice");
    check_shape(p.grad->shape(), p.value->shape(), "AdamW: gradient of '" + p.name + "'");
    slots_.push_back({Tensor<T>(p.value->shape()), Tensor<T>(p.value->shape())});
  }
}

template <class T>
void AdamW<T>::set_lr(double lr) {
  check(std::isfinite(lr) && lr >= 0, "AdamW::set_lr: lr: expected a finite value >= 0, got ", lr);
  options_.lr = lr;
}

template <class T>
void AdamW<T>::zero_grad() {
  for (auto& p : parameters_) std::fill_n(p.grad->data(), p.grad->numel(), T(0));
}

template <class T>
void AdamW<T>::step() {
  ++steps_;
  const double lr = options_.lr, beta1 = options_.beta1, beta2 = options_.beta2;
  // The scalars PyTorch computes in Python (double) and hands to float kernels.
  const T decay = static_cast<T>(1.0 - lr * options_.weight_decay);
  const T one_minus_beta1 = static_cast<T>(1.0 - beta1);
  const T beta2_t = static_cast<T>(beta2);
  const T one_minus_beta2 = static_cast<T>(1.0 - beta2);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(steps_));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(steps_));
  const T neg_step_size = static_cast<T>(-(lr / bias_correction1));
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T eps = static_cast<T>(options_.eps);
  const bool decays = options_.weight_decay != 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& p = parameters_[i];
    check_shape(p.grad->shape(), p.value->shape(), "AdamW::step: gradient of '" + p.name + "'");
    T* value = p.value->data();
    const T* grad = p.grad->data();
    T* m = slots_[i].exp_avg.data();
    T* v = slots_[i].exp_avg_sq.data();
    const int64_t n = p.value->numel();
    for (int64_t j = 0; j < n; ++j) {
      if (decays) value[j] *= decay;
      const T g = grad[j];
      m[j] = m[j] + one_minus_beta1 * (g - m[j]);
      v[j] = v[j] * beta2_t + one_minus_beta2 * g * g;
      const T denom = std::sqrt(v[j]) / bias_correction2_sqrt + eps;
      value[j] = value[j] + neg_step_size * (m[j] / denom);
    }
  }
}

template <class T>
nn::StateDict<T> AdamW<T>::state_dict() const {
  nn::StateDict<T> out;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const std::string& name = parameters_[i].name;
    out.emplace(name + ".exp_avg", slots_[i].exp_avg);
    out.emplace(name + ".exp_avg_sq", slots_[i].exp_avg_sq);
    // As PyTorch keeps it: a scalar tensor of the parameter's type (exact up to 2^24 in float).
    out.emplace(name + ".step", Tensor<T>(Shape{}, static_cast<T>(steps_)));
  }
  return out;
}

template <class T>
void AdamW<T>::load_state_dict(const nn::StateDict<T>& state) {
  std::string problems;
  auto add_problem = [&](const std::string& p) { problems += (problems.empty() ? " " : "; ") + p; };
  std::set<std::string> expected;
  double step = -1;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& p = parameters_[i];
    for (const char* suffix : {".exp_avg", ".exp_avg_sq", ".step"}) {
      const std::string key = p.name + suffix;
      expected.insert(key);
      const Shape shape = std::string(suffix) == ".step" ? Shape{} : p.value->shape();
      auto it = state.find(key);
      if (it == state.end()) {
        add_problem("missing tensor '" + key + "' with shape " + to_string(shape));
      } else if (it->second.shape() != shape) {
        add_problem("tensor '" + key + "': expected shape " + to_string(shape) + ", got " +
                    to_string(it->second.shape()));
      } else if (shape.empty()) {
        const double s = static_cast<double>(it->second[0]);
        if (!(s >= 0 && s == std::floor(s) && s <= 16777216.0))
          add_problem("tensor '" + key + "': expected a whole number of steps >= 0, got " + std::to_string(s));
        else if (step >= 0 && s != step)
          add_problem("tensor '" + key + "': step " + std::to_string(s) + " differs from the other parameters' " +
                      std::to_string(step));
        else
          step = s;
      }
    }
  }
  for (const auto& [name, tensor] : state)
    if (!expected.count(name)) add_problem("unexpected tensor '" + name + "' with shape " + to_string(tensor.shape()));
  check(problems.empty(), "AdamW::load_state_dict: the state does not match the optimizer's parameters:", problems);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    slots_[i].exp_avg = state.at(parameters_[i].name + ".exp_avg");
    slots_[i].exp_avg_sq = state.at(parameters_[i].name + ".exp_avg_sq");
  }
  steps_ = step < 0 ? 0 : static_cast<int64_t>(step);
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace mha::optim
