// nlohmann/json as core uses it: the document type, one compact writer (keys sorted, invalid
// UTF-8 replaced rather than thrown) for the autotune cache and explain()'s JSON report, and a
// member lookup that is null for a missing key or a value that is not an object.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace memeff::detail {

using Json = nlohmann::json;

inline std::string json_text(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

inline const Json* json_member(const Json& value, const char* key) {
  if (!value.is_object()) return nullptr;
  const auto it = value.find(key);
  return it == value.end() ? nullptr : &*it;
}

}  // namespace memeff::detail
