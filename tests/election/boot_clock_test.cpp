// Which clock each lease deadline reads: CLOCK_BOOTTIME (common/boot_clock.h), which counts a
// suspended host, never the monotonic clock, which stops while it is suspended. A suspension cannot
// be made in a test; a time namespace whose boot clock runs ahead of its monotonic clock (what a
// host that was suspended sees) stands in for one where the tests run as root.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>

#include "common/boot_clock.h"
#include "election_client/guardian.h"
#include "election_client/lease_keeper.h"
#include "proxy/authority.h"
#include "tests/election/etcd_harness.h"

using namespace std::chrono_literals;
using fencegate::BootClock;

namespace {

std::int64_t read_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// How far the time namespace of the inner test sets the boot clock ahead of the monotonic one:
// as if the host had been suspended for this long.
constexpr std::int64_t kSuspendedSeconds = 100000;

}  // namespace

TEST_CASE("boot clock: reads CLOCK_BOOTTIME, never behind CLOCK_MONOTONIC; a steady Clock") {
  static_assert(BootClock::is_steady);
  static_assert(std::is_same_v<BootClock::duration, std::chrono::nanoseconds>);
  static_assert(std::is_same_v<BootClock::time_point::clock, BootClock>);
  const std::int64_t before = read_ns(CLOCK_BOOTTIME);
  const std::int64_t ours = BootClock::now().time_since_epoch().count();
  const std::int64_t ns = BootClock::now_ns();
  const std::int64_t after = read_ns(CLOCK_BOOTTIME);
  CHECK(before <= ours);
  CHECK(ours <= ns);
  CHECK(ns <= after);
  CHECK(read_ns(CLOCK_BOOTTIME) >= read_ns(CLOCK_MONOTONIC));
  // wait_slice: the time left, at most kMaxBootClockWait, never negative.
  CHECK(fencegate::wait_slice(BootClock::now() - 1s) == 0ns);
  CHECK(fencegate::wait_slice(BootClock::now() + 1h) == fencegate::kMaxBootClockWait);
  const auto small = fencegate::wait_slice(BootClock::now() + 30ms);
  CHECK(small > 0ns);
  CHECK(small <= 30ms);
}

TEST_CASE("boot clock: every lease deadline is on it (lease keeper, elect's guardian, authority window)") {
  // LeaseKeeper: its deadline, the send time of the last renewal, and valid()'s clock read.
  CHECK(std::is_same_v<fencegate::election::LeaseKeeper::Clock, BootClock>);
  CHECK(std::is_same_v<decltype(std::declval<fencegate::election::LeaseKeeper&>().deadline()), BootClock::time_point>);
  // The guardian's expiry (elect.cpp static_asserts it is the lease keeper's clock as well).
  CHECK(std::is_same_v<fencegate::election::GuardianClock, BootClock>);
  // The authority's window since its last contact with etcd.
  CHECK(std::is_same_v<fencegate::proxy::Authority::Clock, BootClock>);
}

// Run only by the next test case, in a time namespace whose boot clock is kSuspendedSeconds ahead.
TEST_CASE("boot clock: inner (in a time namespace whose boot clock is ahead)") {
  if (!std::getenv("FG_BOOT_CLOCK_INNER")) return;
  const std::int64_t gap = read_ns(CLOCK_BOOTTIME) - read_ns(CLOCK_MONOTONIC);
  const std::int64_t ahead = (kSuspendedSeconds - 1) * 1000000000LL;  // less what passes between the reads
  REQUIRE(gap >= ahead);
  const std::int64_t ours = BootClock::now_ns() - read_ns(CLOCK_MONOTONIC);
  CHECK(ours >= ahead);  // BootClock is not the monotonic clock

  // The guardian kills the command at an expiry on the boot clock: one on the monotonic clock
  // would see this expiry kSuspendedSeconds away (and the command would run on).
  signal(SIGPIPE, SIG_IGN);  // as elect does: release_guardian() writes to a guardian that is done
  fencegate::election::Guardian guardian;
  const auto started = BootClock::now();
  const pid_t pid = fencegate::election::spawn({"sleep", "30"}, {"PATH=/usr/bin:/bin"}, started + 300ms, &guardian);
  REQUIRE(pid > 0);
  REQUIRE(guardian.pid > 0);
  int wstatus = 0;
  bool reaped = false;
  while (!(reaped = fencegate::election::reap_command(pid, &wstatus)) && BootClock::now() < started + 5s)
    std::this_thread::sleep_for(10ms);
  if (!reaped) {
    kill(-pid, SIGKILL);
    fencegate::election::reap_command(pid, &wstatus);
  }
  const auto took = BootClock::now() - started;
  fencegate::election::release_guardian(guardian);
  CHECK_MESSAGE(reaped, "the guardian did not kill the command at its boot-clock expiry");
  CHECK(WIFSIGNALED(wstatus));
  CHECK(WTERMSIG(wstatus) == SIGKILL);
  CHECK(took >= 300ms);
  CHECK(took < 3s);
}

TEST_CASE("boot clock: after a (simulated) suspension the guardian still kills the command at its boot-clock expiry") {
  if (std::getenv("FG_BOOT_CLOCK_INNER")) return;
  if (std::system("unshare --time --boottime 1 true >/dev/null 2>&1") != 0) {
    MESSAGE("SKIPPED: cannot make a time namespace here (needs root and util-linux unshare)");
    return;
  }
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  fencegate::testing::TempDir dir("fencegate-boot-clock");
  const std::string log = dir.file("inner.log");
  const std::string cmd = "FG_BOOT_CLOCK_INNER=1 unshare --time --boottime " + std::to_string(kSuspendedSeconds) +
                          " '" + std::string(self) + "' -tc='boot clock: inner*' >'" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  CHECK_MESSAGE(rc == 0, fencegate::testing::read_file(log));
}
