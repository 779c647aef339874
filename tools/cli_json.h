// A minimal JSON writer for the memeff program's --json outputs: one flat or nested object built
// key by key, numbers printed with enough digits to round-trip, non-finite numbers as null.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace memeff::cli {

inline std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  // The shortest of 15 or 17 significant digits that reads back as the same double.
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value) { return raw(key, json_quote(value)); }
  JsonObject& add(const std::string& key, const char* value) { return raw(key, json_quote(value)); }
  JsonObject& add(const std::string& key, double value) { return raw(key, json_number(value)); }
  JsonObject& add(const std::string& key, std::int64_t value) { return raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, std::uint64_t value) { return raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, int value) { return raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  JsonObject& add(const std::string& key, const JsonObject& value) { return raw(key, value.str()); }
  // `json` must already be valid JSON text (an array, or another writer's output).
  JsonObject& raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ", ") + json_quote(key) + ": " + json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace memeff::cli
