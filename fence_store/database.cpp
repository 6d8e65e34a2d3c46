// fence_store internals: the database file -- connections, schema migrations, the ownership lock,
// the writer's preparation and probes, and the small SQLite helpers the store shares.
#include "fence_store/database.h"

#include "fence_store/store.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace fencegate::store::detail {
namespace {

// Opens `path` read-write, creating it owner-only: mode 0600 whatever the umask (a umask can only
// take bits away, and one that takes the owner's is undone by the fchmod). O_NOFOLLOW: a symbolic
// link planted at the name fails with ELOOP instead of creating or opening the file it names.
// SQLite creates the -wal and -shm files with the database file's mode (and opens them with
// O_NOFOLLOW itself), so a database created here keeps all four files 0600. An existing file
// owned by another user fails with EPERM; an existing file of ours that group or others may
// read or write (made by a release before 0600 was the rule) is tightened to owner-only.
int open_private(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    if (::fchmod(fd, 0600) != 0) {
      int e = errno;
      ::close(fd);
      ::unlink(path.c_str());
      errno = e;
      return -1;
    }
    return fd;
  }
  if (errno != EEXIST) return -1;
  fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  // Another user's file: refused here too, on the descriptor (no race with the check at start).
  struct stat st {};
  if (fd >= 0 && (::fstat(fd, &st) != 0 || st.st_uid != ::geteuid())) {
    ::close(fd);
    errno = EPERM;
    return -1;
  }
  if (fd >= 0 && (st.st_mode & 077) != 0) (void)::fchmod(fd, st.st_mode & 0700);
  return fd;
}

// The -wal and -shm files a release before 0600 was the rule left group- or world-readable:
// SQLite reopens them with the mode they have, so they are tightened (never through a link, and
// only files of ours) before SQLite opens the database.
void tighten_beside(const std::string& path) {
  for (const char* suffix : {"-wal", "-shm"}) {
    const std::string p = path + suffix;
    int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) != 0)
      (void)::fchmod(fd, st.st_mode & 0700);
    ::close(fd);
  }
}

constexpr int kBusyTimeoutMs = 5000;

std::string parent_dir(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Issue 30: idempotency keys (docs/idempotency.md).
// Additive, like the audit log's traceparent: no schema version of its own, so an older
// fencegate (and its read-only tools) still opens the database.
std::string create_idempotency_table(sqlite3* db) {
  return exec(db,
              "CREATE TABLE IF NOT EXISTS idempotency("
              "  id INTEGER PRIMARY KEY,"
              "  resource TEXT NOT NULL,"
              "  scope TEXT NOT NULL,"
              "  key TEXT NOT NULL,"
              "  state INTEGER NOT NULL,"
              "  fingerprint TEXT NOT NULL,"
              "  generation INTEGER NOT NULL,"
              "  status INTEGER NOT NULL,"
              "  headers TEXT NOT NULL,"
              "  body BLOB NOT NULL,"
              "  body_kept INTEGER NOT NULL,"
              "  created_ms INTEGER NOT NULL,"
              "  expires_ms INTEGER NOT NULL,"
              "  UNIQUE(resource, scope, key));"
              "CREATE INDEX IF NOT EXISTS idempotency_expires ON idempotency(expires_ms);");
}

// ---- Schema migrations: migrations[v] takes the schema from version v to v + 1. ----

std::string migrate_0_to_1(sqlite3* db) {
  return exec(db,
              "CREATE TABLE resources("
              "  resource TEXT PRIMARY KEY,"
              "  generation INTEGER NOT NULL,"
              "  advanced_at_ms INTEGER NOT NULL,"
              "  advanced_by TEXT NOT NULL);"
              "CREATE TABLE audit("
              "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
              "  time_ms INTEGER NOT NULL,"
              "  resource TEXT NOT NULL,"
              "  decision TEXT NOT NULL,"
              "  presented_generation INTEGER NOT NULL,"
              "  current_generation INTEGER NOT NULL,"
              "  method TEXT NOT NULL,"
              "  target TEXT NOT NULL,"
              "  client TEXT NOT NULL,"
              "  leader TEXT NOT NULL,"
              "  mode TEXT NOT NULL,"
              "  user_agent TEXT NOT NULL);"
              "CREATE INDEX audit_resource_id ON audit(resource, id);"
              "CREATE INDEX audit_decision_id ON audit(decision, id);"
              "CREATE INDEX audit_time ON audit(time_ms);");
}

using Migration = std::string (*)(sqlite3*);
constexpr std::array<Migration, Store::kSchemaVersion> kMigrations = {migrate_0_to_1};

// Brings the schema up to kSchemaVersion, one transaction per step. Returns "" or an operator message.
std::string migrate(sqlite3* db, const std::string& path) {
  std::int64_t version = 0;
  std::string msg;
  if (!query_int(db, "PRAGMA user_version", &version, &msg)) return "cannot read database " + path + ": " + msg;
  if (version > Store::kSchemaVersion)
    return "database " + path + " has schema version " + std::to_string(version) +
           ", newer than this fencegate supports (" + std::to_string(Store::kSchemaVersion) +
           "); upgrade fencegate or point it at another database";
  for (auto v = version; v < Store::kSchemaVersion; ++v) {
    if (auto e = exec(db, "BEGIN IMMEDIATE"); !e.empty()) return "cannot migrate database " + path + ": " + e;
    std::string e = kMigrations[static_cast<std::size_t>(v)](db);
    if (e.empty()) e = exec(db, ("PRAGMA user_version = " + std::to_string(v + 1)).c_str());
    if (e.empty()) e = exec(db, "COMMIT");
    if (!e.empty()) {
      exec(db, "ROLLBACK");
      return "cannot migrate database " + path + " from schema version " + std::to_string(v) + " to " +
             std::to_string(v + 1) + ": " + e;
    }
  }
  return {};
}

}  // namespace

