// Fuzz target: config/router.h Router::match and check_route_template.
//
// Input: the first byte picks the mode, the rest is text.
//   even: the rest is a request target, matched against a fixed set of valid routes (with captures).
//   odd:  the rest is "prefix\nresource\ntarget": check_route_template on the pair; if accepted, a
//         Router of that route (plus a "/" fallback) matches the target.
// Properties: never crashes; a matched resource is non-empty and only [A-Za-z0-9._~:-]; a matched
// target is origin-form, printable ASCII, and its path has no "/../", "/./", "//", trailing "/." or
// "/..", backslash, ';', or %2F/%5C/%2E/%25/%3B (the query is not inspected, as documented); the outcome and
// resource agree with an independent reference matcher; and a target whose path differs only by
// percent-encoded unreserved characters ("%61" for "a"), which an upstream may decode, gets the same
// routing decision (else a request could be fenced under another resource than the one it writes).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "config/router.h"
#include "tests/fuzz/fuzz_check.h"

using fencegate::config::check_route_template;
using fencegate::config::Route;
using fencegate::config::Router;
using fencegate::fuzz::show;
using Outcome = Router::Outcome;

namespace {

Route make_route(std::string prefix, std::string resource) {
  Route r;
  r.prefix = std::move(prefix);
  r.resource = std::move(resource);
  r.upstream = "http://127.0.0.1:9000";
  r.upstream_addr = {"127.0.0.1", 9000};
  return r;
}

const std::vector<Route>& fixed_routes() {
  static const std::vector<Route> routes = [] {
    std::vector<Route> v{
        make_route("/", "default"),
        make_route("/tenants/{tenant}/", "tenant-{tenant}"),
        make_route("/tenants/{tenant}/orders/{order}", "order:{tenant}:{order}"),
        make_route("/tenants/admin/", "admin"),
        make_route("/api/v1/", "api.v1"),
        make_route("/users/{user}", "user_{user}"),
        make_route("/a/{x}/b/{y}/", "{y}:~{x}"),  // captures side by side need a ':' between them
        make_route("/static", "static"),
    };
    for (const Route& r : v) {
      std::string err = check_route_template(r);
      FUZZ_CHECK(err.empty(), "fixed route " + r.prefix + " refused: " + err);
    }
    return v;
  }();
  return routes;
}

bool unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}
bool capture_char(unsigned char c) { return unreserved(c); }
bool resource_char(unsigned char c) { return unreserved(c) || c == ':'; }

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// Reference: is `target` an unambiguous origin-form target (docs/contract.md)?
bool reference_target_ok(std::string_view target) {
  if (target.empty() || target[0] != '/') return false;
  for (unsigned char c : target)
    if (c <= 0x20 || c >= 0x7f || c == '#') return false;
  const std::string_view path = target.substr(0, target.find('?'));
  if (path.find('\\') != std::string_view::npos) return false;
  // Path parameters: servlet containers strip ";..." from each segment before they route.
  if (path.find(';') != std::string_view::npos) return false;
  // Segments after the leading '/': none may be "." or "..", only the last may be empty.
  std::vector<std::string_view> segs;
  for (std::size_t b = 1;;) {
    const std::size_t e = path.find('/', b);
    segs.push_back(path.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    if (e == std::string_view::npos) break;
    b = e + 1;
  }
  for (std::size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].empty() && i + 1 != segs.size()) return false;
    if (segs[i] == "." || segs[i] == "..") return false;
  }
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') continue;
    if (i + 2 >= path.size() || hex(path[i + 1]) < 0 || hex(path[i + 2]) < 0) return false;
    const int b = hex(path[i + 1]) * 16 + hex(path[i + 2]);
    // Encoded unreserved characters are refused too: an upstream may decode them (RFC 3986 6.2.2.2).
    if (unreserved(static_cast<unsigned char>(b)) || b == '/' || b == '\\' || b == '%' || b == ';' || b < 0x20 ||
        b == 0x7f)
      return false;
    i += 2;
  }
  return true;
}

struct RefMatch {
  Outcome outcome = Outcome::no_route;
  std::size_t route = 0;
  std::string resource;
};

