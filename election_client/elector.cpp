// The elector behind `fencegate elect`: one term per loop iteration, lease -> campaign -> barrier
// -> command -> supervise (see elector.h).
#include "election_client/elector.h"

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>

#include "election_client/backend.h"
#include "election_client/elect_signals.h"
#include "election_client/fence_barrier.h"
#include "election_client/guardian.h"
#include "election_client/status_server.h"
#include "common/file_checks.h"
#include "common/log.h"

extern char** environ;

namespace fencegate::election {

namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
// Lease deadlines and what is measured against them (the grace before SIGKILL is cut to the
// lease's expiry): the lease's own clock, CLOCK_BOOTTIME (common/boot_clock.h), which counts a
// suspended host. The guardian must take the same time points.
using Clock = Candidacy::Clock;
static_assert(std::is_same_v<GuardianClock, Clock>, "the guardian's expiry is the lease's deadline");

std::vector<std::string> child_env(const ElectOptions& f, std::int64_t token) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view v(*e);
    if (v.rfind("FENCING_TOKEN=", 0) == 0 || v.rfind("FENCING_ELECTION=", 0) == 0 ||
        v.rfind("FENCING_LEADER_ID=", 0) == 0)
      continue;
    env.emplace_back(v);
  }
  env.push_back("FENCING_TOKEN=" + std::to_string(token));
  env.push_back("FENCING_ELECTION=" + f.election);
  env.push_back("FENCING_LEADER_ID=" + f.id);
  return env;
}

// Kills what the command (or catch-up) left running outside its process group: with elect a
// child subreaper, those processes are elect's descendants (guardian.h).
void stop_leftovers(const std::string& cgroup) {
  // The command's own cgroup first (issue 31): every process it started, wherever it went.
  if (!cgroup.empty()) {
    const int n = kill_command_cgroup(cgroup, 2000ms);
    if (n > 0)
      log::warn("killed the processes left in the command's cgroup (cgroup.kill)",
                {log::kv("count", n), log::kv("cgroup", cgroup)});
    else if (n < 0) log::error("could not empty the command's cgroup", {log::kv("cgroup", cgroup)});
  }
  // The subreaper's sweep: the fallback, and a safety net behind the cgroup.
  if (int n = kill_descendants(2000ms))
    log::warn("killed processes the command left outside its process group", {log::kv("count", n)});
}

class Elect {
 public:
  Elect(ElectOptions f, std::unique_ptr<Backend> backend, ElectMetrics& metrics, std::string cgroup_parent)
      : f_(std::move(f)), backend_(std::move(backend)), metrics_(metrics), cgroup_parent_(std::move(cgroup_parent)) {}

  int run();

 private:
  // Stops the command's process group: SIGTERM (or `first`), SIGKILL after the grace period, or
  // at `kill_by` if that comes first. Returns the command's wait status.
  int stop_command(pid_t pid, int first, bool* have_status, Clock::time_point kill_by = Clock::time_point::max());

  // What supervise() saw: the command's wait status; whether leadership was lost meanwhile.
  struct Supervised {
    int wstatus = 0;
    bool lost = false;
  };
  Supervised supervise(pid_t pid, std::int64_t token, Candidacy& term, Guardian& guardian);

  // The catch-up command of the activation barrier (--catch-up): runs with the token, must exit 0
  // within --catch-up-timeout-ms while the lease stays valid. Returns 0 on success, -1 on
  // failure (logged), or the stop signal that interrupted it.
  int catch_up(std::int64_t token, Candidacy& term);

  // A cgroup of its own for the next command or catch-up (issue 31): "" when cgroup v2 is not
  // writable here, or this one cannot be made (logged; the subreaper remains).
  std::string command_cgroup() const {
    if (cgroup_parent_.empty()) return {};
    std::string dir = cgroup_parent_ + "/fencegate-elect-" + std::to_string(getpid());
    if (std::string e = make_command_cgroup(dir); !e.empty()) {
      log::warn("cannot make the command's cgroup; the subreaper alone stops what it leaves", {log::kv("error", e)});
      return {};
    }
    return dir;
  }

