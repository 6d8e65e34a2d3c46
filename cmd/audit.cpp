// `fencegate audit`: prints the audit log of a fencegate database (who was refused, when, and
// with which token): flag parsing, time parsing (RFC 3339 and relative ages), table and JSON-lines
// output, and --follow polling. Reads through Store::open_readonly (no lock, no writes), so it
// works while the sidecar runs. With --follow it installs SIGINT/SIGTERM handlers for its own
// duration.
//
// Exit codes: 0 success (also when nothing matches, and on SIGINT/SIGTERM while following), 1 the
// database cannot be opened or read, 2 bad arguments.

#include <signal.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cmd/cmd.h"
#include "common/flags.h"
#include "fence_store/store.h"
#include "proxy/audit_json.h"
#include "proxy/audit_query.h"
#include "proxy/timefmt.h"

namespace fencegate::cmd {
namespace {

using proxy::fetch_newest_audit;
using proxy::format_rfc3339_ms;
using proxy::is_control;
using proxy::kAuditPage;
using proxy::newest_audit_id;
using proxy::next_code_point;
using proxy::now_unix_ms;
using proxy::parse_time_arg;

using store::AuditQuery;
using store::AuditRecord;
using store::Status;
using store::Store;

constexpr int kExitOk = 0, kExitRuntime = 1, kExitUsage = 2;
constexpr int kDefaultLimit = 50;
constexpr int kMaxLimit = 1'000'000;  // fetched in pages of kAuditPage
constexpr std::chrono::milliseconds kPollInterval{250};
constexpr std::size_t kMaxCell = 64;  // table cells longer than this are cut ("..."); --json is whole

constexpr const auto& kDecisions = store::kAuditDecisions;

constexpr const char* kUsage =
    "Usage: fencegate audit --db PATH [flags]\n"
    "\n"
    "Prints the audit log of a fencegate database: every write the fence refused (enforce mode)\n"
    "or would have refused (observe mode). Opens the database read-only, so it works while the\n"
    "sidecar runs and never blocks it.\n"
    "\n"
    "Flags (\"--flag value\" or \"--flag=value\"):\n"
    "  --db PATH          the database file (required)\n"
    "  --resource R       only this resource\n"
    "  --decision D       only this decision: rejected_stale, rejected_missing, rejected_malformed,\n"
    "                     would_reject_stale, would_reject_missing, would_reject_malformed,\n"
    "                     rejected_not_leader, rejected_unknown_generation, would_reject_not_leader,\n"
    "                     would_reject_unknown_generation\n"
    "  --leader L         only rows whose Fencing-Leader header was L\n"
    "  --since T          only rows at or after T\n"
    "  --until T          only rows before T\n"
    "  --limit N          at most N rows, the newest (default 50)\n"
    "  --json             one JSON object per line instead of a table; keys: id, time, resource,\n"
    "                     decision, presented_generation, current_generation, method, target,\n"
    "                     client, leader, mode, user_agent, traceparent, client_identity, member\n"
    "                     (member: the fleet replica that wrote it; presented_generation null: no valid\n"
    "                     token)\n"
    "  --follow           print the newest --limit matching rows OLDEST FIRST, then keep printing\n"
    "                     new matching rows as they are committed (polled every 250 ms) until\n"
    "                     interrupted (SIGINT/SIGTERM, exit 0), or until 10 s after --until\n"
    "  --help             this text\n"
    "\n"
    "Times T are RFC 3339 (2026-11-29T10:00:00Z, 2026-11-29T12:00:00.250+02:00) or an age before\n"
    "now: -90s, -30m, -1h, -7d. Without --follow rows print newest first. In the table, times are\n"
    "UTC with milliseconds, \"-\" means empty (a presented generation of \"-\" means none or\n"
    "malformed), and cells longer than 64 characters are cut; --json prints them whole.\n"
    "\n"
    "Examples:\n"
    "  fencegate audit --db ./fence.db --since -1h\n"
    "  fencegate audit --db ./fence.db --resource orders --decision rejected_stale --json\n"
    "  fencegate audit --db ./fence.db --follow\n"
    "\n"
    "Exit codes: 0 success (also when nothing matches: a note goes to stderr in table mode,\n"
    "nothing at all with --json), 1 the database cannot be opened or read, 2 bad flags.\n";

// ---- Times (parsing and formatting shared with the admin API: proxy/timefmt.h) ----

std::int64_t now_ms() { return now_unix_ms(); }

// Parses --since/--until. Returns false with *why set.
bool parse_time(std::string_view s, std::int64_t now, std::int64_t* out, std::string* why) {
  std::int64_t t = 0;
  if (!parse_time_arg(s, now, &t)) {
    *why =
        "not a time; use RFC 3339 (2026-11-29T10:00:00Z, 2026-11-29T12:00:00.5+02:00) or an age "
        "before now (-90s, -30m, -1h, -7d)";
    return false;
  }
  if (t <= 0) {
    *why = "is not after 1970-01-01T00:00:00Z";
    return false;
  }
  *out = t;
  return true;
}

std::string format_time(std::int64_t ms) { return format_rfc3339_ms(ms); }

// ---- Text: UTF-8 aware escaping for the terminal (JSON: proxy/audit_json.h) ----

// For the table: control characters (C0, DEL, C1) and invalid bytes become \xNN / \u{NN} so a
// hostile request target cannot drive the operator's terminal; "" becomes "-".
std::string sanitize(std::string_view s) {
  if (s.empty()) return "-";
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t start = i;
    const std::int32_t cp = next_code_point(s, &i);
    char buf[16];
    if (cp < 0) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(s[start]));
      out += buf;
    } else if (is_control(cp)) {
      std::snprintf(buf, sizeof buf, cp < 0x80 ? "\\x%02x" : "\\u{%02x}", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  return out;
}

// Display width, approximated as code points (every cell is sanitized first).
std::size_t width(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string cut(std::string s) {
  if (width(s) <= kMaxCell) return s;
  std::size_t cps = 0, i = 0;
  while (i < s.size() && cps < kMaxCell - 3) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    ++cps;
  }
  s.resize(i);
  return s + "...";
}

// ---- Output ----

struct Options {
  std::string db;
  AuditQuery query;  // filters; limit/cursors are set per page
  int limit = kDefaultLimit;
  bool json = false;
  bool follow = false;
};

constexpr std::size_t kColumns = 10;
constexpr std::array<const char*, kColumns> kHeaders = {"TIME",   "RESOURCE", "DECISION", "PRESENTED", "CURRENT",
                                                        "METHOD", "TARGET",   "CLIENT",   "LEADER",    "MODE"};

std::array<std::string, kColumns> cells(const AuditRecord& rec) {
  const auto& r = rec.row;
  return {format_time(r.time_ms),
          cut(sanitize(r.resource)),
          cut(sanitize(r.decision)),
          r.presented_generation == 0 ? std::string("-") : std::to_string(r.presented_generation),
          std::to_string(r.current_generation),
          cut(sanitize(r.method)),
          cut(sanitize(r.target)),
          cut(sanitize(r.client)),
          cut(sanitize(r.leader)),
          cut(sanitize(r.mode))};
}

class Printer {
 public:
  explicit Printer(bool json) : json_(json) {
    for (std::size_t c = 0; c < kColumns; ++c) widths_[c] = std::strlen(kHeaders[c]);
  }

  // Widens the table's columns to fit `recs` (call before the header).
  void fit(const std::vector<AuditRecord>& recs) {
    if (json_) return;
    for (const auto& rec : recs) {
      auto cs = cells(rec);
      for (std::size_t c = 0; c < kColumns; ++c) widths_[c] = std::max(widths_[c], width(cs[c]));
    }
  }

  void header() {
    if (json_) return;
    std::array<std::string, kColumns> hs;
    for (std::size_t c = 0; c < kColumns; ++c) hs[c] = kHeaders[c];
    line(hs);
  }

  void row(const AuditRecord& rec) {
    if (!json_) {
      line(cells(rec));
      return;
    }
    proxy::append_audit_row_json(&buf_, rec);
    buf_ += '\n';
  }

  // Writes what was printed. Returns false if stdout is gone (e.g. a closed pipe).
  bool flush() {
    bool ok = buf_.empty() || std::fwrite(buf_.data(), 1, buf_.size(), stdout) == buf_.size();
    buf_.clear();
    return std::fflush(stdout) == 0 && ok;
  }

 private:
  void line(const std::array<std::string, kColumns>& cs) {
    for (std::size_t c = 0; c < kColumns; ++c) {
      buf_ += cs[c];
      if (c + 1 < kColumns) buf_.append(widths_[c] > width(cs[c]) ? widths_[c] - width(cs[c]) + 2 : 2, ' ');
    }
    buf_ += '\n';
  }

  const bool json_;
  std::array<std::size_t, kColumns> widths_{};
  std::string buf_;
};

// ---- Flags ----

// A value may start with '-': "--since -1h".
constexpr std::array kAuditFlags = {
    flags::Flag{"--db"},
    flags::Flag{"--resource"},
    flags::Flag{"--decision"},
    flags::Flag{"--leader"},
    flags::Flag{"--since"},
    flags::Flag{"--until"},
    flags::Flag{"--limit"},
    flags::Flag{"--json", flags::Arity::none},
    flags::Flag{"--follow", flags::Arity::none},
};

// Returns kExitOk with *opts filled, kExitUsage after printing why, or -1 for --help (printed).
int parse_args(const std::vector<std::string>& args, Options* opts) {
  auto usage_error = [](const std::string& msg) {
    std::fprintf(stderr, "fencegate audit: %s\nRun `fencegate audit --help` for the flags.\n", msg.c_str());
    return kExitUsage;
  };
  std::optional<std::string> since, until, limit;
  bool have_db = false;
  // The first problem ends the parse (flags and values are checked in argument order).
  for (const flags::Item& item : flags::parse(args, kAuditFlags).items) {
    const std::string& name = item.name;
    switch (item.kind) {
      case flags::Kind::help: std::fputs(kUsage, stdout); return -1;
      case flags::Kind::not_a_flag:
        return usage_error("unexpected argument \"" + item.arg + "\" (flags start with --)");
      case flags::Kind::unknown_flag: return usage_error("unknown flag " + name);
      case flags::Kind::value_on_boolean: return usage_error(name + " takes no value");
      case flags::Kind::missing_value: return usage_error(name + " needs a value");
      case flags::Kind::flag: break;
    }
    if (name == "--json" || name == "--follow") {
      (name == "--json" ? opts->json : opts->follow) = true;
      continue;
    }
    if (item.value.empty()) return usage_error(name + " needs a value (got an empty one)");
    if (name == "--db") {
      opts->db = item.value;
      have_db = true;
    } else if (name == "--resource") {
      opts->query.resource = item.value;
    } else if (name == "--decision") {
      opts->query.decision = item.value;
    } else if (name == "--leader") {
      opts->query.leader = item.value;
    } else if (name == "--since") {
      since = item.value;
    } else if (name == "--until") {
      until = item.value;
    } else if (name == "--limit") {
      limit = item.value;
    }
  }
  if (!have_db) return usage_error("--db is required (the fencegate database file to read)");
  if (const auto& d = opts->query.decision;
      !d.empty() && std::find(kDecisions.begin(), kDecisions.end(), d) == kDecisions.end()) {
    std::string known;
    for (auto k : kDecisions) known += (known.empty() ? "" : ", ") + std::string(k);
    return usage_error("--decision \"" + d + "\": unknown decision; one of " + known);
  }
  const std::int64_t now = now_ms();
  std::string why;
  if (since && !parse_time(*since, now, &opts->query.since_ms, &why))
    return usage_error("--since \"" + *since + "\": " + why);
  if (until && !parse_time(*until, now, &opts->query.until_ms, &why))
    return usage_error("--until \"" + *until + "\": " + why);
  if (until && opts->query.until_ms <= 0) opts->query.until_ms = 1;  // 0 would mean no bound
  if (since && until && opts->query.since_ms >= opts->query.until_ms)
    return usage_error("--since " + format_time(opts->query.since_ms) + " is not before --until " +
                       format_time(opts->query.until_ms) + ": nothing could match");
  if (limit) {
    long long n = 0;
    auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
    const bool ok = limit->size() <= 9 && std::all_of(limit->begin(), limit->end(), is_digit);
    if (ok) n = std::stoll(*limit);
    if (!ok || n < 1 || n > kMaxLimit)
      return usage_error("--limit \"" + *limit + "\": not a whole number from 1 to " + std::to_string(kMaxLimit));
    opts->limit = static_cast<int>(n);
  }
  return kExitOk;
}

// ---- Queries ----

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) { g_stop = 1; }

// Installs SIGINT/SIGTERM handlers (no SA_RESTART) and restores the old ones at destruction.
class StopSignals {
 public:
  StopSignals() {
    g_stop = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

// Sleeps up to `d`, returning early once a stop signal arrived.
void nap(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (!g_stop && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(d, std::chrono::milliseconds(25)));
}

int fail_runtime(const std::string& msg) {
  std::fprintf(stderr, "fencegate audit: %s\n", msg.c_str());
  return kExitRuntime;
}

// The backlog (oldest first), then every new matching row as it is committed.
int follow(Store& s, const Options& o) {
  StopSignals signals;
  std::string err;
  // Rows up to `cursor` are handled; later ones are new. Taken before the backlog query so a row
  // committed in between is printed exactly once.
  std::int64_t cursor = 0;
  if (!newest_audit_id(s, &cursor, &err)) return fail_runtime(err);
  std::vector<AuditRecord> backlog;
  if (cursor > 0 && !fetch_newest_audit(s, o.query, cursor + 1, o.limit, &backlog, &err)) return fail_runtime(err);
  std::reverse(backlog.begin(), backlog.end());

  Printer out(o.json);
  out.fit(backlog);
  out.header();
  for (const auto& r : backlog) out.row(r);
  if (!out.flush()) return kExitOk;  // nobody is reading any more
  if (backlog.empty() && !o.json) std::fputs("fencegate audit: no matching audit rows yet; following\n", stderr);

  // With --until, no row can match once the clock is past it: the decision time is taken when
  // a request is decided, and its row is committed within moments (10 s of slack covers a
  // slow batch). Then there is nothing left to follow.
  const bool bounded = o.query.until_ms > 0;
  while (!g_stop) {
    const bool last = bounded && now_ms() > o.query.until_ms + 10'000;
    nap(kPollInterval);
    if (g_stop) break;
    std::vector<AuditRecord> fresh;
    if (cursor == 0) {
      // after_id needs a row to start from: on an empty table, take everything there is now.
      std::int64_t head = 0;
      if (!newest_audit_id(s, &head, &err)) return fail_runtime(err);
      if (head == 0) continue;
      if (!fetch_newest_audit(s, o.query, head + 1, std::numeric_limits<int>::max(), &fresh, &err))
        return fail_runtime(err);
      std::reverse(fresh.begin(), fresh.end());
      cursor = head;
    } else {
      AuditQuery q = o.query;
      q.limit = kAuditPage;
      for (;;) {
        q.after_id = cursor;
        Status st = Status::OK();
        auto page = s.query_audit(q, &st);
        if (!st.ok()) return fail_runtime(st.message());
        if (page.empty()) break;
        cursor = page.back().id;
        fresh.insert(fresh.end(), page.begin(), page.end());
        if (static_cast<int>(page.size()) < kAuditPage) break;
      }
    }
    for (const auto& r : fresh) out.row(r);
    if (!out.flush()) return kExitOk;
    if (last) break;
  }
  return kExitOk;
}

}  // namespace

int run_audit(const std::vector<std::string>& args) {
  Options o;
  if (int rc = parse_args(args, &o); rc != kExitOk) return rc < 0 ? kExitOk : rc;

  std::string err;
  std::unique_ptr<Store> s = Store::open_readonly(o.db, &err, /*snapshot_ok=*/!o.follow);
  if (!s) return fail_runtime(err.empty() ? "cannot open database " + o.db : err);

  if (o.follow) return follow(*s, o);

  std::vector<AuditRecord> rows;
  if (!fetch_newest_audit(*s, o.query, 0, o.limit, &rows, &err)) return fail_runtime("reading " + o.db + ": " + err);
  if (rows.empty()) {
    if (!o.json) std::fprintf(stderr, "fencegate audit: no matching audit rows in %s\n", o.db.c_str());
    return kExitOk;
  }
  Printer out(o.json);
  out.fit(rows);
  out.header();
  for (const auto& r : rows) out.row(r);
  out.flush();
  return kExitOk;
}

}  // namespace fencegate::cmd
