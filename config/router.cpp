#include "config/router.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "common/hex.h"

namespace fencegate::config {

namespace {

constexpr std::size_t kMaxResourceTemplate = 200;

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool is_capture_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '~' || c == '-';
}

bool is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

bool is_valid_name(std::string_view s) {
  if (s.empty() || !is_name_start(s[0])) return false;
  return std::all_of(s.begin() + 1, s.end(), is_name_char);
}

int hex_value(char c) { return common::hex_value(static_cast<unsigned char>(c)); }

// Returns an empty string if `target` is an unambiguous origin-form target, else why not.
std::string check_target(std::string_view target) {
  if (target.empty() || target[0] != '/') {
    return "request target must be origin-form (start with \"/\")";
  }
  for (char ch : target) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x21 || c >= 0x7f) return "control character, space or non-ASCII byte in target";
    if (c == '#') return "fragment ('#') in target";
  }
  std::string_view path = target.substr(0, target.find('?'));
  if (path.find('\\') != std::string_view::npos) return "backslash in path";
  // Servlet containers and frameworks (Tomcat, Jetty, Spring) strip ";params" from each segment
  // before they route, so "/t/a/..;/b" reaches them as "/t/b" and "/admin;x/y" as "/admin/y":
  // paths we would have fenced under another route or resource.
  if (path.find(';') != std::string_view::npos) return "path parameter (';') in path";

  // Segments: path is "/" seg ("/" seg)*; the first segment starts after the leading '/'.
  std::size_t pos = 1;
  while (pos <= path.size()) {
    std::size_t end = path.find('/', pos);
    if (end == std::string_view::npos) end = path.size();
    std::string_view seg = path.substr(pos, end - pos);
    bool last = end == path.size();
    if (seg.empty() && !last) return "empty path segment (\"//\")";
    if (seg == "." || seg == "..") return "dot segment (\".\" or \"..\") in path";
    pos = end + 1;
  }

  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') continue;
    int hi = i + 2 < path.size() ? hex_value(path[i + 1]) : -1;
    int lo = i + 2 < path.size() ? hex_value(path[i + 2]) : -1;
    if (hi < 0 || lo < 0) return "invalid percent-encoding in path";
    int b = hi * 16 + lo;
    // An upstream may decode any of these (RFC 3986 normalises encoded unreserved characters),
    // turning a path we fenced under one route into another route's path: refuse them.
    const bool unreserved = (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || (b >= '0' && b <= '9') || b == '-' ||
                            b == '.' || b == '_' || b == '~';
    if (unreserved || b == '/' || b == '\\' || b == '%' || b == ';' || b < 0x20 || b == 0x7f) {
      return "percent-encoded unreserved character, '/', '\\', '%', ';' or control byte in path (" +
             std::string(path.substr(i, 3)) + ")";
    }
    i += 2;
  }
  return {};
}

struct Part {
  bool capture = false;
  std::string text;  // literal text, or the capture name
};

// Splits a prefix template into literal and capture parts. Returns an empty string if fine.
std::string parse_prefix(std::string_view prefix, std::vector<Part>& parts) {
  std::set<std::string, std::less<>> names;
  std::string literal;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    char c = prefix[i];
    if (c == '}') return "prefix: unbalanced '}'";
    if (c != '{') {
      literal += c;
      continue;
    }
    std::size_t close = prefix.find('}', i);
    if (close == std::string_view::npos) return "prefix: unbalanced '{'";
    std::string_view name = prefix.substr(i + 1, close - i - 1);
    if (name.find('{') != std::string_view::npos) return "prefix: unbalanced '{'";
    if (!is_valid_name(name)) {
      return "prefix: bad capture name \"" + std::string(name) + "\" (want [A-Za-z_][A-Za-z0-9_]*)";
    }
    if (i == 0 || prefix[i - 1] != '/' || (close + 1 < prefix.size() && prefix[close + 1] != '/')) {
      return "prefix: capture {" + std::string(name) + "} must be a whole path segment";
    }
    if (!names.emplace(name).second) return "prefix: duplicate capture {" + std::string(name) + "}";
    if (!literal.empty()) parts.push_back({false, std::move(literal)});
    literal.clear();
    parts.push_back({true, std::string(name)});
    i = close;
  }
  if (!literal.empty()) parts.push_back({false, std::move(literal)});
  return {};
}

struct Capture {
  std::string_view name;
  std::string_view value;
};

}  // namespace

