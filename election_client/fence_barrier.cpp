// The activation barrier: one fence advanced to the new token, with retries (see fence_barrier.h).
#include "election_client/fence_barrier.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/log.h"

namespace fencegate::election {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

FenceResult fence_one(const FenceBarrierOptions& f, const HttpUrl& url, const std::string& url_text, std::int64_t token,
                      const std::atomic<bool>& cancel) {
  HttpConnection::Options o;
  o.endpoints = {url};
  o.connect_timeout = 1000ms;
  if (url.tls) {  // issue 27: an https admin API, verified against --fence-cacert (or the system store)
    std::string why;
    o.tls = make_tls_client(TlsFiles{f.cacert, "", ""}, &why);
    if (!o.tls) {
      log::error("fence CA file does not load", {log::kv("fence", url_text), log::kv("error", "--fence-" + why)});
      return FenceResult::unreachable;
    }
  }
  HttpConnection conn(o);
  const std::string target = url.path + "/fence";
  const std::string body =
      json{{"generation", token}, {"leader", f.leader_id}}.dump(-1, ' ', false, json::error_handler_t::replace);
  HttpHeaders headers = {{"Fencing-Token", std::to_string(token)}};
  if (!f.bearer_token.empty()) headers.push_back({"Authorization", "Bearer " + f.bearer_token});
  const auto deadline = Clock::now() + milliseconds(f.timeout_ms);
  std::string last;
  for (int attempt = 1;; ++attempt) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left <= 0ms) break;
    HttpResponse r;
    Status st = conn.post(target, body, left, &r, &cancel, headers);
    if (st.is_cancelled()) return FenceResult::cancelled;
    if (st.ok() && r.status == 200) {
      // A fencegate fence answers with the generation it made durable: anything else (a plain
      // upstream, a wrong URL that happens to say 200) has fenced nothing.
      json j = json::parse(r.body, nullptr, false);
      if (!j.is_object() || !j.contains("generation") || !j["generation"].is_number_integer() ||
          j["generation"].get<std::int64_t>() != token) {
        log::error("fence answered 200 without making the token durable (is it a fencegate admin URL?)",
                   {log::kv("fence", url_text), log::kv("token", token), log::kv("body", r.body.substr(0, 500))});
        return FenceResult::refused;
      }
      log::info("fence advanced", {log::kv("fence", url_text), log::kv("token", token), log::kv("attempt", attempt)});
      return FenceResult::ok;
    }
    if (st.ok() && r.status < 500) {
      log::error("fence refused the token", {log::kv("fence", url_text), log::kv("token", token),
                                             log::kv("status", r.status), log::kv("body", r.body.substr(0, 500))});
      return FenceResult::refused;
    }
    last = st.ok() ? "HTTP " + std::to_string(r.status) + " " + r.body.substr(0, 200) : st.to_string();
    log::warn("fence not reached, retrying",
              {log::kv("fence", url_text), log::kv("attempt", attempt), log::kv("error", last)});
    for (auto until = std::min(deadline, Clock::now() + 250ms); Clock::now() < until && !cancel;)
      std::this_thread::sleep_for(10ms);
    if (cancel) return FenceResult::cancelled;
  }
  log::error("fence unreachable", {log::kv("fence", url_text), log::kv("token", token),
                                   log::kv("timeout_ms", f.timeout_ms), log::kv("error", last)});
  return FenceResult::unreachable;
}

}  // namespace fencegate::election
