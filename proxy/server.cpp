// `fencegate serve`: starts the fenced reverse proxy (store, fence, authorities, workers, the data
// and admin listeners), accepts connections for the workers, and stops gracefully.
//
// Threads: one io_context per worker thread (each runs single-threaded, so a session and the
// upstream pool of its worker need no locks: proxy/worker.h); the Store's thread commits; the
// Fence's timer thread enforces drain timeouts. Results from those threads are handed to the
// session's worker (Worker::deliver), which resumes the session at its next request start or from
// one posted handler, whichever comes first. The request path: proxy/session.cpp (head, route,
// admit) and proxy/relay.cpp (forward).
#include "proxy/server.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <cstring>
#include <thread>

#include "proxy/admin.h"
#include "proxy/authority.h"
#include "proxy/fleet.h"
#include "proxy/listener.h"
#include "proxy/session.h"
#include "proxy/tls_listener.h"

namespace fencegate::proxy {

namespace {

// Accepts on worker 0 and hands each new descriptor to the next worker, which wraps it in a
// socket on its own thread: a socket is registered with, and only ever used from, the reactor of
// the thread that runs it (the workers' io_contexts take no per-socket locks).
// With `tls` (issue 27) each connection goes to the TLS terminator, which starts its Session.
task<void> accept_loop(ServerState& st, Acceptor& acceptor, std::vector<std::unique_ptr<Worker>>& workers,
                       TlsTerminator* tls) {
  std::size_t next = 0;
  boost::system::error_code ec;
  const tcp protocol = acceptor.local_endpoint(ec).protocol();
  acceptor.non_blocking(true, ec);
  for (;;) {
    co_await acceptor.async_wait(tcp::acceptor::wait_read, net::redirect_error(use_task, ec));
    if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
    for (;;) {
      const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) break;
        if (e == ECONNABORTED || e == EINTR || e == EPROTO) continue;
        log::warn("accept failed; backing off", {log::kv("error", std::strerror(e))});
        Timer t(acceptor.get_executor(), std::chrono::milliseconds(50));
        co_await t.async_wait(net::redirect_error(use_task, ec));
        break;
      }
      if (st.connections.load(std::memory_order_relaxed) >= st.rt.snapshot()->cfg->max_connections) {
        // Over the limit: close at once so the client sees it; the sidecar stays up for the rest.
        ::close(fd);
        continue;
      }
      st.connections.fetch_add(1, std::memory_order_relaxed);
      st.rt.metrics.open_connections.fetch_add(1, std::memory_order_relaxed);
      Worker& w = *workers[next];
      next = (next + 1) % workers.size();
      net::post(w.ioc, [&st, &w, fd, protocol, tls] {
        if (tls) return tls->serve(w, fd);
        boost::system::error_code aec;
        Socket sock(w.ioc.get_executor());
        sock.assign(protocol, fd, aec);
        if (aec) {
          ::close(fd);
          st.connections.fetch_sub(1, std::memory_order_relaxed);
          st.rt.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
          return;
        }
        auto s = std::make_unique<Session>(st, w, std::move(sock));
        if (!s->count_client()) {
          // Over max_connections_per_client: dropping the session closes the connection.
          st.rt.metrics.connections_refused_per_client.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        Session::start(std::move(s), false);
      });
      // Let this worker's other handlers run between accepts: a burst of connects must not
      // starve the sessions (nor keep a just-closed one counted against max_connections).
      co_await net::post(acceptor.get_executor(), use_task);
    }
  }
}

// Lets the process hold max_connections sockets (client + upstream each) if the hard limit allows.
void raise_fd_limit(std::size_t max_connections) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < max_connections + 64)
    log::warn("file descriptor limit is below what max_connections needs",
              {log::kv("nofile", static_cast<std::uint64_t>(rl.rlim_cur)),
               log::kv("max_connections", max_connections)});
}

