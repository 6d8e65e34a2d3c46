// `fencegate leader`: prints an election's current leader and its fencing token as one JSON
// object (the lookup itself is election_client/leader_lookup.h).
//
// fencegate leader --etcd URLS --election NAME [--timeout-ms MS]
//   Prints {"election": NAME, "leader": ID, "token": N}. Exit codes: 0 printed, 1 etcd
//   unreachable or error, 2 bad flags, 3 the election has no leader.
#include <array>
#include <memory>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cmd/cmd.h"
#include "common/flags.h"
#include "election_client/backend.h"
#include "election_client/elector.h"

namespace fencegate::cmd {

namespace {

using json = nlohmann::json;

constexpr const char* kLeaderUsage =
    "Usage: fencegate leader (--coordinator URL | --etcd URLS) --election NAME\n"
    "\n"
    "Prints the current leader of the election as one JSON object:\n"
    "  {\"election\": NAME, \"leader\": ID, \"token\": N}\n"
    "where ID is the value the leader campaigned with and N its fencing token (etcd: the leader\n"
    "key's creation revision; ZooKeeper: the leader node's czxid; Redis: the lock's generation).\n"
    "\n"
    "Flags:\n"
    "  --coordinator URL  etcd://host:port[,..], zk://host:port[,..][/chroot] or redis://host:port[/db]\n"
    "  --etcd URLS        etcd client URLs, comma-separated (http://host:port): as etcd://\n"
    "  --zk-auth FILE     ZooKeeper digest auth, FILE holds user:password (mode 0600/0400)\n"
    "  --redis-auth FILE  Redis AUTH, FILE holds password or user:password (mode 0600/0400)\n"
    "  --election NAME    election name, required\n"
    "  --timeout-ms MS    how long to look for the leader, shared among the endpoints\n"
    "                     (one that hangs does not use it all; default 5000)\n"
    "%s"
    "\n"
    "Exit codes: 0 printed; 1 coordinator unreachable or error; 2 bad flags; 3 no leader.\n";

constexpr std::array kLeaderFlags = {flags::Flag{"--etcd"}, flags::Flag{"--coordinator"}, flags::Flag{"--zk-auth"},
                                     flags::Flag{"--redis-auth"}, flags::Flag{"--election"},
                                     flags::Flag{"--timeout-ms"},
                                     // issue 27: etcd over TLS and etcd users
                                     flags::Flag{"--cacert"}, flags::Flag{"--cert"}, flags::Flag{"--key"},
                                     flags::Flag{"--user"}, flags::Flag{"--password-file"}, flags::Flag{"--password"}};

}  // namespace

int run_leader(const std::vector<std::string>& args) {
  std::vector<std::string> errors;
  CoordinatorFlags cf;
  std::string election;
  std::int64_t timeout_ms = 5000;
  for (const flags::Item& item : flags::parse(args, kLeaderFlags).items) {
    switch (item.kind) {
      case flags::Kind::help: std::printf(kLeaderUsage, kEtcdSecurityUsage); return 0;
      case flags::Kind::unknown_flag:
      case flags::Kind::value_on_boolean:
      case flags::Kind::not_a_flag: errors.push_back("unknown flag \"" + item.arg + "\""); continue;
      case flags::Kind::missing_value:
        errors.push_back(item.name + ": needs a value");
        // A text setting stays as it was; the timeout reports the empty value too.
        if (item.name != "--timeout-ms") continue;
        break;
      case flags::Kind::flag: break;
    }
    if (take_etcd_security_flag(item.name, item.value, &cf, errors)) {
      // issue 27
    } else if (item.name == "--etcd") {
      cf.etcd = item.value;
    } else if (item.name == "--coordinator") {
      cf.coordinator = item.value;
    } else if (item.name == "--zk-auth") {
      cf.zk_auth = item.value;
    } else if (item.name == "--redis-auth") {
      cf.redis_auth = item.value;
    } else if (item.name == "--election") {
      election = item.value;
    } else if (!flags::parse_int(item.value, 1, 600000, &timeout_ms)) {
      errors.push_back("--timeout-ms: must be an integer in 1..600000 (got \"" + item.value + "\")");
    }
  }
  election::Coordinator coordinator;
  if (std::string e = coordinator_from_flags(cf, &coordinator); !e.empty()) errors.push_back(e);
  if (std::string e = election_name_error(election); !e.empty()) errors.push_back(e);
  if (!errors.empty()) return usage_error("leader", errors);
  std::signal(SIGPIPE, SIG_IGN);
  std::string why;
  std::unique_ptr<election::Backend> backend = election::make_backend(coordinator, &why);
  if (!backend) return usage_error("leader", {"--coordinator: " + why});
  election::LeaderInfo li;
  election::Status st = backend->leader(election, std::chrono::milliseconds(timeout_ms), &li);
  if (st.is_no_leader()) {
    std::fprintf(stderr, "fencegate leader: election \"%s\" has no leader\n", election.c_str());
    return election::kExitNoLeader;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "fencegate leader: %s\n", st.to_string().c_str());
    return election::kExitUnavailable;
  }
  json out = {{"election", election}, {"leader", li.id}, {"token", li.token}};
  std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace fencegate::cmd
