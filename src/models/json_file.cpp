#include "json_file.h"

#include <fstream>
#include <sstream>

#include "mha/core/error.h"

namespace mha::models::detail {
namespace {

std::string shown(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

const Json* find(const Json& json, const std::string& name) {
  const auto it = json.find(name);
  return it == json.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

Json read_json_file(const std::string& path, bool object) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), path, ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  check(!in.bad(), path, ": cannot read the file");
  Json json;
  try {
    json = Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  check(!object || json.is_object(), path, ": expected a JSON object at the top level, got ", shown(json));
  return json;
}

std::optional<int64_t> optional_int(const Json& json, const std::string& name, const std::string& path, int64_t min) {
  const Json* v = find(json, name);
  if (v == nullptr) return std::nullopt;
  check(v->is_number_integer() && v->get<int64_t>() >= min, path, ": field '", name, "': expected an integer >= ", min,
        ", got ", shown(*v));
  return v->get<int64_t>();
}

int64_t positive_int(const Json& json, const std::string& name, const std::string& path) {
  check(find(json, name) != nullptr, path, ": field '", name, "' is missing (expected a positive integer)");
  return *optional_int(json, name, path, 1);
}

double positive_number(const Json& json, const std::string& name, const std::string& path) {
  const Json* v = find(json, name);
  check(v != nullptr, path, ": field '", name, "' is missing (expected a positive number)");
  check(v->is_number() && v->get<double>() > 0, path, ": field '", name, "': expected a positive number, got ",
        shown(*v));
  return v->get<double>();
}

std::optional<std::string> optional_string(const Json& json, const std::string& name, const std::string& path) {
  const Json* v = find(json, name);
  if (v == nullptr) return std::nullopt;
  check(v->is_string(), path, ": field '", name, "': expected a string, got ", shown(*v));
  return v->get<std::string>();
}

std::string string_field(const Json& json, const std::string& name, const std::string& path) {
  auto v = optional_string(json, name, path);
  check(v.has_value(), path, ": field '", name, "' is missing (expected a string)");
  return *v;
}

std::optional<bool> optional_bool(const Json& json, const std::string& name, const std::string& path) {
  const Json* v = find(json, name);
  if (v == nullptr) return std::nullopt;
  check(v->is_boolean(), path, ": field '", name, "': expected true or false, got ", shown(*v));
  return v->get<bool>();
}

}  // namespace mha::models::detail
