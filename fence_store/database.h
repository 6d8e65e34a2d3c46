// fence_store internals (see database.cpp): the database file and the SQLite helpers the store
// shares. Only fence_store's own sources include this header (the only code that includes
// sqlite3.h); the product's interface is store.h.
//
// Thread-safety: the functions hold no state; a connection is used by one thread at a time.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace fencegate::store::detail {

// Runs one or more statements without results. Returns "" or the sqlite error message.
std::string exec(sqlite3* db, const char* sql);
// Returns false and sets *msg if the pragma/query failed; else *out = first column of first row.
bool query_int(sqlite3* db, const char* sql, std::int64_t* out, std::string* msg);
std::string col_text(sqlite3_stmt* st, int i);
// SQLITE_STATIC: `s` must outlive the statement's step.
void bind_text(sqlite3_stmt* st, int i, const std::string& s);

// Opens a connection; returns nullptr and sets *error on failure.
sqlite3* open_db(const std::string& path, int flags, std::string* error);
// Fails with "not a database" etc. on files SQLite cannot read; "" if fine.
std::string probe(sqlite3* db, const std::string& path);

// The name the database is owned under (symbolic links resolved, hard links refused). Returns ""
// with *out set, or an error.
std::string owned_name(const std::string& path, std::string* out);
// Takes the ownership locks ("<db>.lock" and the database file); returns the lock file's fd and
// sets *db_fd, or -1 with *error set.
int take_lock(const std::string& path, std::string* error, int* db_fd);

// A real write transaction that changes nothing. Returns "" or SQLite's error.
std::string write_probe(sqlite3* db);
// Whether the write-ahead log has room for `pages` more frames (what an advance of new resources
// needs), without committing anything: a rolled-back transaction spills them there. Returns "" or
// SQLite's error ("database or disk is full"). For readiness after a failed commit: the one-page
// write_probe can fit where a commit of new resources cannot.
std::string room_probe(sqlite3* db, int pages);
// Whether `table` has a column `column` (false on any error).
bool has_column(sqlite3* db, const char* table, const char* column);
// Configures the writer's connection (WAL, synchronous=FULL, ...) and migrates the schema.
// Returns "" or the error.
std::string prepare_writer(sqlite3* db, const std::string& path);
// Checks that a read-only connection can read a database with the current schema. Returns "" or
// the error.
std::string check_readable(sqlite3* db, const std::string& path);

// Paced I/O (paced_io.cpp), installed by open_db() before its first connection: while a
// PacedWrites of a thread is alive, the pages SQLite writes from that thread are written back in
// 128 KiB pieces as they go rather than all at the commit's sync, and the core is offered after
// each 128 KiB read or written. Other threads, and this one otherwise, read and write as before.
void install_paced_io();
class PacedWrites {
 public:
  PacedWrites();
  ~PacedWrites();
  PacedWrites(const PacedWrites&) = delete;
  PacedWrites& operator=(const PacedWrites&) = delete;

 private:
  bool was_;
};
// Writebacks started by paced writes since the process began (for tests).
std::uint64_t paced_writebacks();
// The CPU time the calling thread has used (a retention chunk's rest is reckoned from it).
std::chrono::nanoseconds thread_cpu();

// While alive, `db` offers its thread's core every `steps` SQLite VM steps (sched_yield returns at
// once when nothing else is runnable). Issue 29: a retention chunk is tens of milliseconds of CPU;
// on a core shared with an I/O thread the scheduler would otherwise let it run a whole slice (ms)
// while requests wait: the data path's p99.
class YieldingSteps {
 public:
  YieldingSteps(sqlite3* db, int steps);
  ~YieldingSteps();
  YieldingSteps(const YieldingSteps&) = delete;
  YieldingSteps& operator=(const YieldingSteps&) = delete;

 private:
  sqlite3* db_;
  PacedWrites paced_;  // and the chunk's commit (and checkpoint) writes its pages back as it goes
};

}  // namespace fencegate::store::detail