  // Constant after construction
  ElectOptions f_;  // fence_token changes when its file is re-read (each term)
  std::unique_ptr<Backend> backend_;
  ElectMetrics& metrics_;
  const std::string cgroup_parent_;
};

int Elect::catch_up(std::int64_t token, Candidacy& term) {
  Guardian guardian;
  std::string cgroup = command_cgroup();
  const pid_t pid =
      spawn({"/bin/sh", "-c", f_.catch_up}, child_env(f_, token), term.deadline() + term.margin(), &guardian, &cgroup);
  if (pid < 0) {
    const int e = errno;
    stop_leftovers(cgroup);
    log::error("could not start the catch-up command", {log::kv("error", std::strerror(e))});
    return -1;
  }
  log::info("catch-up started", {log::kv("pid", pid), log::kv("token", token)});
  const auto until = std::chrono::steady_clock::now() + milliseconds(f_.catch_up_timeout_ms);
  int wstatus = 0, result = -1;
  std::string why;
  for (;;) {
    const int sig = wait_signal(50ms);
    if (reap_command(pid, &wstatus)) {
      if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) result = 0;
      else why = "exited with " + std::to_string(exit_code_of(wstatus));
      break;
    }
    if (term.valid()) extend_guardian(guardian, term.deadline() + term.margin());
    if (is_stop_signal(sig)) {
      why = "signal";
      result = sig;
    } else if (!term.valid() || term.gone()) {
      why = "leadership lost during the catch-up";
    } else if (std::chrono::steady_clock::now() >= until) {
      why = "did not finish within --catch-up-timeout-ms (" + std::to_string(f_.catch_up_timeout_ms) + ")";
    } else {
      continue;
    }
    kill(-pid, SIGKILL);
    while (!reap_command(pid, &wstatus)) wait_signal(20ms);
    break;
  }
  release_guardian(guardian);
  stop_leftovers(cgroup);
  if (result == 0) log::info("catch-up done", {log::kv("token", token)});
  else log::error("catch-up failed: resigning", {log::kv("token", token), log::kv("why", why)});
  return result;
}

int Elect::stop_command(pid_t pid, int first, bool* have_status, Clock::time_point kill_by) {
  kill(-pid, first);
  const auto kill_at = std::min(Clock::now() + milliseconds(f_.grace_ms), kill_by);
  bool killed = false;
  int wstatus = 0;
  *have_status = false;
  for (;;) {
    if (reap_command(pid, &wstatus)) {
      *have_status = true;
      break;
    }
    if (!killed && Clock::now() >= kill_at) {
      log::warn("command still running after the grace period: SIGKILL",
                {log::kv("pid", pid), log::kv("grace_ms", f_.grace_ms)});
      kill(-pid, SIGKILL);
      killed = true;
    }
    wait_signal(20ms);  // SIGCHLD wakes us early; a second SIGTERM/SIGINT is absorbed here
  }
  return wstatus;
}

