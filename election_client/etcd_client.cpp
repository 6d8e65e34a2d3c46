#include "election_client/etcd_client.h"

#include <cstdlib>
#include <stdexcept>

#include "common/file_checks.h"
#include "election_client/etcd_json.h"
#include "election_client/http_conn.h"

namespace fencegate::election {

using detail::i64;
using detail::json;
using detail::str64;

bool parse_endpoint_list(std::string_view csv, std::vector<std::string>* out, std::string* err) {
  std::vector<std::string> eps;
  std::size_t start = 0;
  while (start <= csv.size()) {
    std::size_t comma = csv.find(',', start);
    std::string_view one = csv.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
    while (!one.empty() && one.back() == ' ') one.remove_suffix(1);
    if (!one.empty()) {
      HttpUrl u;
      std::string why;
      if (!parse_http_url(one, &u, &why, /*allow_https=*/true)) {
        if (err) *err = "etcd endpoint: " + why;
        return false;
      }
      if (!u.path.empty()) {
        if (err) *err = "etcd endpoint must not have a path (got \"" + std::string(one) + "\")";
        return false;
      }
      eps.push_back(u.origin());
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (eps.empty()) {
    if (err) *err = "no etcd endpoint given";
    return false;
  }
  *out = std::move(eps);
  return true;
}

std::string election_prefix(std::string_view name) { return std::string(name) + "/"; }

// --- Issue 27: TLS and user authentication -------------------------------------------------------

namespace {

bool any_https(const std::vector<std::string>& endpoints) {
  for (const auto& e : endpoints)
    if (e.rfind("https://", 0) == 0) return true;
  return false;
}

TlsFiles tls_files(const EtcdSecurity& s) { return TlsFiles{s.cacert, s.cert, s.key}; }

// True iff etcd's error says the token is missing, expired or stale: authenticate again.
bool token_rejected(const Status& st) {
  if (!st.is_etcd_error()) return false;
  const std::string& m = st.message();
  return st.code() == 16 || m.find("invalid auth token") != std::string::npos ||
         m.find("user name is empty") != std::string::npos ||
         m.find("revision of auth store is old") != std::string::npos;
}

// The error of a non-200 etcd answer.
Status etcd_error(const HttpResponse& r) {
  json e = json::parse(r.body, nullptr, false);
  if (e.is_object() && (e.contains("message") || e.contains("error"))) {
    std::string msg = e.value("message", std::string());
    if (msg.empty() && e["error"].is_string()) msg = e["error"].get<std::string>();
    return Status::Etcd(static_cast<int>(i64(e, "code")), msg);
  }
  return Status::Http(r.status, r.body.substr(0, 200));
}

// POST /v3/auth/authenticate on `conn`.
Status authenticate_on(HttpConnection& conn, const ClientOptions& o, std::string* token,
                       const std::atomic<bool>* cancel) {
  token->clear();
  if (o.security.user.empty()) return Status::OK();
  HttpResponse r;
  const std::string body =
      json{{"name", o.security.user}, {"password", o.security.password}}.dump(-1, ' ', false,
                                                                              json::error_handler_t::replace);
  Status st = conn.post("/v3/auth/authenticate", body, o.request_timeout, &r, cancel);
  if (!st.ok()) return st;
  if (r.status != 200) {
    Status e = etcd_error(r);
    const std::string m = e.is_etcd_error() ? e.message() : e.to_string();
    if (m.find("authentication is not enabled") != std::string::npos) return Status::OK();  // no token needed
    return Status::Etcd(e.code(), "etcd authentication failed for user \"" + o.security.user + "\": " + m +
                                      " (check --user and the password file / FENCEGATE_ETCD_PASSWORD)");
  }
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("token") || !j["token"].is_string() || j["token"].get<std::string>().empty())
    return Status::Protocol("etcd authenticate answered without a token: " + r.body.substr(0, 200));
  *token = j["token"].get<std::string>();
  return Status::OK();
}

}  // namespace

std::string check_etcd_security(const EtcdSecurity& s, const std::vector<std::string>& endpoints,
                                const std::string& prefix) {
  const TlsFiles f = tls_files(s);
  if (f.empty()) return {};
  if (!any_https(endpoints)) {
    const char* which = !s.cacert.empty() ? "cacert" : !s.cert.empty() ? "cert" : "key";
    return prefix + which + ": only for https:// etcd endpoints (the endpoints are http://)";
  }
  std::string why;
  if (!make_tls_client(f, &why)) return prefix + why;
  return {};
}

std::string complete_etcd_security(EtcdSecurity* s, const std::string& password_file,
                                   const std::vector<std::string>& endpoints, const std::string& prefix) {
  if (!s->user.empty()) {
    if (!password_file.empty()) {
      if (auto e = read_etcd_password(password_file, &s->password); !e.empty()) return prefix + "password_file: " + e;
    } else if (const char* env = std::getenv("FENCEGATE_ETCD_PASSWORD")) {
      s->password = env;
    }
  }
  return check_etcd_security(*s, endpoints, prefix);
}

std::string read_etcd_password(const std::string& path, std::string* out) {
  std::string t;
  if (auto e = files::read_secret_trimmed(path, &t); !e.empty()) return e;
  if (t.empty()) return path + " is empty";
  if (t.find('\n') != std::string::npos) return path + " must hold one line (the password)";
  *out = std::move(t);
  return {};
}

std::shared_ptr<const TlsClient> make_etcd_tls(const ClientOptions& o) {
  if (!any_https(o.endpoints)) return nullptr;
  std::string why;
  auto t = make_tls_client(tls_files(o.security), &why);
  if (!t) throw std::invalid_argument("etcd TLS: " + why);
  return t;
}

Status authenticate(const ClientOptions& o, std::string* token, const std::atomic<bool>* cancel) {
  token->clear();
  if (o.security.user.empty()) return Status::OK();
  HttpConnection::Options ho;
  for (const auto& e : o.endpoints) {
    HttpUrl u;
    if (parse_http_url(e, &u, nullptr, true)) ho.endpoints.push_back(u);
  }
  ho.connect_timeout = o.connect_timeout;
  ho.tls = make_etcd_tls(o);
  HttpConnection conn(ho);
  return authenticate_on(conn, o, token, cancel);
}

Status Client::token(HttpConnection& conn, bool renew, std::string* out, const std::atomic<bool>* cancel) {
  out->clear();
  if (options_.security.user.empty()) return Status::OK();
  {
    std::lock_guard lk(mu_);
    if (renew) token_.clear();
    if (!token_.empty()) {
      *out = token_;
      return Status::OK();
    }
  }
  Status st = authenticate_on(conn, options_, out, cancel);
  if (st.ok()) {
    std::lock_guard lk(mu_);
    token_ = *out;
  }
  return st;
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw std::invalid_argument("election::Client: no endpoints");
  for (const auto& e : options_.endpoints) {
    HttpUrl u;
    std::string why;
    if (!parse_http_url(e, &u, &why, /*allow_https=*/true)) throw std::invalid_argument("election::Client: " + why);
  }
  tls_ = make_etcd_tls(options_);
}

Client::~Client() = default;

std::unique_ptr<HttpConnection> Client::take() {
  {
    std::lock_guard lk(mu_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  HttpConnection::Options o;
  for (const auto& e : options_.endpoints) {
    HttpUrl u;
    parse_http_url(e, &u, nullptr, /*allow_https=*/true);
    o.endpoints.push_back(u);
  }
  o.connect_timeout = options_.connect_timeout;
  o.tls = tls_;
  return std::make_unique<HttpConnection>(std::move(o));
}

void Client::give_back(std::unique_ptr<HttpConnection> c) {
  std::lock_guard lk(mu_);
  if (idle_.size() < 4) idle_.push_back(std::move(c));
}

Status Client::call(std::string_view path, const std::string& body, std::string* out, std::chrono::milliseconds timeout,
                    const std::atomic<bool>* cancel) {
  return call_shared(path, body, out, timeout, cancel, /*share=*/true);
}

Status Client::call_shared(std::string_view path, const std::string& body, std::string* out,
                           std::chrono::milliseconds timeout, const std::atomic<bool>* cancel, bool share) {
  // The time is shared among the endpoints: a call that times out on a hung member (it accepts,
  // then never answers) ends there, and the connection moves on to the next endpoint. Each
  // attempt but the last gets an equal share of what is left, so a hung first endpoint cannot
  // use it all (fencegate elect exited 1 with --etcd hung,good).
  auto conn = take();
  HttpResponse r;
  HttpHeaders headers;  // issue 27: the auth token, with a user
  auto attempts = [&](std::string_view p, std::string_view b, std::chrono::milliseconds t) {
    const std::size_t n = options_.endpoints.size();
    const auto deadline = std::chrono::steady_clock::now() + t;
    Status st = Status::Unavailable("no etcd endpoint answered within " + std::to_string(t.count()) + " ms");
    for (std::size_t tried = 0; tried < n; ++tried) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::milliseconds(0)) break;
      auto per = left;
      if (tried + 1 < n)
        per = std::max(left / static_cast<long>(n - tried), std::min(std::chrono::milliseconds(250), left));
      st = conn->post(p, b, per, &r, cancel, headers);
      if (!st.is_unavailable()) break;
    }
    return st;
  };
  auto once = [&](bool renew) {
    if (!options_.security.user.empty()) {
      std::string tok;
      if (Status ts = token(*conn, renew, &tok, cancel); !ts.ok()) return ts;
      headers.clear();
      if (!tok.empty()) headers.push_back({"Authorization", tok});
    }
    Status st = Status::OK();
    if (share) {
      st = attempts(path, body, timeout);
    } else {
      // A long wait (campaign) cannot tell a hung member from a long queue: it goes to an endpoint
      // that has just answered a cheap request (found with the time shared as above).
      st = attempts("/v3/maintenance/status", "{}", options_.request_timeout);
      if (st.ok() && r.status != 200) return etcd_error(r);
      if (st.ok()) st = conn->post(path, body, timeout, &r, cancel, headers);
    }
    if (st.ok() && r.status != 200) return etcd_error(r);
    return st;
  };
  Status st = once(false);
  // Issue 27: etcd's simple tokens expire (5 minutes by default) and a restarted member forgets
  // them: authenticate again once and repeat the call.
  if (!options_.security.user.empty() && token_rejected(st)) st = once(true);
  give_back(std::move(conn));
  if (!st.ok()) {
    if (options_.security.user.empty() && st.is_etcd_error() &&
        st.message().find("user name is empty") != std::string::npos)
      return Status::Etcd(st.code(), st.message() +
                                         " (etcd has authentication enabled: give --user and --password-file, or "
                                         "user and password_file)");
    return st;
  }
  *out = std::move(r.body);
  return Status::OK();
}

namespace {
// Parses a 200 body; Protocol error if it is not a JSON object.
Status parse_object(const std::string& text, json* out) {
  *out = json::parse(text, nullptr, false);
  if (out->is_discarded() || !out->is_object())
    return Status::Protocol("etcd answered non-JSON: " + text.substr(0, 200));
  return Status::OK();
}
}  // namespace

Status Client::grant(std::int64_t ttl_seconds, LeaseGrant* out, std::chrono::milliseconds timeout) {
  std::string text;
  Status st = call("/v3/lease/grant", json{{"TTL", str64(ttl_seconds)}}.dump(), &text,
                   timeout.count() > 0 ? timeout : options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  if (j.contains("error") && j["error"].is_string() && !j["error"].get<std::string>().empty())
    return Status::Etcd(0, j["error"].get<std::string>());
  out->id = i64(j, "ID");
  out->ttl = i64(j, "TTL");
  if (out->id == 0 || out->ttl <= 0) return Status::Protocol("lease grant without ID or TTL: " + text.substr(0, 200));
  return Status::OK();
}

Status Client::keepalive(std::int64_t lease_id, std::int64_t* ttl_out, std::chrono::milliseconds timeout) {
  std::string text;
  Status st = call("/v3/lease/keepalive", json{{"ID", str64(lease_id)}}.dump(), &text, timeout);
  if (!st.ok()) return st;
  // A bidirectional stream through the gateway: one {"result":{...}} (or {"error":{...}}) per line.
  std::size_t nl = text.find('\n');
  json j;
  if (st = parse_object(nl == std::string::npos ? text : text.substr(0, nl), &j); !st.ok()) return st;
  if (j.contains("error")) {
    const json& e = j["error"];
    std::string msg = e.is_object() ? e.value("message", std::string("keepalive error")) : e.dump();
    if (msg.find("lease not found") != std::string::npos) {
      *ttl_out = 0;
      return Status::OK();
    }
    return Status::Etcd(e.is_object() ? static_cast<int>(i64(e, "grpc_code")) : 0, msg);
  }
  const json& r = j.contains("result") ? j["result"] : j;
  *ttl_out = i64(r, "TTL");
  return Status::OK();
}

Status Client::revoke(std::int64_t lease_id, std::chrono::milliseconds timeout) {
  std::string text;
  Status st = call("/v3/lease/revoke", json{{"ID", str64(lease_id)}}.dump(), &text, timeout);
  if (st.is_lease_not_found()) return Status::OK();
  return st;
}

Status Client::time_to_live(std::int64_t lease_id, std::int64_t* ttl_out) {
  std::string text;
  Status st = call("/v3/lease/timetolive", json{{"ID", str64(lease_id)}}.dump(), &text, options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  // An expired lease answers TTL "-1"; a live one its remaining seconds (0 is omitted).
  *ttl_out = j.contains("TTL") ? i64(j, "TTL") : 0;
  return Status::OK();
}

Status Client::campaign(std::string_view name, std::int64_t lease_id, std::string_view value, LeaderKey* out,
                        const std::atomic<bool>* cancel) {
  json req = {{"name", base64_encode(name)}, {"lease", str64(lease_id)}, {"value", base64_encode(value)}};
  std::string text;
  // No deadline of our own: campaigning waits for the predecessors to go. A broken connection
  // ends it (unavailable); the caller campaigns again, and etcd reuses this lease's key.
  Status st = call_shared("/v3/election/campaign", req.dump(), &text, std::chrono::hours(24 * 365), cancel,
                          /*share=*/false);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  auto it = j.find("leader");
  if (it == j.end() || !it->is_object())
    return Status::Protocol("campaign answer without leader: " + text.substr(0, 200));
  out->name = detail::bytes(*it, "name");
  out->key = detail::bytes(*it, "key");
  out->rev = i64(*it, "rev");
  out->lease = i64(*it, "lease");
  if (out->key.empty() || out->rev <= 0)
    return Status::Protocol("campaign answer without key or rev: " + text.substr(0, 200));
  return Status::OK();
}

Status Client::leader(std::string_view name, KeyValue* out, ResponseHeader* header) {
  std::string text;
  Status st = call("/v3/election/leader", json{{"name", base64_encode(name)}}.dump(), &text, options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  if (header) *header = detail::header_from(j);
  auto it = j.find("kv");
  if (it == j.end() || !it->is_object()) return Status::Etcd(2, "election: no leader");
  *out = detail::kv_from(*it);
  return Status::OK();
}

Status Client::resign(const LeaderKey& leader, std::chrono::milliseconds timeout) {
  json lk = {{"name", base64_encode(leader.name)},
             {"key", base64_encode(leader.key)},
             {"rev", str64(leader.rev)},
             {"lease", str64(leader.lease)}};
  std::string text;
  return call("/v3/election/resign", json{{"leader", lk}}.dump(), &text, timeout);
}

Status Client::range(std::string_view key, std::string_view range_end, std::vector<KeyValue>* out,
                     ResponseHeader* header) {
  json req = {{"key", base64_encode(key)}};
  if (!range_end.empty()) req["range_end"] = base64_encode(range_end);
  std::string text;
  Status st = call("/v3/kv/range", req.dump(), &text, options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  if (header) *header = detail::header_from(j);
  out->clear();
  if (auto it = j.find("kvs"); it != j.end() && it->is_array())
    for (const auto& kv : *it) out->push_back(detail::kv_from(kv));
  return Status::OK();
}

Status Client::ranges(const std::vector<std::pair<std::string, std::string>>& reads,
                      std::vector<std::vector<KeyValue>>* out, ResponseHeader* header) {
  json ops = json::array();
  for (const auto& [key, range_end] : reads) {
    json r = {{"key", base64_encode(key)}};
    if (!range_end.empty()) r["range_end"] = base64_encode(range_end);
    ops.push_back({{"request_range", r}});
  }
  std::string text;
  Status st = call("/v3/kv/txn", json{{"success", ops}}.dump(), &text, options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  auto rs = j.find("responses");
  if (rs == j.end() || !rs->is_array() || rs->size() != reads.size())
    return Status::Protocol("etcd txn answered without one response per range: " + text.substr(0, 200));
  if (header) *header = detail::header_from(j);
  out->assign(reads.size(), {});
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const json& r = (*rs)[i];
    auto rr = r.is_object() ? r.find("response_range") : r.end();
    if (!r.is_object() || rr == r.end() || !rr->is_object())
      return Status::Protocol("etcd txn answered a range without response_range: " + text.substr(0, 200));
    if (auto kvs = rr->find("kvs"); kvs != rr->end() && kvs->is_array())
      for (const auto& kv : *kvs) (*out)[i].push_back(detail::kv_from(kv));
  }
  return Status::OK();
}

Status Client::put(std::string_view key, std::string_view value, std::int64_t lease, ResponseHeader* header) {
  json req = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease) req["lease"] = str64(lease);
  std::string text;
  Status st = call("/v3/kv/put", req.dump(), &text, options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  if (header) *header = detail::header_from(j);
  return Status::OK();
}

Status Client::delete_range(std::string_view key, std::string_view range_end, std::int64_t* deleted) {
  json req = {{"key", base64_encode(key)}};
  if (!range_end.empty()) req["range_end"] = base64_encode(range_end);
  std::string text;
  Status st = call("/v3/kv/deleterange", req.dump(), &text, options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  if (deleted) *deleted = i64(j, "deleted");
  return Status::OK();
}

// Fleet (issue 33): compare-and-set transactions on mod_revision.
Status Client::txn(const std::vector<TxnCompare>& compares, const std::vector<TxnOp>& success, bool* succeeded,
                   ResponseHeader* header, std::vector<std::vector<KeyValue>>* ranges) {
  json cmp = json::array();
  for (const TxnCompare& c : compares) {
    if (c.target == TxnCompare::Target::lease)
      cmp.push_back(
          {{"key", base64_encode(c.key)}, {"target", "LEASE"}, {"result", "EQUAL"}, {"lease", str64(c.lease)}});
    else
      cmp.push_back({{"key", base64_encode(c.key)},
                     {"target", "MOD"},
                     {"result", "EQUAL"},
                     {"mod_revision", str64(c.mod_revision)}});
  }
  json ops = json::array();
  std::vector<std::size_t> range_at;  // the positions of the range ops
  for (const TxnOp& o : success) {
    if (o.type == TxnOp::Type::put) {
      json p = {{"key", base64_encode(o.key)}, {"value", base64_encode(o.value)}};
      if (o.lease) p["lease"] = str64(o.lease);
      ops.push_back({{"request_put", p}});
    } else {
      json d = {{"key", base64_encode(o.key)}};
      if (!o.range_end.empty()) d["range_end"] = base64_encode(o.range_end);
      if (o.type == TxnOp::Type::range) range_at.push_back(ops.size());
      ops.push_back({{o.type == TxnOp::Type::range ? "request_range" : "request_delete_range", d}});
    }
  }
  std::string text;
  Status st = call("/v3/kv/txn", json{{"compare", cmp}, {"success", ops}}.dump(), &text, options_.request_timeout);
  if (!st.ok()) return st;
  json j;
  if (st = parse_object(text, &j); !st.ok()) return st;
  if (header) *header = detail::header_from(j);
  *succeeded = j.contains("succeeded") && j["succeeded"].is_boolean() && j["succeeded"].get<bool>();
  if (ranges) ranges->clear();
  if (ranges && *succeeded && !range_at.empty()) {
    auto rs = j.find("responses");
    if (rs == j.end() || !rs->is_array() || rs->size() != ops.size())
      return Status::Protocol("etcd txn answered without one response per op: " + text.substr(0, 200));
    ranges->assign(range_at.size(), {});
    for (std::size_t i = 0; i < range_at.size(); ++i) {
      const json& r = (*rs)[range_at[i]];
      auto rr = r.is_object() ? r.find("response_range") : r.end();
      if (!r.is_object() || rr == r.end() || !rr->is_object())
        return Status::Protocol("etcd txn answered a range without response_range: " + text.substr(0, 200));
      if (auto kvs = rr->find("kvs"); kvs != rr->end() && kvs->is_array())
        for (const auto& kv : *kvs) (*ranges)[i].push_back(detail::kv_from(kv));
    }
  }
  return Status::OK();
}

}  // namespace fencegate::election