// The last of a stop, after the workers: commits what is queued (audit rows of observe mode)
// before anything else goes away (its completions still reach the fence), says what could not be
// stored, then has the fence forget parked callbacks and in-flight registrations, so the sessions
// still suspended in the io_contexts (destroyed after this, before the fence) can go in any order.
void settle_store_and_fence(std::unique_ptr<store::Store> store, Fence& fence) {
  // Generations forwarded in observe mode while the store failed get one last attempt first.
  fence.settle_owed();
  store->set_commit_observer(nullptr);
  store->drain_and_stop();
  for (const ResourceView& v : fence.owed())
    log::error(
        "observe mode: a forwarded generation was never stored (the store kept failing); "
        "after this restart a lower generation is not known to be stale",
        {log::kv("resource", v.name), log::kv("generation", v.owed), log::kv("stored", v.stored)});
  if (const std::uint64_t lost = store->audit_rows_dropped())
    log::error("observe-mode audit rows could not be written and are lost (the store kept failing)",
               {log::kv("rows", lost)});
  store.reset();
  fence.shutdown();
}

}  // namespace

int run_serve(std::shared_ptr<const config::Config> cfg) {
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);  // a full or limited disk must surface as a store error, not kill us
  log::Level lvl;
  if (log::parse_level(cfg->log_level, &lvl)) log::set_level(lvl);
  raise_fd_limit(cfg->max_connections);

  std::string err;
  bool tls_error = false;  // TLS to the upstream (issue 27): a file that does not load exits 2
  std::shared_ptr<const Snapshot> snap = make_snapshot(cfg, &err, &tls_error);
  if (!snap) {
    log::error("cannot start", {log::kv("error", err)});
    if (tls_error) std::fprintf(stderr, "fencegate serve: %s\n", err.c_str());
    return tls_error ? 2 : 1;
  }
  std::unique_ptr<store::Store> store = store::Store::open(cfg->db, &err);
  if (!store) {
    log::error("cannot open the fence store", {log::kv("db", cfg->db), log::kv("error", err)});
    return 1;
  }
  store->set_retention(static_cast<std::int64_t>(cfg->audit.max_age.count()) * 1000, cfg->audit.max_rows);
  // Fleet (docs/fleet.md): the fence's generations live in etcd, shared with the other replicas.
  std::unique_ptr<Fleet> fleet;
  if (cfg->fleet.enabled()) {
    try {
      fleet = std::make_unique<Fleet>(*cfg);
    } catch (const std::invalid_argument& e) {  // issue 27: an etcd TLS file that does not load
      log::error("cannot start the fleet", {log::kv("error", e.what())});
      std::fprintf(stderr, "fencegate serve: %s\n", e.what());
      return 2;
    }
    store = fleet->wrap(std::move(store));
  }
  auto fence = std::make_unique<Fence>(*store, cfg->drain_timeout, cfg->max_resources);
  if (fleet) fleet->attach(*fence);
  // The fleet's threads call into the fence: on every way out of here they stop before it goes.
  struct FleetStop {
    Fleet* f;
    ~FleetStop() {
      if (f) f->stop();
    }
  } fleet_stop{fleet.get()};
  fence->set_observe_cap(cfg->upstream_timeout);
  if (!fence->load(&err)) {
    log::error("cannot load generations", {log::kv("db", cfg->db), log::kv("error", err)});
    return 1;
  }
  Metrics metrics;
  Runtime rt(*store, *fence, metrics);
  rt.install(snap);
  recount_routes(*fence, *snap);
  // Election authorities (authority-linked fencing): started before traffic, stopped before the
  // store and the fence go away. Until one has reached etcd its routes' writes get 503.
  Authorities authorities(rt);
  try {
    authorities.start(*cfg);
  } catch (const std::invalid_argument& e) {  // issue 27 (tls-ctl): an etcd TLS file that does not load
    log::error("cannot start an authority", {log::kv("error", e.what())});
    std::fprintf(stderr, "fencegate serve: %s\n", e.what());
    return 2;
  }
  fence->set_drain_observer([&metrics](double s) { metrics.drain_wait.observe(s); });
  store->set_commit_observer([&metrics, &rt](double s, std::size_t rows, const store::Status& result) {
    if (rows) {  // 0 rows: the store's idle health check, not a commit
      metrics.store_commit.observe(s);
      if (!result.ok()) metrics.store_commit_failures.fetch_add(1, std::memory_order_relaxed);
    }
    rt.store_result(result.ok(), result.ok() ? std::string() : "the last store commit failed: " + result.message());
  });
  ServerState st(rt);
  st.authorities = &authorities;
  rt.authorities = &authorities;
  rt.fleet = fleet.get();
  if (fleet) fleet->start();

  // TLS on the data listener (issue 27): the context is built before the port serves; a
  // certificate or key that does not load, or a key that is not the certificate's, exits 2.
  std::unique_ptr<TlsTerminator> tls;
  if (cfg->tls.enabled()) {
    tls = std::make_unique<TlsTerminator>(st);
    if (!tls->start(*cfg, &err)) {
      log::error("cannot start TLS", {log::kv("error", err)});
      std::fprintf(stderr, "fencegate serve: %s\n", err.c_str());
      authorities.stop();
      return 2;
    }
    rt.reload_tls = [t = tls.get()](const config::Config& c) { return t->reload(c); };
  }

  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < std::max(1, cfg->threads); ++i) workers.push_back(std::make_unique<Worker>());
  // SIGINT/SIGTERM are taken over before the port opens: one that arrives as soon as a client
  // can connect is queued for the graceful stop below, not the default instant death.
  net::signal_set signals(workers[0]->ioc, SIGINT, SIGTERM);

  Acceptor acceptor(workers[0]->ioc.get_executor());
  if (ListenError le; !open_listener(acceptor, cfg->listen, &le)) {
    log::error(le.resolving ? "cannot resolve listen address" : "cannot listen",
               {log::kv("listen", cfg->listen.to_string()), log::kv("error", le.message)});
    return 1;
  }
  log::info("listening", {log::kv("address", bound_address(acceptor)), log::kv("db", cfg->db),
                          log::kv("threads", workers.size()), log::kv("routes", cfg->routes.size())});

  std::unique_ptr<AdminServer> admin = AdminServer::start(rt, cfg->admin.listen, &err);
  if (!admin) {
    log::error("cannot start the admin listener",
               {log::kv("admin_listen", cfg->admin.listen.to_string()), log::kv("error", err)});
    if (err.rfind("admin.tls", 0) == 0) {  // issue 27 (tls-ctl): a certificate that does not load: exit 2
      std::fprintf(stderr, "fencegate serve: %s\n", err.c_str());
      return 2;
    }
    return 1;
  }

  net::co_spawn(workers[0]->ioc, accept_loop(st, acceptor, workers, tls.get()), net::detached);
  for (auto& w : workers) w->start_watchdog();

  // SIGINT/SIGTERM: readiness turns 503, stop accepting, let requests in flight finish (bounded),
  // then stop. (SIGHUP, a reload, is handled by the admin server's thread.)
  net::steady_timer grace(workers[0]->ioc);
  std::chrono::steady_clock::time_point deadline;
  std::function<void()> poll_stop = [&] {
    if (st.active_requests.load() == 0 || std::chrono::steady_clock::now() >= deadline) {
      if (const auto left = st.active_requests.load())
        log::warn("stop deadline passed: the connections of requests still in flight are closed unanswered",
                  {log::kv("in_flight", left)});
      for (auto& w : workers) w->ioc.stop();
      return;
    }
    grace.expires_after(std::chrono::milliseconds(20));
    grace.async_wait([&](boost::system::error_code) { poll_stop(); });
  };
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    log::info("stopping", {log::kv("signal", sig), log::kv("in_flight", st.active_requests.load())});
    rt.stopping = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    deadline = std::chrono::steady_clock::now() +
               std::min(rt.snapshot()->cfg->drain_timeout, std::chrono::milliseconds(10000));
    poll_stop();
  });

  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < workers.size(); ++i) {
    threads.emplace_back([&w = *workers[i]] {
      auto guard = net::make_work_guard(w.ioc);
      w.ioc.run();
    });
  }
  workers[0]->ioc.run();
  for (auto& w : workers) w->ioc.stop();
  for (auto& t : threads) t.join();
  admin->stop();
  authorities.stop();
  if (fleet) fleet->stop();

  settle_store_and_fence(std::move(store), *fence);
  log::info("stopped");
  return 0;
}

}  // namespace fencegate::proxy
