#include "core/method_info.h"

#include <fmt/format.h>

#include <cmath>

#include "core/status.h"

namespace lc {

void add_method_key(std::vector<MethodKey>& keys, MethodKey k) {
  for (const auto& e : keys)
    if (e.name == k.name) return;
  keys.push_back(std::move(k));
}

std::string method_number(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  return fmt::format("{:g}", x);
}

std::string method_integer(int64_t x) { return std::to_string(static_cast<long long>(x)); }

}  // namespace lc
