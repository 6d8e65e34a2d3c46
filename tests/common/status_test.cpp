// Tests for common/status.h: the one Status of the fence store and the election client.
#include "common/status.h"

#include <doctest/doctest.h>

using fencegate::Status;

TEST_CASE("status: OK and default are ok, with no message") {
  CHECK(Status().ok());
  CHECK(Status::OK().ok());
  CHECK(Status::OK().kind() == Status::Kind::ok);
  CHECK(Status::OK().message().empty());
  CHECK(Status::OK().to_string() == "ok");
}

TEST_CASE("status: a store error says what failed, and always says something") {
  Status s = Status::Error("store commit failed on /x/fence.db: disk I/O error");
  CHECK_FALSE(s.ok());
  CHECK(s.kind() == Status::Kind::error);
  CHECK(s.message() == "store commit failed on /x/fence.db: disk I/O error");
  CHECK(s.to_string() == s.message());
  CHECK_FALSE(Status::Error("").ok());
  CHECK_FALSE(Status::Error("").message().empty());
}

TEST_CASE("status: etcd and HTTP outcomes keep their codes and predicates") {
  Status nl = Status::Etcd(2, "election: no leader");
  CHECK(nl.is_etcd_error());
  CHECK(nl.is_no_leader());
  CHECK_FALSE(nl.is_lease_not_found());
  CHECK(nl.code() == 2);
  CHECK(nl.to_string() == "etcd error 2: election: no leader");
  CHECK(Status::Etcd(5, "etcdserver: requested lease not found").is_lease_not_found());
  CHECK_FALSE(Status::Unavailable("no leader").is_no_leader());  // only etcd's own answer counts
  CHECK(Status::Http(503, "busy").code() == 503);
  CHECK(Status::Http(503, "busy").to_string() == "HTTP 503: busy");
  CHECK(Status::Unavailable("127.0.0.1:2379: refused").is_unavailable());
  CHECK(Status::Unavailable("x").to_string() == "unavailable: x");
  CHECK(Status::Protocol("bad json").to_string() == "protocol error: bad json");
  CHECK(Status::Cancelled().is_cancelled());
  CHECK(Status::Cancelled().to_string() == "cancelled");
}
