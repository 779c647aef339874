// The memeff program's --json outputs: nlohmann::ordered_json, so keys print in the order the
// command sets them; compact text, non-finite numbers as null, invalid UTF-8 replaced; and the
// groups of keys that more than one report writes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cli_args.h"
#include "cli_problem.h"

namespace memeff::cli {

using Json = nlohmann::ordered_json;

// `indent` < 0: one line; otherwise nlohmann's pretty form with that many spaces per level.
inline std::string json_text(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// The problem's shape and mask fields of a run report (B through dropout, and the window,
// ALiBi and softcap where set), shared by `memeff run`
// and `memeff run --context-parallel`.
inline void add_shape_json(Json& j, const ShapeConfig& c) {
  j["B"] = c.B;
  j["Hq"] = c.Hq;
  j["Hkv"] = c.hkv();
  j["Lq"] = c.Lq;
  j["Lk"] = c.lk();
  j["D"] = c.D;
  j["Dv"] = c.dv();
  j["causal"] = causal_mode_name(c.causal);
  j["bias"] = c.bias.text();
  j["dropout"] = c.dropout;
  // Window, ALiBi and softcap only where set, so that other reports keep their keys.
  if (c.window.bounded()) j["window"] = {c.window.left, c.window.right};
  if (c.alibi) j["alibi"] = true;
  if (c.softcap > 0.0) j["softcap"] = c.softcap;
}

// fwd_ms bwd_ms fwd_tflops bwd_tflops, and both passes' TFLOP/s under `fwdbwd_key` (`memeff run`
// says "tflops", `memeff bench` the peer script's "fwdbwd_tflops").
inline void add_rates_json(Json& j, const PassRates& r, const char* fwdbwd_key) {
  j["fwd_ms"] = r.fwd_ms;
  j["bwd_ms"] = r.bwd_ms;
  j["fwd_tflops"] = r.fwd_tflops;
  j["bwd_tflops"] = r.bwd_tflops;
  j[fwdbwd_key] = r.fwdbwd_tflops;
}

}  // namespace memeff::cli
