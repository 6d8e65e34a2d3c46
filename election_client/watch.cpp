#include "election_client/watch.h"

#include "election_client/etcd_json.h"
#include "election_client/http_conn.h"

namespace fencegate::election {

using detail::i64;
using detail::json;

const char* Watch::to_string(State s) {
  switch (s) {
    case State::connecting: return "connecting";
    case State::watching: return "watching";
    case State::broken: return "broken";
    case State::compacted: return "compacted";
    case State::stopped: return "stopped";
  }
  return "?";
}

Watch::Watch(Options options, OnBatch on_batch, OnState on_state)
    : options_(std::move(options)), on_batch_(std::move(on_batch)), on_state_(std::move(on_state)) {
  next_revision_ = options_.start_revision;
}

Watch::~Watch() { stop(); }

void Watch::start() {
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Watch::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

bool Watch::on_line(std::string_view line) {
  json j = json::parse(line, nullptr, false);
  if (!j.is_object()) return false;
  if (j.contains("error")) return false;
  const json& r = j.contains("result") ? j["result"] : j;
  const ResponseHeader h = detail::header_from(r);
  if (r.value("created", false)) {
    if (next_revision_.load() == 0) next_revision_ = h.revision + 1;
    if (on_state_) on_state_(State::watching, h.revision, Status::OK());
  }
  if (r.value("canceled", false)) {
    compact_revision_ = i64(r, "compact_revision");
    compacted_ = compact_revision_ > 0;
    return false;
  }
  auto it = r.find("events");
  if (it == r.end() || !it->is_array() || it->empty()) {
    return true;  // created or progress notification
  }
  WatchBatch b;
  b.header = h;
  for (const auto& e : *it) {
    WatchEvent ev;
    ev.type = e.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::del : WatchEvent::Type::put;
    if (e.contains("kv")) ev.kv = detail::kv_from(e["kv"]);
    if (ev.kv.mod_revision >= next_revision_.load()) next_revision_ = ev.kv.mod_revision + 1;
    b.events.push_back(std::move(ev));
  }
  if (on_batch_) on_batch_(b);
  return true;
}

void Watch::loop() {
  HttpConnection::Options ho;
  for (const auto& e : options_.client.endpoints) {
    HttpUrl u;
    if (parse_http_url(e, &u, nullptr, /*allow_https=*/true)) ho.endpoints.push_back(u);
  }
  ho.connect_timeout = options_.client.connect_timeout;
  ho.tls = make_etcd_tls(options_.client);  // issue 27: https to etcd
  HttpConnection conn(ho);
  const std::string end = prefix_range_end(options_.prefix);
  while (!stopping_) {
    if (on_state_) on_state_(State::connecting, next_revision_.load(), Status::OK());
    json create = {{"key", base64_encode(options_.prefix)}, {"range_end", base64_encode(end)}};
    if (next_revision_.load() > 0) create["start_revision"] = std::to_string(next_revision_.load());
    json req = {{"create_request", create}};
    compacted_ = false;
    // Issue 27: with an etcd user, a fresh token for each watch stream (tokens expire).
    std::string token;
    Status st = authenticate(options_.client, &token, &stopping_);
    HttpHeaders headers;
    if (!token.empty()) headers.push_back({"Authorization", token});
    if (st.ok())
      st = conn.stream(
          "/v3/watch", req.dump(), options_.client.request_timeout, options_.idle_timeout,
          [this](std::string_view line) { return on_line(line); }, &stopping_, nullptr, headers);
    if (stopping_) break;
    if (compacted_) {
      if (on_state_)
        on_state_(State::compacted, compact_revision_, Status::Etcd(11, "required revision has been compacted"));
      return;
    }
    if (st.ok()) st = Status::Protocol("watch stream ended with an error");
    if (on_state_) on_state_(State::broken, next_revision_.load(), st);
    if (!options_.reconnect) return;
    // Back off, staying responsive to stop().
    auto until = std::chrono::steady_clock::now() + options_.reconnect_backoff;
    while (!stopping_ && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (on_state_) on_state_(State::stopped, next_revision_.load(), Status::OK());
}

}  // namespace fencegate::election
