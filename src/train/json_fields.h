#pragma once
// The training records as JSON (a run's configuration, an epoch's figures), each record's fields
// listed once (visit_fields) for the writer and the reader, which refuses missing, unknown and
// mistyped fields. Internal to mha_train (config.cpp, checkpoint.cpp).
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "mha/train/trainer.h"

namespace mha::train::detail {

using json = nlohmann::json;

template <class C, class F>  // C: models::AttentionClassifierConfig, const or not
void visit_fields(C& m, F&& f) requires std::is_same_v<std::remove_const_t<C>, models::AttentionClassifierConfig> {
  f("sequence_length", m.sequence_length);
  f("input_dim", m.input_dim);
  f("embed_dim", m.embed_dim);
  f("num_heads", m.num_heads);
  f("hidden_dim", m.hidden_dim);
  f("num_classes", m.num_classes);
  f("num_blocks", m.num_blocks);
  f("input_projection", m.input_projection);
  f("learned_positions", m.learned_positions);
  f("pre_norm", m.pre_norm);
  f("dropout", m.dropout);
}

template <class C, class F>  // TrainingConfig's own fields (its model is an object of its own)
void visit_fields(C& c, F&& f) requires std::is_same_v<std::remove_const_t<C>, TrainingConfig> {
  f("epochs", c.epochs);
  f("batch_size", c.batch_size);
  f("lr", c.lr);
  f("min_lr", c.min_lr);
  f("warmup_steps", c.warmup_steps);
  f("weight_decay", c.weight_decay);
  f("seed", c.seed);
  f("train_limit", c.train_limit);
  f("test_limit", c.test_limit);
}

template <class C, class F>
void visit_fields(C& s, F&& f) requires std::is_same_v<std::remove_const_t<C>, EpochStats> {
  f("epoch", s.epoch);
  f("steps", s.steps);
  f("train_loss", s.train_loss);
  f("train_accuracy", s.train_accuracy);
  f("test_loss", s.test_loss);
  f("test_accuracy", s.test_accuracy);
  f("seconds", s.seconds);
  f("samples_per_second", s.samples_per_second);
  f("lr", s.lr);
}

// A record's fields as a JSON object.
template <class C>
json to_json_object(const C& record) {
  json j = json::object();
  visit_fields(record, [&](const char* name, const auto& value) { j[name] = value; });
  return j;
}

// Reads object `j`'s fields into variables by name, refusing missing, unknown and mistyped fields.
class FieldReader {
 public:
  FieldReader(const json& j, std::string what) : j_(j), what_(std::move(what)) {
    check(j_.is_object(), what_, ": expected a JSON object, got ", j_.type_name());
  }
  template <class V>
  void operator()(const char* name, V& value) {
    seen_.insert(name);
    check(j_.contains(name), what_, ": missing field '", name, "'");
    const json& f = j_.at(name);
    if constexpr (std::is_same_v<V, bool>) {
      check(f.is_boolean(), what_, ": field '", name, "': expected true or false, got ", f.dump());
    } else if constexpr (std::is_integral_v<V>) {
      check(f.is_number_integer(), what_, ": field '", name, "': expected an integer, got ", f.dump());
      if constexpr (std::is_unsigned_v<V>)
        check(f.is_number_unsigned(), what_, ": field '", name, "': expected an integer >= 0, got ", f.dump());
    } else {
      check(f.is_number(), what_, ": field '", name, "': expected a number, got ", f.dump());
    }
    value = f.get<V>();
  }
  void mark(const char* name) { seen_.insert(name); }
  void finish() const {
    for (const auto& [key, v] : j_.items())
      check(seen_.count(key) == 1, what_, ": unexpected field '", key, "'");
  }

 private:
  const json& j_;
  std::string what_;
  std::set<std::string> seen_;
};

inline json parse_json(const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(what + ": invalid JSON: " + e.what());
  }
}

// Object `j`'s fields read into `record` (`what` names it in errors).
template <class C>
void read_fields(const json& j, const std::string& what, C& record) {
  FieldReader r(j, what);
  visit_fields(record, r);
  r.finish();
}

}  // namespace mha::train::detail
