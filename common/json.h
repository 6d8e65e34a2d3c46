// JSON string writing: the one escaper every log line, problem body and CLI output shares.
//
// Valid UTF-8 passes through unchanged; only what RFC 8259 requires is escaped: '"', '\\' and
// the control characters below U+0020 (as \n \r \t \b \f, else \u00XX). U+2028/U+2029 and DEL
// stay raw. Invalid UTF-8 (a stray continuation byte, a bad lead byte, an overlong form, a
// surrogate D800-DFFF, a code point above U+10FFFF, a truncated sequence) becomes U+FFFD, one per
// maximal subpart of an ill-formed sequence (Unicode 15, section 3.9, "U+FFFD Substitution of
// Maximal Subparts", which WHATWG's decoder follows), so the output is always valid JSON.
//
// Thread-safety: pure functions. Plain ASCII without anything to escape is copied in one append.
#pragma once

#include <string>
#include <string_view>

namespace fencegate::json {

// Appends `s` as a JSON string, with its quotes, to `out`.
void append_string(std::string& out, std::string_view s);

// `s` as a JSON string, with its quotes.
std::string quote(std::string_view s);

}  // namespace fencegate::json
