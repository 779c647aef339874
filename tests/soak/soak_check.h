// The checks of a soak call: a scan of every output for values that cannot be right, and the
// sampled comparison with the `reference` backend, which recomputes the call (or an exact
// sub-problem of it: a leading box of batches, heads, rows or sequences) in fp64 from the same
// input values with the same dropout mask, under the tolerances of the tests
// (tests/common/tolerance.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "soak_call.h"

namespace memeff::soak {

// An output copied to the host: its bytes and the call's view of them (same strides).
struct HostCopy {
  std::vector<unsigned char> bytes;
  TensorView view;
};
HostCopy host_copy(const Output& output);

// Every output of a call on the host (the gradients undefined for a forward-only call).
struct CallOutputs {
  HostCopy out, lse, dq, dk, dv, dbias;
  explicit CallOutputs(const CallTensors& t);
};

// "out: NaN at [0, 3, 17, 5]" for the first element that no correct call writes: a NaN or an
// infinity, except -inf in lse (a row that sees no key); "" when there is none.
std::string first_nonfinite(const CallOutputs& outputs);

// The leading box of every tensor that the reference recomputes.
struct CheckPlan {
  bool whole = true;
  std::int64_t batches = 0, heads = 0, rows = 0, keys = 0;  // dense calls
  std::int64_t sequences = 0;                               // packed calls: the first ones
  bool kv_gradients = true;  // dk and dv are checked (not with a prefix of the rows)
  bool dbias = true;         // dbias is checked (its sums lie inside the box)
  double work = 0.0;         // Lq·Lk·(D+Dv) over the box's heads, x3 with the backward
  std::string describe(const CallSpec& spec) const;
};

// The largest exact sub-problem within `max_work`: the whole call; else batch 0 and the first
// query heads (whole GQA groups: the dropout mask of head h of batch b is keyed by b·Hq + h, so
// that box draws the same mask); else the first query rows of one group with the keys they can
// see (out, lse, dq); packed calls: the first sequences. nullopt when nothing fits.
std::optional<CheckPlan> plan_check(const CallSpec& spec, double max_work);

struct Comparison {
  std::string name;
  double max_abs = 0.0, max_ref = 0.0, bound = 0.0;
  bool nonfinite = false;  // a NaN, or an infinity where the reference has none or another
  std::string where;       // the worst element, "[b, h, i, d]"
  bool pass() const { return !nonfinite && max_abs <= bound; }
  double ratio() const;  // max_abs / bound; infinity when non-finite
  std::string describe() const;
};

// Runs the reference on the plan's box and compares out and lse (and dq, dk, dv, dbias after a
// backward) with the tolerance of the call's backend and dtype.
std::vector<Comparison> check_against_reference(const CallSpec& spec, const CallTensors& t,
                                                const CallOutputs& outputs, const CheckPlan& plan);

}  // namespace memeff::soak
