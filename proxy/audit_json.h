// One audit row as JSON: the same object for `fencegate audit --json` (one per line) and the
// admin API's GET /v1/audit, so the two cannot drift apart.
//
// Keys, in this order: id, time (RFC 3339, UTC, ms), resource, decision, presented_generation
// (null when no valid token was presented), current_generation, method, target, client, leader,
// mode, user_agent. Strings: valid UTF-8 passes through, control characters are \u-escaped,
// invalid bytes become U+FFFD (the audit log stores request bytes as they came).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fence_store/store.h"

namespace fencegate::proxy {

// Appends the row's JSON object (no newline) to *out.
void append_audit_row_json(std::string* out, const store::AuditRecord& rec);

// The row's JSON object as a string.
std::string audit_row_json(const store::AuditRecord& rec);

// Decodes one UTF-8 sequence at s[*i] and advances. Returns the code point, or -1 for an invalid
// byte (consumed alone). REQUIRES: *i < s.size().
// (For terminal output: JSON output goes through common/json.h, which replaces invalid bytes.)
std::int32_t next_code_point(std::string_view s, std::size_t* i);

// Returns true iff `cp` is a control character: C0, DEL or C1.
bool is_control(std::int32_t cp);

}  // namespace fencegate::proxy