// Runs one or more statements without results. Returns "" or the sqlite error message.
std::string exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) == SQLITE_OK) return {};
  std::string msg = err ? err : sqlite3_errmsg(db);
  sqlite3_free(err);
  return msg;
}

// Returns false and sets *msg if the pragma/query failed; else *out = first column of first row.

bool query_int(sqlite3* db, const char* sql, std::int64_t* out, std::string* msg) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) {
    *msg = sqlite3_errmsg(db);
    return false;
  }
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int64(st, 0);
  } else if (rc != SQLITE_DONE) {
    *msg = sqlite3_errmsg(db);
    sqlite3_finalize(st);
    return false;
  }
  sqlite3_finalize(st);
  return true;
}

std::string col_text(sqlite3_stmt* st, int i) {
  auto p = reinterpret_cast<const char*>(sqlite3_column_text(st, i));
  return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(st, i))) : std::string();
}

void bind_text(sqlite3_stmt* st, int i, const std::string& s) {
  // SQLITE_STATIC: the string outlives the step (it lives in the batch until reset).
  sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_STATIC);
}

// Opens a connection; returns nullptr and sets *error on failure.
sqlite3* open_db(const std::string& path, int flags, std::string* error) {
  install_paced_io();
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    *error = "cannot open database " + path + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    sqlite3_close_v2(db);
    return nullptr;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  return db;
}

// Fails with "not a database" etc. on files SQLite cannot read; "" if fine.
std::string probe(sqlite3* db, const std::string& path) {
  std::int64_t n = 0;
  std::string msg;
  if (!query_int(db, "SELECT count(*) FROM sqlite_schema", &n, &msg))
    return "cannot open database " + path + ": " + msg;
  return {};
}

// The name the database is owned under. The owner lock (and SQLite's -wal and -shm files) go by
// file name, so every name of one file must lead to the same lock: a symbolic link is resolved to
// the file it names, and a file with several hard links is refused (two names, two locks, two
// owners each with its own idea of the generations). Returns "" with *out set, or an error.
std::string owned_name(const std::string& path, std::string* out) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {  // not there yet: created under this name
    *out = path;
    return {};
  }
  if (S_ISLNK(st.st_mode)) {
    char buf[PATH_MAX];
    if (::realpath(path.c_str(), buf) == nullptr)
      return "cannot open database " + path +
             ": it is a symbolic link, and what it names cannot be resolved: " + std::strerror(errno);
    *out = buf;
    if (::stat(buf, &st) != 0) return "cannot open database " + path + ": " + std::strerror(errno);
  } else {
    *out = path;
  }
  if (S_ISREG(st.st_mode) && st.st_nlink > 1)
    return "cannot open database " + path + ": the file has " + std::to_string(st.st_nlink) +
           " hard links; fencegate's owner lock goes by file name, so a database must have one name only";
  return {};
}