// Runs while the command does: passes signals on, and stops it when leadership is lost (the
// lease not valid, or the leader key gone). Returns its wait status and whether leadership was
// lost while it ran.
Elect::Supervised Elect::supervise(pid_t pid, std::int64_t token, Candidacy& term, Guardian& guardian) {
  Supervised out;
  int& wstatus = out.wstatus;
  bool& lost = out.lost;
  bool exited = false;
  int forwarded = 0;
  Clock::time_point kill_at{};
  Clock::time_point last_deadline = term.deadline();
  while (!exited) {
    int sig = wait_signal(50ms);
    if (reap_command(pid, &wstatus)) {
      exited = true;
      if (!term.valid()) {
        metrics_.set_ready(false);
        metrics_.loss(term.state() == "lost" ? "lost" : "jeopardy");
        // Its guardian killed it at the lease's earliest expiry, while elect was not running.
        log::error("leadership lost: the lease ran out while elect was stopped; the command was killed at its expiry",
                   {log::kv("token", token), log::kv("pid", pid), log::kv("status", exit_code_of(wstatus))});
        lost = true;
      }
      break;
    }
    if (term.valid()) {
      extend_guardian(guardian, term.deadline() + term.margin());
      // A renewal moved the deadline: how much time was left to the old one (--status-listen).
      if (const auto d = term.deadline(); d > last_deadline) {
        metrics_.renewal_margin(std::max<Clock::duration>(last_deadline - Clock::now(), Clock::duration::zero()));
        last_deadline = d;
      }
    }
    if (!term.valid()) {
      metrics_.set_ready(false);
      metrics_.loss(term.state() == "lost" ? "lost" : "jeopardy");
      log::error("leadership lost: stopping the command",
                 {log::kv("state", term.state()), log::kv("token", token), log::kv("pid", pid),
                  log::kv("late_ms",
                          std::chrono::duration_cast<milliseconds>(Clock::now() - term.deadline()).count())});
      // etcd may expire the lease (and elect the next leader) from deadline + margin on: the
      // command gets SIGKILL by then if --grace-ms would run past it, so that it never runs on
      // while a successor leads.
      const auto expiry = term.deadline() + term.margin();
      if (Clock::now() + milliseconds(f_.grace_ms) > expiry)
        log::warn("the grace period is cut to the lease's earliest expiry",
                  {log::kv("grace_ms", f_.grace_ms),
                   log::kv("left_ms",
                           std::max<std::int64_t>(
                               0, std::chrono::duration_cast<milliseconds>(expiry - Clock::now()).count()))});
      bool have = false;
      wstatus = stop_command(pid, SIGTERM, &have, expiry);
      lost = true;
      break;
    }
    // After the lease (a paused elect sees its deadline passed first, whatever the watch says).
    if (term.gone()) {
      metrics_.set_ready(false);
      metrics_.loss("deleted");
      log::error("leadership lost: the leader key was deleted; stopping the command",
                 {log::kv("key", term.handle()), log::kv("token", token), log::kv("pid", pid)});
      // The lease still lives, but the term is over: the guardian's SIGKILL moves to the end of
      // the grace (so it holds even if elect stops now), not the lease's expiry.
      set_guardian(guardian, Clock::now() + milliseconds(f_.grace_ms));
      bool have = false;
      wstatus = stop_command(pid, SIGTERM, &have);
      lost = true;
      break;
    }
    if (sig == SIGUSR1 || sig == SIGUSR2) kill(-pid, sig);  // the command's own business
    if (is_stop_signal(sig)) {
      // SIGHUP and SIGQUIT stop the command as SIGTERM does (to a daemon SIGHUP may mean
      // "reload", which would not stop it before the SIGKILL).
      const int pass = sig == SIGHUP || sig == SIGQUIT ? SIGTERM : sig;
      if (!forwarded) {
        log::info("passing the signal to the command",
                  {log::kv("signal", sig), log::kv("sent", pass), log::kv("pid", pid)});
        forwarded = pass;
        kill_at = Clock::now() + milliseconds(f_.grace_ms);
      }
      kill(-pid, pass);
    }
    if (forwarded && Clock::now() >= kill_at) {
      log::warn("command still running after the grace period: SIGKILL", {log::kv("pid", pid)});
      kill(-pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
  return out;
}

int Elect::run() {
  bool first_term = true;
  milliseconds backoff = 500ms;
  const CandidacyOptions co{f_.election, f_.id, f_.ttl};
  for (;;) {
    // --- 1. Lease (etcd) or session (ZooKeeper) or lock TTL (Redis).
    std::unique_ptr<Candidacy> term;
    Status st;
    Waited w = run_watched([&](const std::atomic<bool>&) { st = backend_->start(co, &term); }, nullptr);
    if (w.why == Interrupt::signal) {
      if (st.ok()) term->give_up(false);
      return 128 + w.sig;
    }
    if (!st.ok()) {
      log::error("could not grant a lease",
                 {log::kv("coordinator", f_.coordinator.text), log::kv("backend", kind_name(f_.coordinator.kind)),
                  log::kv("error", st.to_string())});
      if (first_term) return kExitUnavailable;
      if (int sig = sleep_watching(backoff)) return 128 + sig;
      backoff = std::min(backoff * 2, milliseconds(5000));
      continue;
    }
    first_term = false;

    // --- 2. Campaign (blocks until elected).
    log::info("campaigning", {log::kv("election", f_.election), log::kv("id", f_.id)});
    metrics_.campaign();
    const auto campaign_started = std::chrono::steady_clock::now();
    std::int64_t token = 0;
    Status cst;
    for (;;) {
      w = run_watched([&](const std::atomic<bool>& cancel) { cst = term->campaign(cancel, &token); }, term.get());
      // A campaign cut off (the coordinator restarted, a broken connection) while the lease is
      // still valid campaigns again with it: the candidate keeps its place in line. A new lease
      // would queue a second candidate behind the first, which leads with no process behind it.
      if (w.why == Interrupt::none && !cst.ok() && term->valid()) {
        log::warn("campaign interrupted; campaigning again with the same lease", {log::kv("error", cst.to_string())});
        if (int sig = sleep_watching(backoff)) {
          term->give_up(false);
          return 128 + sig;
        }
        backoff = std::min(backoff * 2, milliseconds(5000));
        continue;
      }
      break;
    }
    if (w.why == Interrupt::signal) {
      log::info("signal while campaigning: giving up", {log::kv("signal", w.sig)});
      term->give_up(false);
      return 128 + w.sig;
    }
    if (w.why == Interrupt::lease || !cst.ok()) {
      log::warn("campaign ended without leadership; starting over",
                {log::kv("error", w.why == Interrupt::lease ? std::string("lease not valid") : cst.to_string())});
      term->give_up(false);
      if (int sig = sleep_watching(backoff)) return 128 + sig;
      backoff = std::min(backoff * 2, milliseconds(5000));
      continue;
    }
    // Belt and braces: the election's leader is ours, with this token.
    const auto won_at = std::chrono::steady_clock::now();
    Status lst = term->confirm(token);
    if (!lst.ok() || !term->valid()) {
      log::warn("elected, but the leader key is not ours any more; starting over",
                {log::kv("error", lst.ok() ? std::string("lease not valid") : lst.to_string())});
      term->give_up(true);
      if (int sig = sleep_watching(backoff)) return 128 + sig;
      continue;
    }
    backoff = 500ms;
    log::info("elected", {log::kv("election", f_.election), log::kv("id", f_.id), log::kv("token", token),
                          log::kv("backend", kind_name(f_.coordinator.kind)), log::kv("key", term->handle())});
    term->guard();
    const auto confirmed_at = std::chrono::steady_clock::now();
    metrics_.stage("acquire", confirmed_at - won_at);

    // --- 3a. Catch-up (--catch-up): recover state before activation, with the token.
    if (!f_.catch_up.empty()) {
      const int cu = catch_up(token, *term);
      metrics_.stage("catch_up", std::chrono::steady_clock::now() - confirmed_at);
      if (cu != 0) {
        metrics_.loss("catch_up");
        term->give_up(true);
        if (cu > 0) return 128 + cu;
        if (!f_.recampaign) {
          log::error("activation barrier failed (catch-up): not starting the command",
                     {log::kv("exit_code", kExitFenceFailed)});
          return kExitFenceFailed;
        }
        log::warn("activation barrier failed (catch-up): campaigning again");
        if (int sig = sleep_watching(2000ms)) return 128 + sig;
        continue;
      }
    }
    const auto caught_up_at = std::chrono::steady_clock::now();

    // --- 3. Activation barrier: every fence has durably advanced to `token`.
    if (!f_.fence_token_file.empty()) {  // rotated since the last term? (kept if unreadable or refused now)
      std::string t;
      if (std::string e = load_token_file(f_.fence_token_file, &t); !e.empty()) {
        log::warn("the fence token file cannot be used now; keeping the token read before",
                  {log::kv("file", f_.fence_token_file), log::kv("error", e)});
      } else if (t != f_.fence_token) {
        f_.fence_token = std::move(t);
        log::info("re-read the fence token file: the token changed", {log::kv("file", f_.fence_token_file)});
      }
    }
    const FenceBarrierOptions barrier{f_.id, f_.fence_token, f_.fence_timeout_ms, f_.fence_cacert};  // issue 27
    FenceResult fr = FenceResult::ok;
    w = run_watched(
        [&](const std::atomic<bool>& cancel) {
          for (std::size_t i = 0; i < f_.fences.size() && fr == FenceResult::ok; ++i)
            fr = fence_one(barrier, f_.fences[i], f_.fence_urls[i], token, cancel);
        },
        term.get());
    if (w.why == Interrupt::signal) {
      term->give_up(true);
      return 128 + w.sig;
    }
    if (w.why == Interrupt::lease || !term->valid()) {
      log::warn("lease not valid before the command started; starting over");
      term->give_up(true);
      continue;
    }
    const auto fenced_at = std::chrono::steady_clock::now();
    metrics_.stage("fence", fenced_at - caught_up_at);
    if (fr != FenceResult::ok) {
      metrics_.loss("fence");
      term->give_up(true);
      if (!f_.recampaign) {
        log::error("activation barrier failed: not starting the command", {log::kv("exit_code", kExitFenceFailed)});
        return kExitFenceFailed;
      }
      log::warn("activation barrier failed: campaigning again");
      if (int sig = sleep_watching(2000ms)) return 128 + sig;
      continue;
    }

    // --- 4. Run the command while the lease is valid and the leader key is ours.
    if (term->gone()) {
      log::warn("the leader key was deleted before the command started; starting over",
                {log::kv("key", term->handle())});
      term->give_up(false);
      continue;
    }
    if (!term->valid()) {
      term->give_up(true);
      continue;
    }
    Guardian guardian;
    std::string cgroup = command_cgroup();
    const bool wanted_cgroup = !cgroup.empty();
    pid_t pid = spawn(f_.command, child_env(f_, token), term->deadline() + term->margin(), &guardian, &cgroup);
    if (wanted_cgroup && cgroup.empty() && pid >= 0)
      log::warn("could not move the command into its cgroup; the subreaper alone stops what it leaves");
    if (pid < 0) {
      const int e = errno;  // before the cleanup's own calls
      stop_leftovers(cgroup);
      log::error("could not start the command",
                 {log::kv("command", f_.command.front()), log::kv("error", std::strerror(e))});
      term->give_up(true);
      return kExitUnavailable;
    }
    log::info("command started",
              {log::kv("pid", pid), log::kv("token", token), log::kv("command", f_.command.front())});
    {
      const auto started_at = std::chrono::steady_clock::now();
      metrics_.stage("start", started_at - fenced_at);
      metrics_.set_ready(true, token);
      auto ms = [](auto d) { return std::chrono::duration_cast<milliseconds>(d).count(); };
      // The failover as this candidate saw it. Detection of the predecessor's loss and the
      // election itself are one wait from here (the coordinator hands over when it sees the loss).
      log::info("failover breakdown",
                {log::kv("token", token), log::kv("detection_election_ms", ms(won_at - campaign_started)),
                 log::kv("acquire_ms", ms(confirmed_at - won_at)),
                 log::kv("catch_up_ms", ms(caught_up_at - confirmed_at)),
                 log::kv("fencing_ms", ms(fenced_at - caught_up_at)), log::kv("start_ms", ms(started_at - fenced_at)),
                 log::kv("active_after_win_ms", ms(started_at - won_at))});
    }
    if (guardian.pid < 0)
      log::warn("could not start the command's guardian: if elect is killed, the command's children may outlive it");
    const Supervised ended = supervise(pid, token, *term, guardian);
    metrics_.set_ready(false);
    const int wstatus = ended.wstatus;
    const bool lost = ended.lost;
    release_guardian(guardian);  // the command is reaped and its group killed
    stop_leftovers(cgroup);      // and what left the group (setsid, a daemon): elect is their subreaper

    // --- 5. Resign and revoke.
    if (lost) {
      log::info("command stopped", {log::kv("pid", pid), log::kv("status", exit_code_of(wstatus))});
      term->give_up(true);
      if (f_.recampaign) {
        log::info("campaigning again (--recampaign)");
        if (int sig = sleep_watching(500ms)) return 128 + sig;
        continue;
      }
      log::error("exiting: leadership lost", {log::kv("exit_code", kExitLeadershipLost)});
      return kExitLeadershipLost;
    }
    const int code = exit_code_of(wstatus);
    log::info("command exited", {log::kv("pid", pid), log::kv("exit_code", code)});
    term->give_up(true);
    return code;
  }
}

}  // namespace

std::string load_token_file(const std::string& path, std::string* token) {
  std::string t;
  if (auto e = files::read_secret_trimmed(path, &t); !e.empty()) return e;
  if (t.empty()) return path + " holds no token";
  if (std::any_of(t.begin(), t.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return "the token in " + path + " has a control character inside (such as a CR or LF); it must be one line";
  if (t.size() < files::kMinTokenBytes)
    return "the token in " + path + " has " + std::to_string(t.size()) + " bytes; at least " +
           std::to_string(files::kMinTokenBytes) + " are required";
  *token = std::move(t);
  return {};
}

std::string read_token_file(const std::string& path) {
  std::string t;
  return load_token_file(path, &t).empty() ? t : std::string();
}

std::string default_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  return std::string(host) + ":" + std::to_string(getpid());
}

int run_elect(ElectOptions options) {
  std::string why;
  std::unique_ptr<Backend> backend = make_backend(options.coordinator, &why);
  if (!backend) {
    log::error("cannot use the coordinator", {log::kv("coordinator", options.coordinator.text), log::kv("error", why)});
    return kExitUsage;
  }
  install_elect_signals();  // before the status server's thread: every thread blocks elect's signals
  const bool subreaper = become_subreaper();
  if (!subreaper)
    log::warn("could not become a child subreaper: processes that leave the command's process group survive it");
  // How the command's processes are stopped, said once (issue 31).
  std::string no_cgroup;
  std::string cgroup_parent = command_cgroup_parent(&no_cgroup);
  if (!cgroup_parent.empty())
    log::info("stopping the command's processes: cgroup v2 (a cgroup per command, cgroup.kill)",
              {log::kv("cgroup", cgroup_parent + "/fencegate-elect-" + std::to_string(getpid()))});
  else
    log::info("stopping the command's processes: child subreaper (cgroup v2 not used)",
              {log::kv("why", no_cgroup), log::kv("subreaper", subreaper)});
  ElectMetrics metrics;
  StatusServer status(metrics);
  if (!options.status_listen.empty()) {
    if (std::string e = status.start(options.status_listen); !e.empty()) {
      log::error("--status-listen: cannot serve", {log::kv("error", e)});
      return kExitUnavailable;
    }
    log::info("status: serving /readyz and /metrics",
              {log::kv("listen", options.status_listen), log::kv("port", status.port())});
  }
  return Elect(std::move(options), std::move(backend), metrics, std::move(cgroup_parent)).run();
}

}  // namespace fencegate::election
