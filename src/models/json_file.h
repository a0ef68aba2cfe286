#pragma once
// Reading the small JSON files of a Hugging Face model directory (config.json,
// tokenizer_config.json, modules.json, ...): every error names the file and the field.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace mha::models::detail {

using Json = nlohmann::json;

// The file parsed; mha::Error "<path>: ..." when it cannot be read or is not JSON (the parser's
// message included). `object`: the top level must be an object.
Json read_json_file(const std::string& path, bool object = true);

// Field `name` of object `json` read from `path`: absent -> nullopt (the optional_ forms) or an
// error; present with the wrong type or out of range -> an error naming the file, the field,
// what was expected and the value found.
int64_t positive_int(const Json& json, const std::string& name, const std::string& path);
std::optional<int64_t> optional_int(const Json& json, const std::string& name, const std::string& path,
                                    int64_t min = 0);
double positive_number(const Json& json, const std::string& name, const std::string& path);
std::string string_field(const Json& json, const std::string& name, const std::string& path);
std::optional<std::string> optional_string(const Json& json, const std::string& name, const std::string& path);
std::optional<bool> optional_bool(const Json& json, const std::string& name, const std::string& path);

}  // namespace mha::models::detail
