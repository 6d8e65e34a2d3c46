// The signals `fencegate elect` handles and the waits that watch them (see elect_signals.h).
#include "election_client/elect_signals.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <thread>

#include "election_client/backend.h"

namespace fencegate::election {

namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Set once at start, before any thread: elect was started with SIGHUP ignored (`nohup`). Then a
// hangup is not a stop signal, for elect or its command.
bool g_hup_ignored = false;

}  // namespace

void install_elect_signals() {
  // The handled signals are taken with sigtimedwait(); block them before any thread exists
  // so every thread inherits the mask.
  struct sigaction hup {};
  g_hup_ignored = sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler == SIG_IGN;
  // A launcher's ignored SIGCHLD would have the kernel reap the command itself, and its exit
  // status would be lost (elect would report 0).
  signal(SIGCHLD, SIG_DFL);
  sigset_t s = handled_signals();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

bool hup_ignored() { return g_hup_ignored; }

sigset_t handled_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  if (!g_hup_ignored) sigaddset(&s, SIGHUP);  // a closed terminal or ssh session: stop cleanly (resign), not die
  sigaddset(&s, SIGQUIT);
  sigaddset(&s, SIGUSR1);  // passed on to the command, never fatal to elect
  sigaddset(&s, SIGUSR2);
  sigaddset(&s, SIGCHLD);
  return s;
}

bool is_stop_signal(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT; }

int wait_signal(milliseconds timeout) {
  sigset_t s = handled_signals();
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>((timeout.count() % 1000) * 1000000)};
  siginfo_t info;
  int sig = sigtimedwait(&s, &info, &ts);
  return sig > 0 ? sig : 0;
}

Waited run_watched(const std::function<void(const std::atomic<bool>&)>& work, const Candidacy* term) {
  std::atomic<bool> cancel{false}, done{false};
  const pthread_t waiter = pthread_self();
  std::thread t([&] {
    work(cancel);
    done = true;
    pthread_kill(waiter, SIGCHLD);  // wake the sigtimedwait below now rather than at its next slice
  });
  Waited w;
  while (!done) {
    int sig = wait_signal(50ms);
    if (w.why != Interrupt::none) continue;
    if (is_stop_signal(sig)) {
      w = {Interrupt::signal, sig};
      cancel = true;
    } else if (term && !term->valid()) {
      w = {Interrupt::lease, 0};
      cancel = true;
    }
  }
  t.join();
  return w;
}

int sleep_watching(milliseconds d) {
  auto until = Clock::now() + d;
  while (Clock::now() < until) {
    auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    int sig = wait_signal(std::min(left, milliseconds(50)) + 1ms);
    if (is_stop_signal(sig)) return sig;
  }
  return 0;
}

}  // namespace fencegate::election
