// Reading the audit log a page at a time, newest first (see audit_query.h).
#include "proxy/audit_query.h"

#include <algorithm>

namespace fencegate::proxy {

using store::AuditQuery;
using store::AuditRecord;
using store::Status;
using store::Store;

bool fetch_newest_audit(Store& s, const AuditQuery& filter, std::int64_t before_id, int limit,
                        std::vector<AuditRecord>* out, std::string* err) {
  AuditQuery q = filter;
  q.before_id = before_id;
  while (static_cast<int>(out->size()) < limit) {
    q.limit = std::min(kAuditPage, limit - static_cast<int>(out->size()));
    Status st = Status::OK();
    auto page = s.query_audit(q, &st);
    if (!st.ok()) {
      *err = st.message();
      return false;
    }
    out->insert(out->end(), page.begin(), page.end());
    if (static_cast<int>(page.size()) < q.limit) break;
    q.before_id = page.back().id;
  }
  return true;
}

bool newest_audit_id(Store& s, std::int64_t* id, std::string* err) {
  AuditQuery q;
  q.limit = 1;
  Status st = Status::OK();
  auto page = s.query_audit(q, &st);
  if (!st.ok()) {
    *err = st.message();
    return false;
  }
  *id = page.empty() ? 0 : page[0].id;
  return true;
}

}  // namespace fencegate::proxy
