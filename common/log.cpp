// The logger (see log.h): line formatting and the non-blocking stderr sink.
#include "common/log.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>

#include "common/json.h"

namespace fencegate::log {

namespace {
std::atomic<int> g_level{static_cast<int>(Level::info)};
const char* name(Level l) {
  switch (l) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::error: return "error";
  }
  return "info";
}
}  // namespace

// Writing stderr must never stop a request thread: a log reader that stalls (a full pipe, a
// wedged log driver) would freeze the data path. A line goes out at once when stderr can take
// it without blocking and nothing is queued before it; otherwise it is queued (up to
// kMaxQueuedBytes, then dropped and counted) for a writer thread, which may block alone.
namespace {

constexpr std::size_t kMaxQueuedBytes = 4 << 20;
constexpr std::size_t kAtomicPipeWrite = 4096;  // PIPE_BUF: POLLOUT promises this much room

struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> queue;  // Guarded by mu
  std::size_t bytes = 0;          // Guarded by mu
  std::uint64_t dropped = 0;      // Guarded by mu
  bool writing = false;           // Guarded by mu: the writer thread holds lines taken off the queue
  bool started = false;           // Guarded by mu
};

Sink& sink() {
  static Sink* s = new Sink;  // never destroyed: usable from exit handlers and late threads
  return *s;
}

void write_all(std::string_view line) {
  while (!line.empty()) {
    ssize_t n = ::write(2, line.data(), line.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: nothing to be done
    line.remove_prefix(static_cast<std::size_t>(n));
  }
}

void writer_loop() {
  Sink& s = sink();
  std::unique_lock lk(s.mu);
  for (;;) {
    s.cv.wait(lk, [&] { return !s.queue.empty(); });
    std::deque<std::string> batch;
    batch.swap(s.queue);
    s.bytes = 0;
    const std::uint64_t dropped = std::exchange(s.dropped, 0);
    s.writing = true;
    lk.unlock();
    for (const auto& l : batch) write_all(l);
    if (dropped)
      write_all("{\"level\":\"warn\",\"msg\":\"log lines dropped: stderr did not keep up\",\"count\":" +
                std::to_string(dropped) + "}\n");
    lk.lock();
    s.writing = false;
    s.cv.notify_all();
  }
}

// At exit, give the writer a moment to drain what is queued (a stalled reader: 2 s at most).
void flush_at_exit() {
  Sink& s = sink();
  std::unique_lock lk(s.mu);
  s.cv.wait_for(lk, std::chrono::seconds(2), [&] { return s.queue.empty() && !s.writing; });
}

void emit(std::string line) {
  Sink& s = sink();
  std::unique_lock lk(s.mu);
  if (s.queue.empty() && !s.writing && line.size() <= kAtomicPipeWrite) {
    pollfd p{2, POLLOUT, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP))) {
      write_all(line);  // under the lock: lines of different threads stay whole and in order
      return;
    }
  }
  if (s.bytes + line.size() > kMaxQueuedBytes) {
    ++s.dropped;
    return;
  }
  s.bytes += line.size();
  s.queue.push_back(std::move(line));
  if (!s.started) {
    s.started = true;
    std::thread(writer_loop).detach();
    std::atexit(flush_at_exit);
  }
  s.cv.notify_all();
}

}  // namespace

void set_level(Level l) { g_level.store(static_cast<int>(l)); }
bool enabled(Level l) { return static_cast<int>(l) >= g_level.load(std::memory_order_relaxed); }

bool parse_level(std::string_view s, Level* out) {
  if (s == "debug") *out = Level::debug;
  else if (s == "info") *out = Level::info;
  else if (s == "warn") *out = Level::warn;
  else if (s == "error") *out = Level::error;
  else return false;
  return true;
}

void write(Level l, std::string_view msg, std::initializer_list<Field> fields) {
  if (!enabled(l)) return;
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[80];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  std::string line = "{\"ts\":\"";
  line += ts;
  line += "\",\"level\":\"";
  line += name(l);
  line += "\",\"msg\":";
  json::append_string(line, msg);
  for (const auto& f : fields) {
    line += ',';
    json::append_string(line, f.key);
    line += ':';
    if (f.raw) line += f.value;
    else json::append_string(line, f.value);
  }
  line += "}\n";
  emit(std::move(line));
}

}  // namespace fencegate::log