// Reference matcher: longest matched prefix (a final '/' of a prefix may meet the path's end);
// equal length -> an exact match before such a one, then fewer captures; then configuration order. A capture segment with a character outside [A-Za-z0-9._~-] refuses the whole target.
// One pass over the routes; `fold`: literal text compared ignoring ASCII case, and a full tie
// goes to route `prefer`.
RefMatch reference_pass(const std::vector<Route>& routes, std::string_view target, bool fold, std::size_t prefer) {
  auto lo = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  RefMatch out;
  if (!reference_target_ok(target)) {
    out.outcome = Outcome::bad_target;
    return out;
  }
  const std::string_view path = target.substr(0, target.find('?'));
  bool found = false, best_loose = false;
  std::size_t best_len = 0, best_caps = 0;
  for (std::size_t r = 0; r < routes.size(); ++r) {
    const std::string& pre = routes[r].prefix;
    std::vector<std::pair<std::string, std::string>> caps;
    std::size_t pos = 0;
    bool ok = true;
    bool loose = false;  // the prefix's final '/' met the end of the path
    for (std::size_t i = 0; i < pre.size() && ok; ++i) {
      if (pre[i] != '{') {
        if (i + 1 == pre.size() && pre[i] == '/' && pos == path.size()) {
          loose = true;
          continue;
        }
        ok = pos < path.size() && (fold ? lo(path[pos]) == lo(pre[i]) : path[pos] == pre[i]);
        ++pos;
        continue;
      }
      const std::size_t close = pre.find('}', i);
      std::size_t end = pos;
      while (end < path.size() && path[end] != '/') ++end;
      const std::string_view seg = path.substr(pos, end - pos);
      if (seg.empty()) {
        ok = false;
        break;
      }
      for (unsigned char c : seg) {
        if (!capture_char(c)) {
          out.outcome = Outcome::bad_target;
          return out;
        }
      }
      caps.emplace_back(pre.substr(i + 1, close - i - 1), std::string(seg));
      pos = end;
      i = close;
    }
    if (!ok) continue;
    if (!found || pos > best_len ||
        (pos == best_len && ((best_loose && !loose) || (best_loose == loose && caps.size() < best_caps) ||
                             (best_loose == loose && caps.size() == best_caps && r == prefer)))) {
      found = true;
      best_len = pos;
      best_loose = loose;
      best_caps = caps.size();
      out.route = r;
      out.resource.clear();
      const std::string& tpl = routes[r].resource;
      for (std::size_t i = 0; i < tpl.size(); ++i) {
        if (tpl[i] != '{') {
          out.resource += tpl[i];
          continue;
        }
        const std::size_t close = tpl.find('}', i);
        const std::string name = tpl.substr(i + 1, close - i - 1);
        for (const auto& [n, v] : caps)
          if (n == name) out.resource += v;
        i = close;
      }
    }
  }
  if (found) out.outcome = Outcome::matched;
  if (found && out.resource.size() > 256) {  // longer than the admin API accepts: refused
    out.outcome = Outcome::bad_target;
    out.resource.clear();
  }
  return out;
}

// The route as sent; refused when ignoring letter case would pick another route (an upstream
// that routes without regard to case would apply the request there).
RefMatch reference_match(const std::vector<Route>& routes, std::string_view target) {
  RefMatch exact = reference_pass(routes, target, false, routes.size());
  if (exact.outcome != Outcome::matched) return exact;
  RefMatch folded = reference_pass(routes, target, true, exact.route);
  if (folded.outcome == Outcome::bad_target || folded.route != exact.route) {
    folded.outcome = Outcome::bad_target;
    folded.resource.clear();
    return folded;
  }
  return exact;
}

const char* name(Outcome o) {
  switch (o) {
    case Outcome::matched: return "matched";
    case Outcome::no_route: return "no_route";
    case Outcome::bad_target: return "bad_target";
  }
  return "?";
}

std::string describe(const std::vector<Route>& routes, const Router::Match& m) {
  std::string s = name(m.outcome);
  if (m.outcome == Outcome::matched)
    s += " route \"" + m.route->prefix + "\" (#" + std::to_string(m.route - routes.data()) + ") resource " + show(m.resource);
  if (m.outcome == Outcome::bad_target) s += " (" + m.reason + ")";
  return s;
}

// Decodes %XX escapes of unreserved characters other than '.' (which the router refuses
// encoded) in the path; returns nullopt if there are none.
std::optional<std::string> decode_unreserved(std::string_view target) {
  const std::size_t q = std::min(target.find('?'), target.size());
  std::string out;
  bool changed = false;
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (i < q && target[i] == '%' && i + 2 < q && hex(target[i + 1]) >= 0 && hex(target[i + 2]) >= 0) {
      const int b = hex(target[i + 1]) * 16 + hex(target[i + 2]);
      if (unreserved(static_cast<unsigned char>(b)) && b != '.') {
        out += static_cast<char>(b);
        changed = true;
        i += 2;
        continue;
      }
    }
    out += target[i];
  }
  if (!changed) return std::nullopt;
  return out;
}

