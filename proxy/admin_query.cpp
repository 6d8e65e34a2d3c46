// The admin API's query strings (see admin_query.h).
#include "proxy/admin_query.h"

#include <charconv>

#include "proxy/timefmt.h"

namespace fencegate::proxy {

std::string pct_decode(std::string_view s, bool* ok) {
  std::string o;
  *ok = true;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      o += ' ';
    } else if (s[i] == '%') {
      auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      if (i + 2 >= s.size() + 0 && i + 2 > s.size() - 1) {
        *ok = false;
        return {};
      }
      int a = hex(s[i + 1]), b = hex(s[i + 2]);
      if (a < 0 || b < 0) {
        *ok = false;
        return {};
      }
      o += static_cast<char>(a * 16 + b);
      i += 2;
    } else {
      o += s[i];
    }
  }
  return o;
}

std::map<std::string, std::string> parse_query(std::string_view q, std::string* error) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    auto amp = q.find('&');
    std::string_view kv = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    bool ok1, ok2;
    std::string k = pct_decode(kv.substr(0, eq), &ok1);
    std::string v = eq == std::string_view::npos ? std::string() : pct_decode(kv.substr(eq + 1), &ok2);
    if (!ok1 || (eq != std::string_view::npos && !ok2)) {
      *error = "bad percent-encoding in the query string";
      return {};
    }
    // ?resource=a&resource=b must not quietly mean b (nor a): say so.
    if (!out.emplace(k, v).second) {
      *error = k + ": given more than once";
      return {};
    }
  }
  return out;
}

bool parse_int_param(const std::map<std::string, std::string>& q, const char* key, std::int64_t lo, std::int64_t hi,
                     std::int64_t* out, std::string* err) {
  auto it = q.find(key);
  if (it == q.end() || it->second.empty()) return true;
  // Digits only, as the CLI flags take them: no sign, no whitespace (stoll would skip both).
  const std::string& t = it->second;
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.front() < '0' || t.front() > '9' || ec != std::errc() || end != t.data() + t.size() || v < lo || v > hi) {
    *err = std::string(key) + ": must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
    return false;
  }
  *out = v;
  return true;
}

bool parse_time_param(const std::map<std::string, std::string>& q, const char* key, std::int64_t* out,
                      std::string* err) {
  auto it = q.find(key);
  if (it == q.end() || it->second.empty()) return true;
  if (!parse_time_arg(it->second, now_unix_ms(), out)) {
    *err = std::string(key) + ": expected RFC 3339 (2026-11-29T10:00:00Z), relative (-1h) or unix milliseconds";
    // In a query string '+' means a space: an offset like +02:00 must be written %2B02:00.
    if (it->second.find(' ') != std::string::npos) *err += " (a '+' in a query string is a space: write %2B)";
    return false;
  }
  return true;
}

std::string param(const std::map<std::string, std::string>& q, const char* key) {
  auto it = q.find(key);
  return it == q.end() ? std::string() : it->second;
}

}  // namespace fencegate::proxy
