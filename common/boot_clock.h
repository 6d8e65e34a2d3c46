// BootClock: the clock of every lease deadline (the elector's, its guardian's, the lease keeper's,
// an authority's window). A C++ Clock on CLOCK_BOOTTIME, which keeps counting while the host is
// suspended; std::chrono::steady_clock (CLOCK_MONOTONIC on Linux) stops then, so a deadline on it
// would still lie ahead after a resume although etcd, on another host, counted the whole pause
// and may have elected a successor.
//
// Timers: condition_variable, poll(), sigtimedwait() and Asio's steady_timer count their timeouts
// on CLOCK_MONOTONIC, so a wait for a boot-clock deadline sleeps on through a suspension by up to
// the time it had left. Wait at most wait_slice(deadline) at a time and read now() again after
// each wake-up: a suspension is then noticed within kMaxBootClockWait of the resume.
//
// Thread-safety: stateless; now() and now_ns() are async-signal-safe (clock_gettime), so a
// forked child may call them.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace fencegate {

struct BootClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<BootClock>;
  static constexpr bool is_steady = true;  // never set back; counts a suspension

  // Nanoseconds on CLOCK_BOOTTIME (since boot, suspensions included).
  static std::int64_t now_ns() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
  static time_point now() noexcept { return time_point(duration(now_ns())); }
};

// The longest a wait for a boot-clock deadline may sleep on a monotonic timer before it reads
// BootClock again: how late a suspension's end can be noticed.
inline constexpr std::chrono::milliseconds kMaxBootClockWait{100};

// How long to wait (on any timer) before checking `deadline` again: the time left on the boot
// clock, at most kMaxBootClockWait, never negative.
inline std::chrono::nanoseconds wait_slice(BootClock::time_point deadline) {
  const auto left = deadline - BootClock::now();
  return std::clamp<std::chrono::nanoseconds>(left, std::chrono::nanoseconds(0), kMaxBootClockWait);
}

}  // namespace fencegate
