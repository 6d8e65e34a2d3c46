// W3C traceparent validation for audit rows and log lines (see traceparent.h).
#include "proxy/traceparent.h"

namespace fencegate::proxy {

namespace {

bool lower_hex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool all_zeros(std::string_view s) { return s.find_first_not_of('0') == std::string_view::npos; }

}  // namespace

std::string valid_traceparent(std::string_view v) {
  constexpr std::size_t kLen = 55;  // 2 + 1 + 32 + 1 + 16 + 1 + 2
  if (v.size() < kLen || v[2] != '-' || v[35] != '-' || v[52] != '-') return {};
  const std::string_view version = v.substr(0, 2), trace = v.substr(3, 32), parent = v.substr(36, 16),
                         flags = v.substr(53, 2);
  if (!lower_hex(version) || !lower_hex(trace) || !lower_hex(parent) || !lower_hex(flags)) return {};
  if (version == "ff" || all_zeros(trace) || all_zeros(parent)) return {};
  if (version == "00" && v.size() != kLen) return {};
  if (v.size() > kLen && v[kLen] != '-') return {};
  return std::string(v.substr(0, kLen));
}

std::string traceparent_of(const RequestHead& h) {
  std::string_view v;
  if (h.count("traceparent", &v) != 1) return {};
  return valid_traceparent(v);
}

}  // namespace fencegate::proxy