bool literal_route_takes_resource(const Route& tmpl, const Route& lit) {
  // lit: no captures at all. tmpl: captures in its prefix, every one of them used in its
  // resource (else other paths give the same name), so a resource name tells the capture values.
  if (lit.prefix.find('{') != std::string::npos || lit.resource.find('{') != std::string::npos) return false;
  std::vector<Part> parts;
  if (!parse_prefix(tmpl.prefix, parts).empty()) return false;
  // Match lit's prefix against tmpl's: literals equal, each capture one segment.
  std::map<std::string, std::string> values;
  std::string_view rest = lit.prefix;
  for (const Part& p : parts) {
    if (!p.capture) {
      if (rest.substr(0, p.text.size()) != p.text) return false;
      rest.remove_prefix(p.text.size());
      continue;
    }
    const std::size_t end = std::min(rest.find('/'), rest.size());
    if (end == 0) return false;
    values[p.text] = std::string(rest.substr(0, end));
    rest.remove_prefix(end);
  }
  if (!rest.empty() || values.empty()) return false;
  std::string name;
  std::set<std::string> used;
  for (std::size_t i = 0; i < tmpl.resource.size(); ++i) {
    if (tmpl.resource[i] != '{') {
      name += tmpl.resource[i];
      continue;
    }
    const std::size_t close = tmpl.resource.find('}', i);
    if (close == std::string::npos) return false;
    const std::string cap = tmpl.resource.substr(i + 1, close - i - 1);
    auto it = values.find(cap);
    if (it == values.end()) return false;
    name += it->second;
    used.insert(cap);
    i = close;
  }
  return used.size() == values.size() && name == lit.resource;
}

bool resource_templates_overlap(std::string_view a, std::string_view b) {
  // Each template is a sequence of items: a literal character, or a capture (one or more
  // capture characters). Search the pairs of positions both can reach on a common string,
  // with a flag per side for "inside a capture that has taken at least one character".
  struct Item {
    bool capture;
    char c;
  };
  auto items = [](std::string_view t) {
    std::vector<Item> v;
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t[i] == '{') {
        std::size_t close = t.find('}', i);
        if (close == std::string_view::npos) close = t.size() - 1;
        v.push_back({true, 0});
        i = close;
      } else {
        v.push_back({false, t[i]});
      }
    }
    return v;
  };
  const std::vector<Item> x = items(a), y = items(b);
  const std::size_t nx = x.size() + 1, ny = y.size() + 1;
  std::vector<char> visited(nx * ny * 4, 0);
  std::vector<std::size_t> work;
  auto key = [&](std::size_t i, bool fi, std::size_t j, bool fj) { return ((i * ny + j) * 2 + fi) * 2 + fj; };
  auto push = [&](std::size_t i, bool fi, std::size_t j, bool fj) {
    const std::size_t k = key(i, fi, j, fj);
    if (!visited[k]) {
      visited[k] = 1;
      work.push_back(k);
    }
  };
  push(0, false, 0, false);
  while (!work.empty()) {
    const std::size_t k = work.back();
    work.pop_back();
    const bool fj = k & 1, fi = (k >> 1) & 1;
    const std::size_t j = (k >> 2) % ny, i = (k >> 2) / ny;
    // A capture that has taken a character may end here.
    if (fi) push(i + 1, false, j, fj);
    if (fj) push(i, fi, j + 1, false);
    if (!fi && !fj && i == x.size() && j == y.size()) return true;
    if (i == x.size() || j == y.size()) continue;
    // Both take one more character.
    const Item &p = x[i], &q = y[j];
    const bool ok = p.capture ? (q.capture || is_capture_char(q.c)) : (q.capture ? is_capture_char(p.c) : p.c == q.c);
    if (!ok) continue;
    push(p.capture ? i : i + 1, p.capture, q.capture ? j : j + 1, q.capture);
  }
  return false;
}

