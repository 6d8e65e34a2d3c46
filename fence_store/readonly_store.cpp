// The read-only store (`fencegate audit`, `fencegate keys`): one read connection, no lock file,
// no thread; writes are refused. Opening it needs no write access to the database's directory
// (a database with no writer running is read as it is). And the names of key states.
#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "fence_store/database.h"
#include "fence_store/reader.h"
#include "fence_store/store.h"

namespace fencegate::store {
using namespace detail;
namespace {

class ReadOnlyStore final : public Store {
 public:
  ReadOnlyStore(std::string path, sqlite3* db) : path_(std::move(path)), reader_(db) {}

  std::vector<ResourceState> load_all(Status* status) override {
    std::lock_guard lk(mu_);
    return reader_.load_all(status);
  }
  void advance(std::string, std::int64_t, std::string, Done done) override { refuse(done); }
  void append_audit(AuditRow, Done done) override { refuse(done); }
  std::vector<AuditRecord> query_audit(const AuditQuery& q, Status* status) override {
    std::lock_guard lk(mu_);
    return reader_.query_audit(q, status);
  }
  std::vector<UnfencedGroup> query_unfenced(const std::string& resource, std::int64_t since_ms, int limit,
                                            Status* status) override {
    std::lock_guard lk(mu_);
    return reader_.query_unfenced(resource, since_ms, limit, status);
  }
  void set_retention(std::int64_t, std::uint64_t) override {}
  void set_commit_observer(CommitObserver) override {}
  std::size_t queue_depth() const override { return 0; }
  bool key_get(const std::string& resource, const std::string& scope, const std::string& key, KeyRecord* out,
               Status* status) override {
    std::lock_guard lk(mu_);
    return reader_.key_get(resource, scope, key, out, status);
  }
  std::vector<KeyRecord> key_list(const std::string& resource, const std::string& after_resource,
                                  const std::string& after_key, int limit, Status* status) override {
    std::lock_guard lk(mu_);
    return reader_.key_list(resource, after_resource, after_key, limit, status);
  }

 private:
  void refuse(const Done& done) {
    if (done) done(Status::Error("database " + path_ + " is open read-only; writes are refused"));
  }

  const std::string path_;
  std::mutex mu_;
  Reader reader_;  // guarded by mu_
};

}  // namespace

std::string_view to_string(KeyState s) {
  switch (s) {
    case KeyState::in_flight: return "in_flight";
    case KeyState::completed: return "completed";
    case KeyState::unknown: return "unknown";
  }
  return "unknown";
}

std::unique_ptr<Store> Store::open_readonly(const std::string& path, std::string* error, bool snapshot_ok) {
  std::string ignored;
  if (!error) error = &ignored;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *error = "cannot open database " + path + " read-only: " + std::strerror(errno);
    return nullptr;
  }
  sqlite3* db = open_db(path, SQLITE_OPEN_READONLY, error);
  if (!db) return nullptr;
  if (auto e = check_readable(db, path); !e.empty()) {
    sqlite3_close_v2(db);
    // A database in WAL mode needs its -shm file to be read. With no -wal next to it no writer is
    // running (fencegate keeps one while it runs) and nothing is pending, so a reader that may not
    // create files in the directory (an unprivileged operator, a read-only volume) reads the
    // file as it is.
    struct stat wal {};
    if (!snapshot_ok || e.find("readonly") == std::string::npos || ::stat((path + "-wal").c_str(), &wal) == 0) {
      *error = e;
      return nullptr;
    }
    std::string uri = "file:";
    for (unsigned char c : path) {
      if (c == '%' || c == '?' || c == '#') {
        static constexpr char kHex[] = "0123456789ABCDEF";
        uri += '%';
        uri += kHex[c >> 4];
        uri += kHex[c & 15];
      } else {
        uri += static_cast<char>(c);
      }
    }
    uri += "?immutable=1";
    std::string ignored_error;
    db = open_db(uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, &ignored_error);
    if (!db || !check_readable(db, path).empty()) {
      if (db) sqlite3_close_v2(db);
      *error = e;
      return nullptr;
    }
  }
  return std::make_unique<ReadOnlyStore>(path, db);
}

}  // namespace fencegate::store
