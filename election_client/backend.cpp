// Coordinator URLs and the choice of backend (see backend.h).
#include "election_client/backend.h"

#include <hiredis/hiredis.h>

#include <cctype>
#include <string_view>

#include "election_client/backends.h"
#include "common/file_checks.h"
#include "election_client/etcd_client.h"

namespace fencegate::election {

namespace {

// "host[:port]" -> "host:port" (default port if absent). Returns "" with *why on error.
std::string host_port(std::string_view hp, int default_port, std::string* why) {
  if (hp.empty()) {
    *why = "an empty host";
    return {};
  }
  std::string host(hp), port = std::to_string(default_port);
  if (auto colon = hp.rfind(':'); colon != std::string_view::npos) {
    host = std::string(hp.substr(0, colon));
    port = std::string(hp.substr(colon + 1));
    long v = 0;
    bool digits = !port.empty() && port.size() <= 5;
    for (char ch : port) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
    if (digits) v = std::stol(port);
    if (!digits || v < 1 || v > 65535) {
      *why = "bad port \"" + port + "\" in \"" + std::string(hp) + "\"";
      return {};
    }
  }
  if (host.empty()) {
    *why = "an empty host in \"" + std::string(hp) + "\"";
    return {};
  }
  for (char ch : host) {
    auto u = static_cast<unsigned char>(ch);
    if (!(std::isalnum(u) || ch == '.' || ch == '-' || ch == '_')) {
      *why = "bad host \"" + host + "\"";
      return {};
    }
  }
  return host + ":" + port;
}

bool host_list(std::string_view list, int default_port, std::vector<std::string>* out, std::string* why) {
  out->clear();
  std::size_t at = 0;
  for (;;) {
    std::size_t comma = list.find(',', at);
    std::string one = host_port(list.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at),
                                default_port, why);
    if (one.empty()) return false;
    out->push_back(one);
    if (comma == std::string_view::npos) return true;
    at = comma + 1;
  }
}

}  // namespace

std::string rediss_refusal() {
  // TLS came to hiredis in 1.0 (hiredis_ssl); Debian bookworm ships 0.14, which has none. Refused
  // rather than sent in clear text to a server that expects TLS.
  return "rediss:// needs hiredis with TLS (1.0+); this build has " + std::to_string(HIREDIS_MAJOR) + "." +
         std::to_string(HIREDIS_MINOR);
}

const char* kind_name(Coordinator::Kind k) {
  switch (k) {
    case Coordinator::Kind::etcd: return "etcd";
    case Coordinator::Kind::zookeeper: return "zookeeper";
    case Coordinator::Kind::redis: return "redis";
  }
  return "?";
}

bool parse_coordinator(const std::string& url, Coordinator* out, std::string* why) {
  Coordinator c;
  c.text = url;
  std::string_view u(url);
  auto scheme_end = u.find("://");
  if (scheme_end == std::string_view::npos) {
    *why =
        "must be etcd://host:port[,host:port], zk://host:port[,host:port][/chroot] or redis://host:port[/db] (got \"" +
        url + "\")";
    return false;
  }
  const std::string_view scheme = u.substr(0, scheme_end), rest = u.substr(scheme_end + 3);
  if (scheme == "etcd") {
    c.kind = Coordinator::Kind::etcd;
    std::vector<std::string> hosts;
    if (rest.find('/') != std::string_view::npos) {
      *why = "an etcd:// URL has no path (got \"" + url + "\")";
      return false;
    }
    if (!host_list(rest, 2379, &hosts, why)) return false;
    std::string csv;
    for (const auto& h : hosts) csv += (csv.empty() ? "http://" : ",http://") + h;
    if (!parse_endpoint_list(csv, &c.endpoints, why)) return false;
  } else if (scheme == "zk") {
    c.kind = Coordinator::Kind::zookeeper;
    const auto slash = rest.find('/');
    if (!host_list(rest.substr(0, slash), 2181, &c.endpoints, why)) return false;
    if (slash != std::string_view::npos) {
      c.chroot = std::string(rest.substr(slash));
      while (c.chroot.size() > 1 && c.chroot.back() == '/') c.chroot.pop_back();
      if (c.chroot == "/") c.chroot.clear();
      if (c.chroot.find("//") != std::string::npos) {
        *why = "the chroot \"" + c.chroot + "\" has an empty path element";
        return false;
      }
    }
  } else if (scheme == "rediss") {
    *why = rediss_refusal();
    return false;
  } else if (scheme == "redis") {
    c.kind = Coordinator::Kind::redis;
    const auto slash = rest.find('/');
    if (!host_list(rest.substr(0, slash), 6379, &c.endpoints, why)) return false;
    if (c.endpoints.size() != 1) {
      *why = "redis:// names one server (got \"" + url + "\")";
      return false;
    }
    if (slash != std::string_view::npos && slash + 1 < rest.size()) {
      const std::string db(rest.substr(slash + 1));
      bool digits = db.size() <= 5;
      for (char ch : db) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
      if (!digits) {
        *why = "the database \"" + db + "\" is not a number";
        return false;
      }
      c.db = std::stoi(db);
    }
  } else {
    *why = "unknown scheme \"" + std::string(scheme) + "\" (etcd://, zk:// or redis://)";
    return false;
  }
  *out = std::move(c);
  return true;
}

std::string read_coordinator_auth(const std::string& path, Coordinator* c) {
  std::string t;
  if (auto e = files::read_secret_trimmed(path, &t); !e.empty()) return e;
  if (t.empty()) return path + " is empty";
  for (char ch : t)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
      return path + " must hold one line without control characters";
  if (c->kind == Coordinator::Kind::zookeeper) {
    const auto colon = t.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == t.size())
      return path + " must hold user:password (ZooKeeper digest auth)";
  }
  if (c->kind == Coordinator::Kind::etcd) return "etcd takes no auth file";
  c->auth = std::move(t);
  return {};
}

Status no_leader_status() { return Status::Etcd(5, "election has no leader"); }

std::unique_ptr<Backend> make_backend(const Coordinator& c, std::string* why) {
  switch (c.kind) {
    case Coordinator::Kind::etcd: return make_etcd_backend(c);
    case Coordinator::Kind::zookeeper: return make_zk_backend(c, why);
    case Coordinator::Kind::redis: return make_redis_backend(c, why);
  }
  *why = "unknown coordinator";
  return nullptr;
}

}  // namespace fencegate::election
