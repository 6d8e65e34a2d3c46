// The status page served at GET /ui on the admin listener: one self-contained HTML document (inline
// CSS and JavaScript, no external assets, so it works on an air-gapped host). It reads the admin API
// with same-origin GETs; its one state-changing action (a manual fence) sends the bearer token and
// the Fencegate-UI header. docs/operations.md lists its requests and why each is safe. No I/O.
#pragma once

#include <string_view>

namespace fencegate::proxy {

// The page's bytes (static; the data comes from the API, never baked into the page).
std::string_view admin_ui_page();

// The headers the page is served with: a Content-Security-Policy that allows only its own inline
// code and same-origin requests, no framing, no referrer, no MIME sniffing.
std::string_view admin_ui_headers();

// The header a state-changing request from the page must carry (a cross-site form cannot send a
// custom header, and a cross-site fetch with one needs a CORS preflight the admin API never allows).
inline constexpr std::string_view kUiHeader = "Fencegate-UI";

}  // namespace fencegate::proxy
