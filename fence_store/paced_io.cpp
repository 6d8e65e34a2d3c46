// fence_store internals: paced writes (see database.h, PacedWrites). SQLite's default (unix) VFS
// reads and writes its files through a table of system calls that an application may replace;
// fencegate replaces pread and pwrite with versions that behave as before, except on a thread that
// paces (a retention chunk, issue 29): there, every kPaceBytes written to a file, the kernel is
// told to start writing those bytes back (sync_file_range, SYNC_FILE_RANGE_WRITE: it waits for
// nothing and promises nothing), and every kPaceBytes read or written the core is offered
// (sched_yield; it returns at once when nothing else is runnable). Otherwise the chunk's commit,
// and the checkpoint after it, leave about a thousand dirty pages to the one fdatasync that ends
// each, and the store thread runs up to 4 ms at a stretch inside that writeback while the I/O
// thread sharing its core waits (bench/RESULTS.md, session 23). Durability is untouched: SQLite's
// own syncs run as before, and pages already written back only make them shorter.
#include <fcntl.h>
#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <mutex>

#include "fence_store/database.h"
#include "fence_store/store_testing.h"

namespace fencegate::store::detail {
namespace {

constexpr std::int64_t kPaceBytes = 128 * 1024;

using PreadFn = ssize_t (*)(int, void*, size_t, off_t);
using PwriteFn = ssize_t (*)(int, const void*, size_t, off_t);
PreadFn real_pread = nullptr;    // set once by install(), before any paced call
PwriteFn real_pwrite = nullptr;

thread_local bool t_pacing = false;
thread_local std::int64_t t_unyielded = 0;  // bytes read or written while pacing since the last offer
// The file a pacing thread last wrote to, and the range written since its writeback last started.
thread_local int t_fd = -1;
thread_local off_t t_lo = 0, t_hi = 0;
thread_local std::int64_t t_unflushed = 0;  // bytes written to t_fd since its writeback last started
std::atomic<std::uint64_t> g_writebacks{0};

void start_writeback() {
  if (t_fd >= 0 && t_hi > t_lo) {
    (void)::sync_file_range(t_fd, t_lo, t_hi - t_lo, SYNC_FILE_RANGE_WRITE);
    g_writebacks.fetch_add(1, std::memory_order_relaxed);
  }
  t_fd = -1;
  t_lo = t_hi = 0;
  t_unflushed = 0;
}

// Reads count too: a chunk's B-tree walk reads its pages one pread each (SQLite's own cache is
// small), and a long run of them between two of YieldingSteps' offers holds the core as well.
void offer_after(std::int64_t n) {
  t_unyielded += n;
  if (t_unyielded < kPaceBytes) return;
  t_unyielded = 0;
  ::sched_yield();
}

ssize_t paced_pread(int fd, void* buf, size_t n, off_t off) {
  const ssize_t got = real_pread(fd, buf, n, off);
  if (t_pacing && got > 0) offer_after(got);
  return got;
}

ssize_t paced_pwrite(int fd, const void* buf, size_t n, off_t off) {
  const ssize_t put = real_pwrite(fd, buf, n, off);
  if (!t_pacing || put <= 0) return put;
  if (fd != t_fd) {
    start_writeback();
    t_fd = fd;
    t_lo = off;
    t_hi = off + put;
  } else {
    t_lo = std::min(t_lo, off);
    t_hi = std::max<off_t>(t_hi, off + put);
  }
  t_unflushed += put;
  if (t_unflushed >= kPaceBytes) start_writeback();
  offer_after(put);
  return put;
}

// Replaces `name` in the default VFS's system-call table, if it has that entry.
template <class Fn>
void replace(sqlite3_vfs* vfs, const char* name, Fn paced, Fn* real) {
  auto current = reinterpret_cast<Fn>(vfs->xGetSystemCall(vfs, name));
  if (!current || current == paced) return;
  if (!*real) *real = current;
  vfs->xSetSystemCall(vfs, name, reinterpret_cast<sqlite3_syscall_ptr>(paced));
}

void install() {
  sqlite3_vfs* vfs = sqlite3_vfs_find(nullptr);
  if (!vfs || vfs->iVersion < 3 || !vfs->xGetSystemCall || !vfs->xSetSystemCall) return;
  // SQLite's unix VFS names both; which one its build calls depends on its compile options.
  replace<PreadFn>(vfs, "pread", paced_pread, &real_pread);
  replace<PreadFn>(vfs, "pread64", paced_pread, &real_pread);
  replace<PwriteFn>(vfs, "pwrite", paced_pwrite, &real_pwrite);
  replace<PwriteFn>(vfs, "pwrite64", paced_pwrite, &real_pwrite);
}

}  // namespace

void install_paced_io() {
  static std::once_flag once;
  std::call_once(once, install);
}

PacedWrites::PacedWrites() : was_(t_pacing) { t_pacing = true; }
PacedWrites::~PacedWrites() {
  start_writeback();  // (nothing is waited for: the commit's own sync did that)
  t_pacing = was_;
}

std::uint64_t paced_writebacks() { return g_writebacks.load(std::memory_order_relaxed); }

std::chrono::nanoseconds thread_cpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

}  // namespace fencegate::store::detail

namespace fencegate::store {
std::uint64_t paced_writebacks() { return detail::paced_writebacks(); }
}  // namespace fencegate::store
