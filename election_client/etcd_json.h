// Internal: decoding etcd gateway JSON (int64 as strings, base64 bytes, omitted zero values).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "election_client/base64.h"
#include "election_client/etcd_client.h"

namespace fencegate::election::detail {

using json = nlohmann::json;

// j[key] as int64 whether it is a string or a number; 0 when absent or not a number.
inline std::int64_t i64(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

// j[key] base64-decoded; "" when absent or invalid.
inline std::string bytes(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return {};
  auto d = base64_decode(it->get<std::string>());
  return d ? *d : std::string();
}

inline std::string str64(std::int64_t v) { return std::to_string(v); }

inline KeyValue kv_from(const json& j) {
  KeyValue kv;
  kv.key = bytes(j, "key");
  kv.value = bytes(j, "value");
  kv.create_revision = i64(j, "create_revision");
  kv.mod_revision = i64(j, "mod_revision");
  kv.version = i64(j, "version");
  kv.lease = i64(j, "lease");
  return kv;
}

inline ResponseHeader header_from(const json& j) {
  ResponseHeader h;
  auto it = j.find("header");
  if (it == j.end() || !it->is_object()) return h;
  h.revision = i64(*it, "revision");
  h.raft_term = i64(*it, "raft_term");
  if (it->contains("member_id") && (*it)["member_id"].is_string()) h.member_id = (*it)["member_id"].get<std::string>();
  return h;
}

}  // namespace fencegate::election::detail
