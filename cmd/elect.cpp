// `fencegate elect`: flags, usage text and exit codes; the elector itself is
// election_client/elector.h.
//
// fencegate elect --etcd URLS --election NAME [--id NAME] [--ttl S] [--fence URL ...]
//                 [--fence-token-file PATH] [--fence-timeout-ms MS] [--recampaign] [--grace-ms MS]
//                 [--log-level L] -- COMMAND [ARGS...]
//   Exit codes: the command's exit status (128+N if it was killed by signal N) after it ended on
//   its own or after SIGTERM/SIGINT was passed to it; 1 etcd unreachable at start or the command
//   could not be started; 2 bad flags; 75 leadership lost (lease jeopardy or loss) while the
//   command ran -- it was stopped; 76 the activation barrier failed (a --fence refused or stayed
//   unreachable), without --recampaign; 128+N elect got SIGTERM/SIGINT before the command started.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cmd/cmd.h"
#include "common/flags.h"
#include "election_client/backend.h"
#include "election_client/elector.h"
#include "election_client/etcd_client.h"
#include "election_client/guardian.h"
#include "election_client/http_conn.h"
#include "election_client/status_server.h"
#include "common/log.h"

namespace fencegate::cmd {

namespace {

constexpr const char* kElectUsage =
    "Usage: fencegate elect (--coordinator URL | --etcd URLS) --election NAME [flags] -- COMMAND [ARGS...]\n"
    "\n"
    "Campaigns for leadership of NAME in etcd, ZooKeeper or Redis and runs COMMAND only while it\n"
    "holds it, with the fencing token in FENCING_TOKEN (etcd: the leader key's creation revision;\n"
    "ZooKeeper: the leader node's czxid; Redis: the lock's generation counter).\n"
    "\n"
    "  1. grants a lease (--ttl) and keeps it alive; campaigns with --id as the value;\n"
    "  2. once elected, POSTs {\"generation\": N, \"leader\": ID} (and Fencing-Token: N) to\n"
    "     <URL>/fence for every --fence URL and waits until each answered 200 (the activation\n"
    "     barrier). A fence that refuses (any non-200 but 5xx) or stays unreachable/5xx for\n"
    "     --fence-timeout-ms: elect resigns and exits 76, or campaigns again with --recampaign;\n"
    "  3. runs COMMAND in its own process group with FENCING_TOKEN, FENCING_ELECTION and\n"
    "     FENCING_LEADER_ID in its environment;\n"
    "  4. if the lease is lost or in jeopardy (no renewal evidence by the local deadline:\n"
    "     send time of the last renewal + TTL - max(TTL/5, 500ms), on the monotonic clock), or\n"
    "     the leader key is deleted while the lease lives (etcdctl del: the next candidate leads), it\n"
    "     sends SIGTERM to the command's process group, SIGKILL after --grace-ms (on a lost\n"
    "     lease: by the lease's earliest expiry, deadline + margin, if that comes first, so the\n"
    "     command never runs on while a successor leads), resigns and exits 75 -- or campaigns\n"
    "     again with --recampaign;\n"
    "  5. when COMMAND exits: SIGKILL to what is left of its process group, resign, revoke the\n"
    "     lease, exit with COMMAND's status (128+N if killed by signal N).\n"
    "  SIGTERM/SIGINT are passed to the command's process group (SIGHUP/SIGQUIT as SIGTERM;\n"
    "  under nohup, SIGHUP stays ignored by elect and the command;\n"
    "  SIGKILL after --grace-ms), then elect resigns and exits with the command's status;\n"
    "  SIGUSR1/SIGUSR2 are passed on and change nothing else. If elect itself dies (even by\n"
    "  SIGKILL), the command's whole process group gets SIGKILL (a guardian process watches elect);\n"
    "  so it does when the lease's earliest expiry passes while elect is stopped (SIGSTOP, Ctrl-Z).\n"
    "  Processes that leave the command's process group (setsid, a double fork) are SIGKILLed once\n"
    "  the command has stopped: where cgroup v2 is writable the command runs in a cgroup of its own,\n"
    "  killed whole (cgroup.kill; FENCEGATE_ELECT_CGROUP=0 turns it off); else elect is their subreaper.\n"
    "\n"
    "Flags:\n"
    "  --coordinator URL        etcd://host:port[,host:port], zk://host:port[,host:port][/chroot]\n"
    "                           or redis://host:port[/db] (docs/elections.md)\n"
    "  --etcd URLS              etcd client URLs, comma-separated (http://host:port): the same as\n"
    "                           --coordinator etcd://...\n"
    "  --zk-auth FILE           ZooKeeper digest auth: FILE holds user:password (mode 0600/0400)\n"
    "  --cacert, --cert, --key, --user, --password-file: etcd over https and etcd users (below)\n"
    "  --redis-auth FILE        Redis AUTH: FILE holds password or user:password (mode 0600/0400)\n"
    "  --election NAME          election name (etcd: the key prefix NAME/; ZooKeeper: the node\n"
    "                           /NAME under the chroot; Redis: the keys fencegate:election:NAME:*)\n"
    "  --id NAME                leader identity (FENCING_LEADER_ID); default hostname:pid\n"
    "  --ttl SECONDS            lease TTL, 2..3600 (default 10); renewals every TTL/3\n"
    "  --fence URL              a fencegate admin resource URL, e.g.\n"
    "                           http://127.0.0.1:9901/v1/resources/ledger (repeatable)\n"
    "  --fence-cacert PATH      CA file (PEM) that https --fence URLs must verify against\n"
    "                           (default: the system store; the host name is checked)\n"
    "  --fence-token-file PATH  bearer token for the fence admin APIs (mode 0600 or 0400, at\n"
    "                           least 16 bytes, no control characters; docs/security.md)\n"
    "  --fence-timeout-ms MS    how long to wait for each fence, retrying while it is unreachable or 5xx\n"
    "                           (100..3600000, default 30000: above the sidecars' default drain timeout)\n"
    "  --catch-up CMD           after winning and before the fences: `sh -c CMD` with FENCING_TOKEN etc.;\n"
    "                           must exit 0 within --catch-up-timeout-ms, else elect resigns (exit 76,\n"
    "                           or campaigns again with --recampaign)\n"
    "  --catch-up-timeout-ms MS how long the catch-up may take (100..86400000, default 60000)\n"
    "  --status-listen ADDR     serve GET /readyz (200 only while leading with the barrier complete)\n"
    "                           and GET /metrics (fencegate_elect_*) on host:port\n"
    "  --recampaign             after losing leadership or a failed barrier, campaign again\n"
    "  --grace-ms MS            SIGTERM -> SIGKILL grace for the command (default 5000)\n"
    "  --log-level LEVEL        debug, info, warn, error (default info); JSON lines on stderr\n"
    "%s"
    "\n"
    "Exit codes: COMMAND's status; 1 the coordinator unreachable at start or COMMAND could not start;\n"
    "2 bad flags; 75 leadership lost while COMMAND ran; 76 activation barrier failed;\n"
    "128+N got signal N before COMMAND started.\n";

constexpr std::array kElectFlags = {
    flags::Flag{"--etcd"},
    flags::Flag{"--coordinator"},
    flags::Flag{"--zk-auth"},
    flags::Flag{"--redis-auth"},
    flags::Flag{"--election"},
    flags::Flag{"--id"},
    flags::Flag{"--ttl"},
    flags::Flag{"--fence"},
    flags::Flag{"--fence-token-file"},
    flags::Flag{"--fence-cacert"},  // issue 27
    flags::Flag{"--cacert"},
    flags::Flag{"--cert"},
    flags::Flag{"--key"},
    flags::Flag{"--user"},
    flags::Flag{"--password-file"},
    flags::Flag{"--password"},  // refused with a reason
    flags::Flag{"--fence-timeout-ms"},
    flags::Flag{"--recampaign", flags::Arity::none},
    flags::Flag{"--catch-up"},
    flags::Flag{"--catch-up-timeout-ms"},
    flags::Flag{"--status-listen"},
    flags::Flag{"--grace-ms"},
    flags::Flag{"--log-level"},
};

}  // namespace

int usage_error(const char* cmd, const std::vector<std::string>& errors) {
  for (const auto& e : errors) std::fprintf(stderr, "fencegate %s: %s\n", cmd, e.c_str());
  std::fprintf(stderr, "Run `fencegate %s --help` for the flags.\n", cmd);
  return election::kExitUsage;
}

std::string election_name_error(const std::string& name) {
  if (name.empty()) return "--election: required";
  const bool printable = std::all_of(name.begin(), name.end(), [](char ch) {
    auto u = static_cast<unsigned char>(ch);
    return u > 0x20 && u < 0x7f;
  });
  if (!printable || name.size() > 256)
    return "--election: must be 1..256 printable ASCII characters without spaces (as serve's authority.election)";
  return {};
}

// Takes an integer flag's value into *out, or adds the error naming its range.
void take_integer(const flags::Item& item, std::int64_t lo, std::int64_t hi, std::int64_t* out,
                  std::vector<std::string>& errors) {
  if (!flags::parse_int(item.value, lo, hi, out))
    errors.push_back(item.name + ": must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                     " (got \"" + item.value + "\")");
}

const char* const kEtcdSecurityUsage =
    "etcd over TLS and etcd users (issue 27, docs/tls.md; etcdctl's names):\n"
    "  --cacert PATH            CA file (PEM) the https:// etcd endpoints must verify against\n"
    "                           (default: the system store; the host name or IP is always checked)\n"
    "  --cert PATH, --key PATH  client certificate and key for an etcd with --client-cert-auth\n"
    "  --user NAME              etcd user (etcd auth): a token from /v3/auth/authenticate, renewed\n"
    "                           when it expires\n"
    "  --password-file PATH     the user's password (mode 0600/0400, one line); else the environment\n"
    "                           variable FENCEGATE_ETCD_PASSWORD. Never a flag value (--password is refused)\n";

bool take_etcd_security_flag(const std::string& name, const std::string& value, CoordinatorFlags* f,
                             std::vector<std::string>& errors) {
  if (name == "--cacert") f->cacert = value;
  else if (name == "--cert") f->cert = value;
  else if (name == "--key") f->key = value;
  else if (name == "--user") f->user = value;
  else if (name == "--password-file") f->password_file = value;
  else if (name == "--password")
    errors.push_back(
        "--password: a password is never taken from a flag value (it would show in ps and shell history); use "
        "--password-file PATH or the environment variable FENCEGATE_ETCD_PASSWORD");
  else return false;
  return true;
}

// Issue 27: etcd's TLS files and user into out->etcd_security.
std::string etcd_security_from_flags(const CoordinatorFlags& flags, election::Coordinator* out) {
  const bool tls = !flags.cacert.empty() || !flags.cert.empty() || !flags.key.empty();
  if (!tls && flags.user.empty() && flags.password_file.empty()) return {};
  if (out->kind != election::Coordinator::Kind::etcd)
    return "--cacert, --cert, --key, --user and --password-file: only for an etcd coordinator";
  election::EtcdSecurity& s = out->etcd_security;
  s.cacert = flags.cacert;
  s.cert = flags.cert;
  s.key = flags.key;
  s.user = flags.user;
  // etcd://host:port with TLS files means https (an --etcd list says its scheme itself).
  if (tls && flags.etcd.empty())
    for (auto& e : out->endpoints)
      if (e.rfind("http://", 0) == 0) e = "https://" + e.substr(7);
  if (!flags.password_file.empty() && flags.user.empty()) return "--user: required with --password-file";
  if (!flags.user.empty()) {
    if (flags.user.size() > 256 || flags.user.find_first_of("\r\n") != std::string::npos)
      return "--user: at most 256 bytes on one line";
    if (!flags.password_file.empty()) {
      if (auto e = election::read_etcd_password(flags.password_file, &s.password); !e.empty())
        return "--password-file: " + e;
    } else if (const char* env = std::getenv("FENCEGATE_ETCD_PASSWORD"); env && *env) {
      s.password = env;
    } else {
      return "--password-file: required with --user (or set FENCEGATE_ETCD_PASSWORD)";
    }
  }
  return election::check_etcd_security(s, out->endpoints, "--");
}

std::string coordinator_from_flags(const CoordinatorFlags& flags, election::Coordinator* out) {
  const auto& coordinator = flags.coordinator;
  const auto& etcd = flags.etcd;
  const auto& zk_auth = flags.zk_auth;
  const auto& redis_auth = flags.redis_auth;
  std::string why;
  if (!coordinator.empty() && !etcd.empty()) return "--coordinator and --etcd: give one of them";
  if (coordinator.empty() && etcd.empty())
    return "--coordinator: required (etcd://host:port, zk://host:port/chroot, redis://host:port/db; or --etcd: "
           "required (e.g. http://127.0.0.1:2379))";
  if (!etcd.empty()) {
    out->kind = election::Coordinator::Kind::etcd;
    out->text = etcd;
    if (!election::parse_endpoint_list(etcd, &out->endpoints, &why)) return "--etcd: " + why;
  } else if (!election::parse_coordinator(coordinator, out, &why)) {
    return "--coordinator: " + why;
  }
  using Kind = election::Coordinator::Kind;
  if (!zk_auth.empty()) {
    if (out->kind != Kind::zookeeper) return "--zk-auth: only for a zk:// coordinator";
    if (auto e = election::read_coordinator_auth(zk_auth, out); !e.empty()) return "--zk-auth: " + e;
  }
  if (!redis_auth.empty()) {
    if (out->kind != Kind::redis) return "--redis-auth: only for a redis:// coordinator";
    if (auto e = election::read_coordinator_auth(redis_auth, out); !e.empty()) return "--redis-auth: " + e;
  }
  return etcd_security_from_flags(flags, out);  // issue 27
}

int run_elect(const std::vector<std::string>& args) {
  election::note_inherited_fds();
  election::ElectOptions f;
  std::vector<std::string> errors;
  std::string level = "info", token_file;
  CoordinatorFlags cf;  // --etcd, --coordinator, auth and (issue 27) TLS flags
  std::string &etcd = cf.etcd, &coordinator = cf.coordinator, &zk_auth = cf.zk_auth, &redis_auth = cf.redis_auth;
  bool id_given = false;
  flags::Rules rules;
  rules.dashdash_ends_flags = true;
  const flags::Parsed parsed = flags::parse(args, kElectFlags, rules);
  for (const flags::Item& item : parsed.items) {
    switch (item.kind) {
      case flags::Kind::help: std::printf(kElectUsage, kEtcdSecurityUsage); return 0;
      case flags::Kind::unknown_flag:
      case flags::Kind::value_on_boolean:  // "--recampaign=1" names no flag
        errors.push_back("unknown flag \"" + item.arg + "\"");
        continue;
      case flags::Kind::not_a_flag:  // never "--" here: that ends the flags
        errors.push_back("unknown flag \"" + item.arg + "\" (put the command after --)");
        continue;
      case flags::Kind::missing_value: errors.push_back(item.name + ": needs a value"); break;
      case flags::Kind::flag: break;
    }
    // A missing value leaves a text setting as it was (as an absent flag would), while the
    // checked ones report the empty value too (the messages as they always were).
    const bool missing = item.kind == flags::Kind::missing_value;
    const std::string& name = item.name;
    auto take_text = [&](std::string& to) {
      if (!missing) to = item.value;
    };
    if (!missing && take_etcd_security_flag(name, item.value, &cf, errors)) {
      // issue 27: etcd TLS and user
    } else if (name == "--fence-cacert") {
      take_text(f.fence_cacert);
    } else if (name == "--recampaign") {
      f.recampaign = true;
    } else if (name == "--etcd") {
      take_text(etcd);
    } else if (name == "--coordinator") {
      take_text(coordinator);
    } else if (name == "--zk-auth") {
      take_text(zk_auth);
    } else if (name == "--redis-auth") {
      take_text(redis_auth);
    } else if (name == "--election") {
      take_text(f.election);
    } else if (name == "--id") {
      take_text(f.id);
      id_given = true;
    } else if (name == "--ttl") {
      take_integer(item, 2, 3600, &f.ttl, errors);
    } else if (name == "--fence-token-file") {
      take_text(token_file);
    } else if (name == "--fence-timeout-ms") {
      take_integer(item, 100, 3600000, &f.fence_timeout_ms, errors);
    } else if (name == "--catch-up") {
      take_text(f.catch_up);
    } else if (name == "--catch-up-timeout-ms") {
      take_integer(item, 100, 86400000, &f.catch_up_timeout_ms, errors);
    } else if (name == "--status-listen") {
      take_text(f.status_listen);
      std::string host;
      std::uint16_t port = 0;
      if (!missing)
        if (auto e = election::parse_listen_addr(f.status_listen, &host, &port); !e.empty())
          errors.push_back("--status-listen: " + e);
    } else if (name == "--grace-ms") {
      take_integer(item, 0, 3600000, &f.grace_ms, errors);
    } else if (name == "--log-level") {
      take_text(level);
    } else if (name == "--fence") {
      election::HttpUrl u;
      std::string why;
      if (!election::parse_http_url(item.value, &u, &why, /*allow_https=*/true)) {
        errors.push_back("--fence: " + why);
      } else {
        f.fences.push_back(u);
        f.fence_urls.push_back(item.value);
      }
    }
  }
  f.command = parsed.rest;
  std::string why;
  if (std::string e = coordinator_from_flags(cf, &f.coordinator); !e.empty()) errors.push_back(e);
  if (std::string e = election_name_error(f.election); !e.empty()) errors.push_back(e);
  if (id_given && f.id.empty()) errors.push_back("--id: must not be empty (leave it out for hostname:pid)");
  if (f.id.size() > 256)  // the sidecars would refuse it as Fencing-Leader (max_leader_bytes) after winning
    errors.push_back("--id: at most 256 bytes (got " + std::to_string(f.id.size()) + ")");
  else if (std::any_of(f.id.begin(), f.id.end(),
                       [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    errors.push_back("--id: must not contain control characters (the sidecars refuse them as a leader identity)");
  if (!parsed.dashdash || f.command.empty()) errors.push_back("a command is required after --");
  if (log::Level lvl; log::parse_level(level, &lvl)) log::set_level(lvl);
  else errors.push_back("--log-level: must be one of debug, info, warn, error (got \"" + level + "\")");
  if (!token_file.empty()) {
    if (auto e = election::load_token_file(token_file, &f.fence_token); !e.empty())
      errors.push_back("--fence-token-file: " + e);
    f.fence_token_file = token_file;
  }
  if (!f.fence_cacert.empty()) {  // issue 27: checked now, exit 2 naming the flag
    std::string why;
    if (!election::make_tls_client(election::TlsFiles{f.fence_cacert, "", ""}, &why))
      errors.push_back("--fence-" + why);
  }
  if (!errors.empty()) return usage_error("elect", errors);
  if (f.id.empty()) f.id = election::default_id();
  return election::run_elect(std::move(f));
}

}  // namespace fencegate::cmd
