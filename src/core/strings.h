// Text helpers the dispatcher and the backends share for their messages (dispatch_report.cpp).
#pragma once

#include <string>
#include <vector>

namespace memeff::detail {

// The items separated by `sep`: join({"a", "b"}) is "a, b".
std::string join(const std::vector<std::string>& items, const char* sep = ", ");

}  // namespace memeff::detail