// Takes the ownership locks (the lock file's and the database file's). Returns the lock file's
// fd with *db_fd set, or -1 with *error set.
int take_lock(const std::string& path, std::string* error, int* db_fd) {
  const std::string lock_path = path + ".lock";
  int fd = open_private(lock_path);
  if (fd < 0) {
    int e = errno;
    std::string dir = parent_dir(path);
    if (e == ENOENT && !is_dir(dir)) *error = "cannot open database " + path + ": directory " + dir + " does not exist";
    else if (e == ELOOP)
      *error = "cannot open database " + path + ": lock file " + lock_path +
               " is a symbolic link; fencegate does not open the files beside the database through a link";
    else *error = "cannot open database " + path + ": cannot create lock file " + lock_path + ": " + std::strerror(e);
    return -1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    ::close(fd);
    if (e == EWOULDBLOCK)
      *error = "database " + path + " is already owned by another fencegate (lock file " + lock_path + " is held)";
    else *error = "cannot lock " + lock_path + " for database " + path + ": " + std::strerror(e);
    return -1;
  }
  // The database file itself is locked too: with the lock file deleted (a cleanup script, an
  // operator), a second fencegate would create a new one, take it, and own the same database.
  // flock(2) is independent of SQLite's POSIX locks, and readers (the sqlite3 CLI, fencegate
  // audit) do not take it. This descriptor is closed only after SQLite's connections are: closing
  // any descriptor of the file drops the process's POSIX locks on it.
  *db_fd = open_private(path);
  if (*db_fd < 0) {
    int e = errno;
    ::close(fd);
    *error = "cannot open database " + path + ": " + std::strerror(e);
    return -1;
  }
  tighten_beside(path);
  if (::flock(*db_fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    ::close(*db_fd);
    ::close(fd);
    *db_fd = -1;
    if (e == EWOULDBLOCK)
      *error = "database " + path + " is already owned by another fencegate (the database file is locked; was " +
               lock_path + " deleted?)";
    else *error = "cannot lock database " + path + ": " + std::strerror(e);
    return -1;
  }
  return fd;
}

namespace {

// A commit that appends to the WAL changes the file's size, so its fdatasync must also commit the
// file system's journal (on ext4: the journal thread's turn and a second device flush). SQLite
// writes the WAL from its start again after each checkpoint and never shrinks it
// (journal_size_limit is -1), so from its second cycle on, commits overwrite what is there. This
// makes the first cycle overwrite too: pages of a transaction that is rolled back, spilled from a
// tiny page cache, grow the WAL once to the size at which SQLite checkpoints. No commit ever
// claims those frames: readers and recovery ignore them, and the database file is not touched.
// Best effort: on any error the WAL just grows as commits come.
void size_wal(sqlite3* db, const std::string& path) {
  std::int64_t pages = 0, page_size = 0, cache = 0;
  std::string msg;
  if (!query_int(db, "PRAGMA wal_autocheckpoint", &pages, &msg) || pages <= 0 ||
      !query_int(db, "PRAGMA page_size", &page_size, &msg) || !query_int(db, "PRAGMA cache_size", &cache, &msg))
    return;
  struct stat st {};
  const std::int64_t want = 32 + pages * (24 + page_size);  // header + frames
  if (::stat((path + "-wal").c_str(), &st) == 0 && st.st_size >= want) return;
  if (!exec(db, "PRAGMA cache_size = 2").empty()) return;
  if (exec(db, "BEGIN IMMEDIATE").empty()) {
    const std::string fill = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < " +
                             std::to_string(pages) + ") INSERT INTO fencegate_wal_sizing SELECT zeroblob(" +
                             std::to_string(page_size * 3 / 4) + ") FROM n";  // a page each
    if (exec(db, "CREATE TABLE fencegate_wal_sizing(b BLOB)").empty()) exec(db, fill.c_str());
    exec(db, "ROLLBACK");
  }
  exec(db, ("PRAGMA cache_size = " + std::to_string(cache)).c_str());
}
}  // namespace

// A real write transaction that changes nothing: the schema version rewritten as it is (page 1
// is written and synced). Returns "" or SQLite's error.
std::string write_probe(sqlite3* db) {
  std::int64_t v = 0;
  std::string msg;
  if (!query_int(db, "PRAGMA user_version", &v, &msg)) return msg;
  if (auto e = exec(db, "BEGIN IMMEDIATE"); !e.empty()) return e;
  std::string e = exec(db, ("PRAGMA user_version = " + std::to_string(v)).c_str());
  if (e.empty()) e = exec(db, "COMMIT");
  if (!e.empty() && !sqlite3_get_autocommit(db)) exec(db, "ROLLBACK");
  return e;
}

std::string room_probe(sqlite3* db, int pages) {
  std::int64_t page_size = 0, cache = 0;
  std::string msg;
  if (!query_int(db, "PRAGMA page_size", &page_size, &msg) || !query_int(db, "PRAGMA cache_size", &cache, &msg))
    return msg;
  if (auto e = exec(db, "PRAGMA cache_size = 2"); !e.empty()) return e;
  std::string e = exec(db, "BEGIN IMMEDIATE");
  if (e.empty()) {
    e = exec(db, "CREATE TABLE fencegate_room_probe(b BLOB)");
    if (e.empty())
      e = exec(db,
               ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < " + std::to_string(pages) +
                ") INSERT INTO fencegate_room_probe SELECT zeroblob(" + std::to_string(page_size * 3 / 4) + ") FROM n")
                   .c_str());
    if (!sqlite3_get_autocommit(db)) exec(db, "ROLLBACK");
  }
  exec(db, ("PRAGMA cache_size = " + std::to_string(cache)).c_str());
  return e;
}

