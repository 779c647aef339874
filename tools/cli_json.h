// The memeff program's --json outputs: nlohmann::ordered_json, so keys print in the order the
// command sets them; compact text, non-finite numbers as null, invalid UTF-8 replaced.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace memeff::cli {

using Json = nlohmann::ordered_json;

// `indent` < 0: one line; otherwise nlohmann's pretty form with that many spaces per level.
inline std::string json_text(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace memeff::cli
