// Reading the audit log a page at a time, newest first: what `fencegate audit` needs from the
// store beyond one query (the store's pages are at most 1000 rows).
//
// Thread-safety: as the Store's queries (each call is independent).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fence_store/store.h"

namespace fencegate::proxy {

constexpr int kAuditPage = 1000;  // the store's largest page

// Appends to *out the rows matching `filter` with id < before_id (0 = newest), newest first, up
// to `limit` in all, paging the store. Returns false with *err set if a query fails.
bool fetch_newest_audit(store::Store& s, const store::AuditQuery& filter, std::int64_t before_id, int limit,
                        std::vector<store::AuditRecord>* out, std::string* err);

// The newest id in the audit table (any row), 0 if it is empty. Returns false with *err set if
// the query fails.
bool newest_audit_id(store::Store& s, std::int64_t* id, std::string* err);

}  // namespace fencegate::proxy
