// `fencegate keys` (issue 30, docs/idempotency.md): lists the idempotency keys (operation IDs) a
// fencegate database holds, or one key, as a table or JSON lines. Reads through
// Store::open_readonly (no lock, no writes), so it works while the sidecar runs. Clearing a key
// is the admin API's DELETE /v1/resources/{id}/idempotency/{key} (the running sidecar's store).
//
// Exit codes: 0 success (also when nothing matches), 1 the database cannot be opened or read, 3
// --key given and no such key, 2 bad arguments.
#include <cstdio>
#include <string>
#include <vector>

#include "cmd/cmd.h"
#include "common/flags.h"
#include "fence_store/store.h"
#include "proxy/admin_idempotency.h"
#include "proxy/timefmt.h"

namespace fencegate::cmd {
namespace {

constexpr int kExitOk = 0, kExitRuntime = 1, kExitUsage = 2, kExitNoKey = 3;

constexpr const char* kUsage =
    "Usage: fencegate keys --db PATH [--resource R] [--key K] [--client ID] [--json]\n"
    "\n"
    "Lists the idempotency keys (operation IDs) of a fencegate database: per key its state\n"
    "(in_flight, completed, unknown), the recorded status, when it was made and expires, and the\n"
    "generation of the write that made it. Opens the database read-only, so it works while the\n"
    "sidecar runs. To clear a key (after checking what the upstream did with an \"unknown\" one),\n"
    "use the admin API: DELETE /v1/resources/{id}/idempotency/{key}.\n"
    "\n"
    "Flags (\"--flag value\" or \"--flag=value\"):\n"
    "  --db PATH          the database file (required)\n"
    "  --resource R       only this resource (required with --key)\n"
    "  --key K            only this key (as the client sent it, unquoted); exit 3 if absent\n"
    "  --client ID        with --key: the client (TLS identity or address) of a \"scope\": \"client\" route\n"
    "  --json             one JSON object per line: key, state, status, created_at, expires_at,\n"
    "                     generation, resource (and client, body_kept, fingerprint)\n"
    "\n"
    "Exit codes: 0 success, 1 cannot open or read the database, 2 bad arguments, 3 no such key.\n";

constexpr flags::Flag kFlags[] = {
    flags::Flag{"--db"},
    flags::Flag{"--resource"},
    flags::Flag{"--key"},
    flags::Flag{"--client"},
    flags::Flag{"--json", flags::Arity::none},
};

int usage(const std::string& why) {
  std::fprintf(stderr, "fencegate keys: %s\n(see fencegate keys --help)\n", why.c_str());
  return kExitUsage;
}

void print(const store::KeyRecord& r, bool as_json) {
  if (as_json) {
    std::printf("%s\n", proxy::key_json(r).c_str());
    return;
  }
  const std::string status = r.status ? std::to_string(r.status) : "-";
  std::printf("%-20s %-40s %-10s %-6s %-24s %-24s %lld\n", r.resource.c_str(), r.key.c_str(),
              std::string(store::to_string(r.state)).c_str(), status.c_str(),
              proxy::format_rfc3339_ms(r.created_ms).c_str(), proxy::format_rfc3339_ms(r.expires_ms).c_str(),
              static_cast<long long>(r.generation));
}

}  // namespace

int run_keys(const std::vector<std::string>& args) {
  std::string db, resource, key, client;
  bool as_json = false, have_key = false;
  for (const flags::Item& item : flags::parse(args, kFlags).items) {
    switch (item.kind) {
      case flags::Kind::help: std::fputs(kUsage, stdout); return kExitOk;
      case flags::Kind::not_a_flag: return usage("unexpected argument " + item.arg);
      case flags::Kind::unknown_flag: return usage("unknown flag " + item.name);
      case flags::Kind::value_on_boolean: return usage(item.name + " takes no value");
      case flags::Kind::missing_value: return usage(item.name + " needs a value");
      case flags::Kind::flag: break;
    }
    if (item.name == "--db") db = item.value;
    else if (item.name == "--resource") resource = item.value;
    else if (item.name == "--key") key = item.value, have_key = true;
    else if (item.name == "--client") client = item.value;
    else if (item.name == "--json") as_json = true;
  }
  if (db.empty()) return usage("--db is required");
  if (have_key && resource.empty()) return usage("--key needs --resource (keys are kept per resource)");
  if (!client.empty() && !have_key) return usage("--client goes with --key");
  std::string err;
  auto st = store::Store::open_readonly(db, &err);
  if (!st) {
    std::fprintf(stderr, "fencegate keys: %s\n", err.c_str());
    return kExitRuntime;
  }
  store::Status s = store::Status::OK();
  if (have_key) {
    store::KeyRecord r;
    const bool found = st->key_get(resource, client, key, &r, &s);
    if (!s.ok()) {
      std::fprintf(stderr, "fencegate keys: %s\n", s.message().c_str());
      return kExitRuntime;
    }
    if (!found) {
      std::fprintf(stderr, "fencegate keys: resource %s holds no key %s\n", resource.c_str(), key.c_str());
      return kExitNoKey;
    }
    print(r, as_json);
    return kExitOk;
  }
  if (!as_json)
    std::printf("%-20s %-40s %-10s %-6s %-24s %-24s %s\n", "RESOURCE", "KEY", "STATE", "STATUS", "CREATED", "EXPIRES",
                "GENERATION");
  std::string after_resource, after_key;
  for (;;) {
    auto page = st->key_list(resource, after_resource, after_key, 1000, &s);
    if (!s.ok()) {
      std::fprintf(stderr, "fencegate keys: %s\n", s.message().c_str());
      return kExitRuntime;
    }
    for (const auto& r : page) print(r, as_json);
    if (page.size() < 1000) break;
    after_resource = page.back().resource;
    after_key = page.back().key;
  }
  return kExitOk;
}

}  // namespace fencegate::cmd
