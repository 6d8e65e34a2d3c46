// The W3C Trace Context `traceparent` of a request (https://www.w3.org/TR/trace-context/), kept in
// its audit row and log line so a refused write can be found from the caller's trace. No I/O.
#pragma once

#include <string>
#include <string_view>

#include "proxy/head.h"

namespace fencegate::proxy {

// `value` if it is a valid traceparent: "VV-<32 hex trace id>-<16 hex parent id>-<2 hex flags>",
// lowercase, version not ff, ids not all zeros; version 00 exactly 55 characters, a later version
// may add "-..." (only the first 55 are kept). Otherwise "".
std::string valid_traceparent(std::string_view value);

// The request's traceparent: its one `traceparent` header when valid, else "" (none, several, or
// malformed: a bad value is dropped, as the spec says, not recorded).
std::string traceparent_of(const RequestHead& h);

}  // namespace fencegate::proxy
