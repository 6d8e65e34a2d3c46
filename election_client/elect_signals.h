// The signals `fencegate elect` handles, and the waits that watch them: elect's main thread never
// blocks for long; it takes its signals with sigtimedwait() in short slices while slow steps run
// on a helper thread (run_watched).
//
// Thread-safety: install_elect_signals() runs once on the main thread before any other thread
// exists (every thread inherits the blocked mask); the waits run on the main thread.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>

namespace fencegate::election {

class Candidacy;

// Notes whether elect was started with SIGHUP ignored (`nohup`: then a hangup is not a stop
// signal, for elect or its command), restores a launcher's ignored SIGCHLD (the kernel would
// reap the command itself and its exit status would be lost), blocks the handled signals and
// ignores SIGPIPE.
void install_elect_signals();

// Returns true iff elect was started with SIGHUP ignored (set by install_elect_signals()).
bool hup_ignored();

// The signals elect takes with sigtimedwait (blocked in every thread).
sigset_t handled_signals();

// Signals that stop elect the way SIGTERM does: the command is stopped, elect resigns.
bool is_stop_signal(int sig);

// Waits up to `timeout` for a handled signal. Returns the signal, or 0.
int wait_signal(std::chrono::milliseconds timeout);

enum class Interrupt { none, signal, lease };

struct Waited {
  Interrupt why = Interrupt::none;
  int sig = 0;
};

// Runs work(cancel) on a helper thread; meanwhile waits for SIGTERM/SIGINT and checks the lease
// or session (if `term`: Candidacy::valid()). On either, raises cancel and waits for work to return.
Waited run_watched(const std::function<void(const std::atomic<bool>&)>& work, const Candidacy* term);

// Sleeps up to `d`, returning early with the signal if SIGTERM/SIGINT arrives (else 0).
int sleep_watching(std::chrono::milliseconds d);

}  // namespace fencegate::election