bool has_column(sqlite3* db, const char* table, const char* column) {
  sqlite3_stmt* st = nullptr;
  bool found = false;
  if (sqlite3_prepare_v2(db, ("PRAGMA table_info(" + std::string(table) + ")").c_str(), -1, &st, nullptr) == SQLITE_OK)
    while (!found && sqlite3_step(st) == SQLITE_ROW) found = col_text(st, 1) == column;
  sqlite3_finalize(st);
  return found;
}

// Sets up the writer connection: WAL, synchronous=FULL, schema. Returns "" or an error.
std::string prepare_writer(sqlite3* db, const std::string& path) {
  if (auto e = probe(db, path); !e.empty()) return e;
  if (sqlite3_db_readonly(db, "main") == 1)  // SQLite quietly falls back to read-only on a 0444 file
    return "cannot open database " + path + " for writing: the file is not writable by this process";
  sqlite3_stmt* st = nullptr;
  std::string mode;
  if (sqlite3_prepare_v2(db, "PRAGMA journal_mode = WAL", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    mode = col_text(st, 0);
  sqlite3_finalize(st);
  if (mode != "wal")
    return "cannot switch database " + path + " to WAL mode: " + (mode.empty() ? sqlite3_errmsg(db) : mode);
  if (auto e = exec(db, "PRAGMA synchronous = FULL"); !e.empty())
    return "cannot set synchronous=FULL on database " + path + ": " + e;
  if (auto e = migrate(db, path); !e.empty()) return e;
  // Additive migration, without a schema version of its own: audit rows gained `traceparent` (the
  // request's W3C trace context). A database from before gets the column (empty in its old rows)
  // the first time it is opened for writing; an older fencegate still reads and writes it.
  if (!has_column(db, "audit", "traceparent"))
    if (auto e = exec(db, "ALTER TABLE audit ADD COLUMN traceparent TEXT NOT NULL DEFAULT ''"); !e.empty())
      return "cannot add the audit log's traceparent column to database " + path + ": " + e;
  // The same for `client_identity` (TLS, issue 27: the verified client certificate's identity).
  if (!has_column(db, "audit", "client_identity"))
    if (auto e = exec(db, "ALTER TABLE audit ADD COLUMN client_identity TEXT NOT NULL DEFAULT ''"); !e.empty())
      return "cannot add the audit log's client_identity column to database " + path + ": " + e;
  // The same for `member` (fleet, issue 33: the replica's fleet member id).
  if (!has_column(db, "audit", "member"))
    if (auto e = exec(db, "ALTER TABLE audit ADD COLUMN member TEXT NOT NULL DEFAULT ''"); !e.empty())
      return "cannot add the audit log's member column to database " + path + ": " + e;
  if (auto e = create_idempotency_table(db); !e.empty())  // issue 30
    return "cannot add the idempotency key table to database " + path + ": " + e;
  // Issue 29: the unfenced-callers report over a window (`decision IN (...) AND time_ms >= since`)
  // searches (decision, time_ms); with only (decision, id) it visits every unfenced row ever kept
  // (~1 s at 10 million rows). Additive, like the columns above: created the first time a database
  // from before is opened for writing (once, ~1 s per million rows), schema version unchanged.
  if (auto e = exec(db, "CREATE INDEX IF NOT EXISTS audit_decision_time ON audit(decision, time_ms)"); !e.empty())
    return "cannot add the audit log's audit_decision_time index to database " + path + ": " + e;
  size_wal(db, path);
  return {};
}

// Checks a read-only connection sees a schema this binary understands. Returns "" or an error.
std::string check_readable(sqlite3* db, const std::string& path) {
  if (auto e = probe(db, path); !e.empty()) return e;
  std::int64_t version = 0;
  std::string msg;
  if (!query_int(db, "PRAGMA user_version", &version, &msg)) return "cannot read database " + path + ": " + msg;
  if (version > Store::kSchemaVersion)
    return "database " + path + " has schema version " + std::to_string(version) +
           ", newer than this fencegate supports (" + std::to_string(Store::kSchemaVersion) + ")";
  if (version < Store::kSchemaVersion)
    return "database " + path + " has schema version " + std::to_string(version) +
           "; open it once with fencegate (read-write) to create or migrate the schema";
  return {};
}

YieldingSteps::YieldingSteps(sqlite3* db, int steps) : db_(db) {
  sqlite3_progress_handler(
      db_, steps, [](void*) { return ::sched_yield(), 0; }, nullptr);
}

YieldingSteps::~YieldingSteps() { sqlite3_progress_handler(db_, 0, nullptr, nullptr); }

}  // namespace fencegate::store::detail