std::string check_route_template(const Route& r) {
  if (r.prefix.empty() || r.prefix[0] != '/') return "prefix: must start with \"/\"";
  std::vector<Part> parts;
  if (auto err = parse_prefix(r.prefix, parts); !err.empty()) return err;

  // The literal text must itself be an unambiguous path, or no request could ever match it.
  std::string sample;
  for (const Part& p : parts) sample += p.capture ? "x" : p.text;
  if (sample.find('?') != std::string::npos) return "prefix: must not contain '?'";
  if (auto err = check_target(sample); !err.empty()) return "prefix: " + err;

  // Literal text is limited to unreserved characters and '/': then a percent-encoded byte in a
  // request (which routing refuses for unreserved characters) can never decode into a prefix
  // the encoded form did not match, whatever the upstream decodes.
  for (const Part& p : parts) {
    if (p.capture) continue;
    for (char c : p.text) {
      if (!is_capture_char(c) && c != '/') {
        return "prefix: character '" + std::string(1, c) + "' not allowed (use [A-Za-z0-9._~-], '/' and {captures})";
      }
    }
  }

  const std::string& res = r.resource;
  if (res.empty()) return "resource: must not be empty";
  if (res.size() > kMaxResourceTemplate) {
    return "resource: longer than " + std::to_string(kMaxResourceTemplate) + " characters";
  }
  std::string last_capture;
  std::size_t last_capture_end = std::string::npos;
  for (std::size_t i = 0; i < res.size(); ++i) {
    char c = res[i];
    if (c == '}') return "resource: unbalanced '}'";
    if (c != '{') {
      if (!is_capture_char(c) && c != ':') {
        return "resource: character '" + std::string(1, c) + "' not allowed (use [A-Za-z0-9._~:-] and {captures})";
      }
      continue;
    }
    std::size_t close = res.find('}', i);
    if (close == std::string::npos) return "resource: unbalanced '{'";
    std::string_view name = std::string_view(res).substr(i + 1, close - i - 1);
    if (name.find('{') != std::string_view::npos) return "resource: unbalanced '{'";
    if (!is_valid_name(name)) return "resource: bad capture name \"" + std::string(name) + "\"";
    bool defined = std::any_of(parts.begin(), parts.end(), [&](const Part& p) { return p.capture && p.text == name; });
    if (!defined) {
      return "resource: uses {" + std::string(name) + "}, which the prefix does not capture";
    }
    // Two captures need a ':' between them (the one literal a capture cannot hold): "{a}-{b}"
    // makes "x-y-z" of both x-y/z and x/y-z, two tenants on one fence.
    if (last_capture_end != std::string::npos &&
        std::string_view(res).substr(last_capture_end, i - last_capture_end).find(':') == std::string_view::npos) {
      return "resource: {" + last_capture + "} and {" + std::string(name) +
             "} need a ':' between them (a capture may hold any of [A-Za-z0-9._~-], so without one two "
             "different paths can name the same resource)";
    }
    last_capture = std::string(name);
    last_capture_end = close + 1;
    i = close;
  }
  return {};
}

struct Router::Compiled {
  std::vector<Part> parts;
  std::size_t captures = 0;
  std::size_t index = 0;  // position in the configured routes
};

Router::Router(const std::vector<Route>& routes) : routes_(&routes) {
  compiled_.reserve(routes.size());
  for (std::size_t i = 0; i < routes.size(); ++i) {
    Compiled c;
    parse_prefix(routes[i].prefix, c.parts);  // validated already
    c.captures = static_cast<std::size_t>(
        std::count_if(c.parts.begin(), c.parts.end(), [](const Part& p) { return p.capture; }));
    c.index = i;
    for (const Part& p : c.parts)
      if (!p.capture && std::any_of(p.text.begin(), p.text.end(), [](char ch) { return ch >= 'A' && ch <= 'Z'; }))
        has_upper_literal_ = true;
    compiled_.push_back(std::move(c));
  }
  // Kept in configuration order: the matched length depends on the captured values, so the
  // "most specific" route is chosen per request in match().
}

Router::~Router() = default;
Router::Router(Router&&) noexcept = default;
Router& Router::operator=(Router&&) noexcept = default;

