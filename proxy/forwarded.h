// RFC 7239 syntax of a client's Forwarded field value: the relay passes on only values that
// parse, so a malformed one (an unterminated quote) cannot swallow the element fencegate appends.
// Pure function on bytes; no allocation. Thread-safe.
#pragma once

#include <string_view>

namespace fencegate::proxy {

// True iff `value` is a Forwarded field value (RFC 7239 section 4): forwarded-elements separated
// by "," (with optional whitespace around it), each forwarded-pairs separated by ";", each pair
// token "=" (token / quoted-string). Empty list elements are allowed, as RFC 9110 5.6.1 asks of
// a recipient; a value that is empty or only whitespace is not.
bool valid_forwarded(std::string_view value);

}  // namespace fencegate::proxy
