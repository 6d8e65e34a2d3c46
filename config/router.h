// Router: maps a request target to its route and resource name.
//
// Routes match by longest path prefix. A prefix may contain captures, `{name}`, each matching exactly
// one non-empty path segment; the route's resource template may use them (`tenant-{tenant}`).
// A prefix ending in '/' also matches the path without that '/' ("/tenants/{t}/" takes
// "/tenants/acme"), so a collection's own path is fenced with its members, not by a shorter route.
// The resource therefore comes from the route and the path, never from a client header.
//
// Ambiguous targets are refused (not routed), because the upstream might normalise them to a path
// that belongs to another resource: anything but origin-form, dot segments ("." / ".."), empty
// segments ("//"), backslashes, path parameters (';', which servlet containers strip from each
// segment before routing), percent-encoded '/', '\\', ';', '.' or '%', sequences that are not valid,
// control characters or bytes >= 0x80. Captured segments may only contain [A-Za-z0-9._~-] (and
// may not be "." or ".."), so a resource name is always printable and bounded. A path that would
// match another route if letter case were ignored is refused too (upstreams that route without
// regard to case would apply it to that route's resource).
//
// Thread-safety: immutable after construction; match() may be called from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace fencegate::config {

class Router {
 public:
  // REQUIRES: routes were validated (validate() / check_route_template() accepted them).
  explicit Router(const std::vector<Route>& routes);

  enum class Outcome { matched, no_route, bad_target };
  struct Match {
    Outcome outcome = Outcome::no_route;
    const Route* route = nullptr;  // set iff matched; points into the vector given to the ctor
    std::string resource;          // set iff matched
    std::string reason;            // set iff bad_target: why (for a 400 detail)
  };

  // `target` is the request-target exactly as received (path and optional "?query").
  Match match(std::string_view target) const;

  // The route that fences `resource` on the data path (the reverse of match(), for the admin API,
  // which is given resources, not targets): a route that names it literally owns it (it may sit
  // beside a template route in another mode: one tenant goes first); else a fencing route whose
  // template can make it (validation makes all of those agree on mode and authority). nullptr if
  // no fencing route makes it; then *off says whether an `off` route can. One pass.
  const Route* owner_of(std::string_view resource, bool* off) const;

 private:
  struct Compiled;
  std::vector<Compiled> compiled_;  // sorted: most specific first
  bool has_upper_literal_ = false;  // some route's literal text has an upper-case letter
  const std::vector<Route>* routes_;

 public:
  ~Router();
  Router(Router&&) noexcept;
  Router& operator=(Router&&) noexcept;
};

// The longest resource name a request may be fenced under: the admin API (fence, lookup) takes
// names up to this length, so a path that would make a longer one is refused as a bad target
// (no leader could put up its fence before it starts work on such a resource).
inline constexpr std::size_t kMaxResourceName = 256;

// Returns true iff `resource` could have been produced by the route resource template `tmpl`
// ("tenant-{tenant}": captures match one or more of [A-Za-z0-9._~-]).
bool resource_matches_template(std::string_view tmpl, std::string_view resource);

// Checks one route's prefix/resource templates; returns an empty string if fine, else the reason
// (e.g. "resource uses {tenant} which the prefix does not capture"). Used by validate().
std::string check_route_template(const Route& r);

// Whether two resource templates (literals and {captures}, as check_route_template() accepts)
// can name the same resource: "tenant-{t}" and "tenant-acme" can, "a-{t}" and "b-{t}" cannot.
bool resource_templates_overlap(std::string_view a, std::string_view b);

// Whether `lit` (a route without captures) takes every path through which `tmpl` could name
// lit's resource: tmpl's prefix with the capture values that make lit's resource is lit's prefix
// exactly, and tmpl's resource uses all its captures. Then routing never lets tmpl produce that
// name ("/tenants/{t}/" -> "tenant-{t}" next to "/tenants/acme/" -> "tenant-acme").
bool literal_route_takes_resource(const Route& tmpl, const Route& lit);

}  // namespace fencegate::config
