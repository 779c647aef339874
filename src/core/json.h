// A small JSON value with a strict parser and a writer, enough for the autotune cache file and
// explain()'s JSON report. Parsing never throws on bad input: it reports where the text went
// wrong, so a corrupt or truncated cache file is ignored with a message instead of a crash.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace memeff::detail::json {

class Value {
 public:
  enum class Kind : std::uint8_t { null, boolean, number, string, array, object };

  Value() = default;
  static Value boolean(bool b);
  static Value number(double d);
  static Value string(std::string s);
  static Value array(std::vector<Value> items = {});
  static Value object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }

  bool as_bool() const { return bool_; }
  double as_number() const { return number_; }
  const std::string& as_string() const { return string_; }
  const std::vector<Value>& items() const { return items_; }
  std::vector<Value>& items() { return items_; }
  // Object members in key order.
  const std::map<std::string, Value>& members() const { return members_; }

  // Object access: nullptr when absent or when this is not an object.
  const Value* find(const std::string& key) const;
  Value& set(const std::string& key, Value v);  // makes this an object if it is null
  void push(Value v);                           // makes this an array if it is null

  std::string dump() const;  // compact, keys sorted, numbers with round-trip precision

 private:
  Kind kind_ = Kind::null;
  bool bool_ = false;
  double number_ = 0.0;
  std::string string_;
  std::vector<Value> items_;
  std::map<std::string, Value> members_;
};

// Parses a whole document (surrounding whitespace allowed). On failure returns nullopt and sets
// `error` to what was wrong and the byte offset.
std::optional<Value> parse(const std::string& text, std::string* error = nullptr);

// `s` as a quoted JSON string literal.
std::string quote(const std::string& s);

}  // namespace memeff::detail::json