Router::Match Router::match(std::string_view target) const {
  Match m;
  if (std::string err = check_target(target); !err.empty()) {
    m.outcome = Outcome::bad_target;
    m.reason = std::move(err);
    return m;
  }
  std::string_view path = target.substr(0, target.find('?'));

  // The most specific route for the path; with `fold`, literal text compared ignoring ASCII case.
  // Null when none matches, or when a capture segment is refused (m says why).
  // A full tie goes to `prefer` (else to the first in configuration order).
  auto select = [&](bool fold, std::vector<Capture>& best_caps, const Compiled* prefer) -> const Compiled* {
    auto same = [fold](std::string_view a, std::string_view b) {
      if (a.size() != b.size()) return false;
      if (!fold) return a == b;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
      return true;
    };
    const Compiled* best = nullptr;
    std::size_t best_len = 0;
    bool best_loose = false;
    std::vector<Capture> caps;
    for (const Compiled& c : compiled_) {
      caps.clear();
      std::size_t pos = 0;
      bool ok = true;
      bool loose = false;  // matched a prefix ending in '/' by a path that ends just before it
      for (std::size_t k = 0; k < c.parts.size(); ++k) {
        const Part& p = c.parts[k];
        if (!p.capture) {
          if (!same(path.substr(pos).substr(0, p.text.size()), p.text)) {
            // "/tenants/acme" is tenant acme's as much as "/tenants/acme/x" is: else it would be
            // fenced under a shorter route's resource (or none) while the upstream serves it as
            // acme's (nginx redirects it to the slashed form for the same reason).
            const std::string_view rest = path.substr(pos);
            if (k + 1 == c.parts.size() && p.text.back() == '/' && rest.size() + 1 == p.text.size() &&
                same(std::string_view(p.text).substr(0, rest.size()), rest)) {
              pos = path.size();
              loose = true;
              continue;
            }
            ok = false;
            break;
          }
          pos += p.text.size();
          continue;
        }
        std::size_t end = path.find('/', pos);
        if (end == std::string_view::npos) end = path.size();
        std::string_view seg = path.substr(pos, end - pos);
        if (seg.empty()) {
          ok = false;
          break;
        }
        if (!std::all_of(seg.begin(), seg.end(), is_capture_char)) {
          // Falling through to a shorter prefix would fence this request under another resource
          // while the upstream may decode the segment into this route's tenant: refuse instead.
          m.outcome = Outcome::bad_target;
          m.reason = "path segment for {" + p.text + "} in route \"" + (*routes_)[c.index].prefix +
                     "\" may only contain [A-Za-z0-9._~-]";
          return nullptr;
        }
        caps.push_back({p.text, seg});
        pos = end;
      }
      if (!ok) continue;
      // Longest match; then an exact one over one without the trailing '/'; then fewer captures.
      if (best == nullptr || pos > best_len ||
          (pos == best_len && ((best_loose && !loose) || (best_loose == loose && c.captures < best->captures) ||
                               (best_loose == loose && c.captures == best->captures && &c == prefer)))) {
        best = &c;
        best_len = pos;
        best_loose = loose;
        best_caps = caps;
      }
    }
    return best;
  };
  std::vector<Capture> best_caps;
  const Compiled* best = select(false, best_caps, nullptr);
  if (m.outcome == Outcome::bad_target) return m;
  // An upstream that routes without regard to letter case (Express's and ASP.NET Core's default)
  // would take "/Tenants/acme/x" for "/tenants/acme/x": a path that matches another route once
  // case is ignored is refused, not fenced under the route its exact case reaches.
  if (best != nullptr &&
      (has_upper_literal_ || std::any_of(path.begin(), path.end(), [](char c) { return c >= 'A' && c <= 'Z'; }))) {
    std::vector<Capture> folded_caps;
    const Compiled* folded = select(true, folded_caps, best);
    if (m.outcome == Outcome::bad_target) return m;
    if (folded != best) {
      m.outcome = Outcome::bad_target;
      m.reason = "the path matches route \"" + (*routes_)[folded->index].prefix +
                 "\" when letter case is ignored, but route \"" + (*routes_)[best->index].prefix +
                 "\" as sent: an upstream that ignores case would apply it to the other one";
      return m;
    }
  }
  if (best == nullptr) return m;  // no_route

  const Route& route = (*routes_)[best->index];
  std::string& out = m.resource;
  const std::string& tpl = route.resource;
  for (std::size_t i = 0; i < tpl.size(); ++i) {
    if (tpl[i] != '{') {
      out += tpl[i];
      continue;
    }
    std::size_t close = tpl.find('}', i);
    std::string_view name = std::string_view(tpl).substr(i + 1, close - i - 1);
    for (const Capture& cap : best_caps) {
      if (cap.name == name) out += cap.value;
    }
    i = close;
  }
  if (out.size() > kMaxResourceName) {
    m.outcome = Outcome::bad_target;
    m.reason = "the resource name this path makes (route \"" + route.prefix + "\") is longer than " +
               std::to_string(kMaxResourceName) + " characters";
    m.resource.clear();
    return m;
  }
  m.outcome = Outcome::matched;
  m.route = &route;
  return m;
}

bool resource_matches_template(std::string_view tmpl, std::string_view resource) {
  // Backtracking match of literals and {captures} (one or more capture characters each).
  auto is_cap = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '~' || c == '-';
  };
  std::function<bool(std::size_t, std::size_t)> m = [&](std::size_t ti, std::size_t ri) -> bool {
    if (ti == tmpl.size()) return ri == resource.size();
    if (tmpl[ti] == '{') {
      std::size_t close = tmpl.find('}', ti);
      if (close == std::string_view::npos) return false;
      for (std::size_t n = ri; n < resource.size() && is_cap(resource[n]); ++n)
        if (m(close + 1, n + 1)) return true;
      return false;
    }
    return ri < resource.size() && tmpl[ti] == resource[ri] && m(ti + 1, ri + 1);
  };
  return m(0, 0);
}

const Route* Router::owner_of(std::string_view resource, bool* off) const {
  const Route* by_template = nullptr;
  *off = false;
  for (const auto& r : *routes_) {
    if (r.mode != Mode::off && r.resource == resource) return &r;
    if ((by_template && *off) || !resource_matches_template(r.resource, resource)) continue;
    if (r.mode == Mode::off) *off = true;
    else if (!by_template) by_template = &r;
  }
  return by_template;
}

}  // namespace fencegate::config