void check_match(const std::vector<Route>& routes, const Router& router, std::string_view target) {
  const Router::Match m = router.match(target);
  const std::string in = (routes.size() == 2 ? "routes " + show(routes[0].prefix) + " -> " + show(routes[0].resource) +
                                                  ", \"/\" -> \"fallback\""
                                            : std::string("the fixed routes")) +
                         "; target " + show(target) + " -> " + describe(routes, m);
  FUZZ_CHECK((m.route != nullptr) == (m.outcome == Outcome::matched), in);
  FUZZ_CHECK((m.outcome == Outcome::bad_target) == !m.reason.empty(), in);
  if (m.outcome == Outcome::matched) {
    FUZZ_CHECK(m.route >= routes.data() && m.route < routes.data() + routes.size(), in);
    FUZZ_CHECK(!m.resource.empty(), "empty resource; " + in);
    for (unsigned char c : m.resource) FUZZ_CHECK(resource_char(c), "resource outside [A-Za-z0-9._~:-]; " + in);
    FUZZ_CHECK(!target.empty() && target[0] == '/', in);
    for (unsigned char c : target) FUZZ_CHECK(c > 0x20 && c < 0x7f && c != '#', in);
    const std::string_view path = target.substr(0, target.find('?'));
    const std::string lp = lower(path);
    for (const char* bad : {"/../", "/./", "//", "%2f", "%5c", "%2e", "%25", "\\"})
      FUZZ_CHECK(lp.find(bad) == std::string::npos, std::string("path contains ") + bad + "; " + in);
    const std::string_view tail2 = path.substr(path.size() >= 2 ? path.size() - 2 : 0);
    const std::string_view tail3 = path.substr(path.size() >= 3 ? path.size() - 3 : 0);
    FUZZ_CHECK(tail2 != "/." && tail3 != "/..", "path ends in a dot segment; " + in);
  }

  const RefMatch ref = reference_match(routes, target);
  FUZZ_CHECK(ref.outcome == m.outcome, std::string("reference says ") + name(ref.outcome) + "; " + in);
  if (ref.outcome == Outcome::matched) {
    FUZZ_CHECK(ref.route == static_cast<std::size_t>(m.route - routes.data()) && ref.resource == m.resource,
               "reference says route #" + std::to_string(ref.route) + " resource " + show(ref.resource) + "; " + in);
  }

  // An upstream may decode %61 to "a": the decoded path must be routed the same way.
  if (m.outcome != Outcome::bad_target) {
    if (auto decoded = decode_unreserved(target)) {
      const Router::Match d = router.match(*decoded);
      const bool same_routing = d.outcome == m.outcome &&
                        (m.outcome != Outcome::matched || (d.route == m.route && d.resource == m.resource));
      FUZZ_CHECK(same_routing, "percent-decoded equivalent " + show(*decoded) + " -> " + describe(routes, d) +
                           ", but with " + in);
    }
  }
}

std::string_view next_line(std::string_view& rest) {
  const std::size_t nl = rest.find('\n');
  std::string_view line = rest.substr(0, nl);
  rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  return line;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  if (mode % 2 == 0) {
    static const Router router(fixed_routes());
    if (!rest.empty() && rest.back() == '\n') rest.remove_suffix(1);  // text seeds end in a newline
    check_match(fixed_routes(), router, rest);
    return 0;
  }

  const std::string_view prefix = next_line(rest);
  const std::string_view resource = next_line(rest);
  const std::string_view target = next_line(rest);
  std::vector<Route> routes{make_route(std::string(prefix), std::string(resource)), make_route("/", "fallback")};
  const std::string err = check_route_template(routes[0]);
  if (!err.empty()) return 0;  // refused, with a reason: fine

  // Accepted: the templates must be well-formed enough for the Router's assumptions.
  FUZZ_CHECK(!prefix.empty() && prefix[0] == '/', "accepted prefix " + show(prefix));
  FUZZ_CHECK(!resource.empty() && resource.size() <= 200, "accepted resource " + show(resource));
  for (unsigned char c : resource)
    FUZZ_CHECK(resource_char(c) || c == '{' || c == '}', "accepted resource " + show(resource));
  for (unsigned char c : prefix)
    FUZZ_CHECK(unreserved(c) || c == '/' || c == '{' || c == '}', "accepted prefix " + show(prefix));
  const Router router(routes);
  check_match(routes, router, target);
  // The prefix itself, with captures filled in, must route to this route.
  std::string sample;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (prefix[i] == '{') {
      sample += "v";
      i = prefix.find('}', i);
    } else {
      sample += prefix[i];
    }
  }
  const Router::Match self = router.match(sample);
  FUZZ_CHECK(self.outcome == Outcome::matched && self.route == &routes[0],
             "accepted prefix " + show(prefix) + " does not route its own sample " + show(sample) + " -> " +
                 describe(routes, self));
  check_match(routes, router, sample);
  return 0;
}
