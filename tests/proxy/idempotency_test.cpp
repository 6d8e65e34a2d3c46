// Issue 30: the pure half of idempotency keys (proxy/idempotency.h): RFC 8941 sf-string keys,
// fingerprints, which answers are final, capture and replay.
#include <doctest/doctest.h>

#include <string>

#include "proxy/idempotency.h"

using namespace fencegate::proxy;
namespace idem = fencegate::proxy::idem;

TEST_CASE("idempotency: a key is an RFC 8941 sf-string") {
  CHECK(idem::parse_key("\"abc\"") == std::optional<std::string>("abc"));
  CHECK(idem::parse_key("\"charge:alice:2026-11\"") == std::optional<std::string>("charge:alice:2026-11"));
  CHECK(idem::parse_key("  \"with space\"\t") == std::optional<std::string>("with space"));
  CHECK(idem::parse_key(R"("a\"b\\c")") == std::optional<std::string>("a\"b\\c"));
  std::string why;
  for (const char* bad :
       {"abc", "\"abc", "abc\"", "\"\"", "\"a\\nb\"", "\"a\\\"", "\"a\";p=1", "\"a\" \"b\"", "'abc'", "\"a\\x\"", ""}) {
    CAPTURE(bad);
    why.clear();
    CHECK_FALSE(idem::parse_key(bad, &why).has_value());
    CHECK_FALSE(why.empty());
  }
  // Bytes outside printable ASCII: controls, DEL, UTF-8.
  CHECK_FALSE(idem::parse_key(std::string("\"a\x01") + "b\"").has_value());
  CHECK_FALSE(idem::parse_key("\"a\x7f\"").has_value());
  CHECK_FALSE(idem::parse_key("\"caf\xc3\xa9\"").has_value());
  CHECK_FALSE(idem::parse_key(std::string("\"a\0b\"", 5)).has_value());
}

TEST_CASE("idempotency: keys are bounded at 255 bytes and serialize back") {
  const std::string max(idem::kMaxKeyBytes, 'k');
  CHECK(idem::parse_key("\"" + max + "\"") == std::optional<std::string>(max));
  std::string why;
  CHECK_FALSE(idem::parse_key("\"" + max + "k\"", &why).has_value());
  CHECK(why.find("255") != std::string::npos);
  for (std::string k : {"plain", "q\"uote", "back\\slash", "\\\"\\"}) {
    CAPTURE(k);
    CHECK(idem::parse_key(idem::serialize_key(k)) == std::optional<std::string>(k));
  }
}

TEST_CASE("idempotency: the fingerprint covers method, target and body") {
  const std::string a = idem::fingerprint("POST", "/charges", "{\"amount\":10}");
  CHECK(a.size() == 64);
  CHECK(a == idem::fingerprint("POST", "/charges", "{\"amount\":10}"));
  CHECK(a != idem::fingerprint("PUT", "/charges", "{\"amount\":10}"));
  CHECK(a != idem::fingerprint("POST", "/charges?x", "{\"amount\":10}"));
  CHECK(a != idem::fingerprint("POST", "/charges", "{\"amount\":11}"));
  // Fed in pieces, the same as at once; the boundary between target and body cannot be shifted.
  idem::Fingerprint f;
  f.update("{\"amount\"");
  f.update(":10}");
  CHECK(f.finish("POST", "/charges") == a);
  CHECK(idem::fingerprint("POST", "/a", "b") != idem::fingerprint("POST", "/ab", ""));
  // SHA-256 known answer (FIPS 180-2 "abc").
  CHECK(idem::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("idempotency: which upstream answers are final") {
  for (int s : {200, 201, 204, 301, 400, 404, 409, 422, 500}) CHECK(idem::fate_of(s) == idem::Fate::record);
  for (int s : {408, 425, 429, 503}) CHECK(idem::fate_of(s) == idem::Fate::release);
  for (int s : {502, 504}) CHECK(idem::fate_of(s) == idem::Fate::unknown);
  // A route's own lists (idempotency.release_statuses, .unknown_statuses).
  const std::vector<int> release{500}, unknown{503};
  CHECK(idem::fate_of(500, release, unknown) == idem::Fate::release);
  CHECK(idem::fate_of(503, release, unknown) == idem::Fate::unknown);
  for (int s : {200, 408, 429, 502, 504}) CHECK(idem::fate_of(s, release, unknown) == idem::Fate::record);
}

TEST_CASE("idempotency: a captured response replays with its body-describing fields") {
  ResponseHead rh;
  std::string text =
      "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nSet-Cookie: s=1\r\n"
      "Location: /charges/7\r\nContent-Length: 9\r\n\r\n";
  REQUIRE(scan_response_head(text, 4096, &rh).status == HeadStatus::complete);
  idem::Capture c(16);
  c.head(rh);
  c.body("{\"id\":");
  c.body("7}\n");
  CHECK(c.status == 201);
  CHECK(c.headers == "Content-Type: application/json\r\nLocation: /charges/7\r\n");
  CHECK(c.kept);
  fencegate::store::KeyRecord rec;
  rec.key = "k";
  rec.status = c.status;
  rec.headers = c.headers;
  rec.body = c.data;
  FenceHeaders fence;
  fence.generation = 5;
  const std::string r = idem::replay_response(rec, true, 11, fence, false);
  CHECK(r.starts_with("HTTP/1.1 201 "));
  CHECK(r.find("\r\nIdempotent-Replayed: true\r\n") != std::string::npos);
  CHECK(r.find("\r\nContent-Length: 9\r\n") != std::string::npos);
  CHECK(r.find("\r\nFencing-Generation: 5\r\n") != std::string::npos);
  CHECK(r.find("Set-Cookie") == std::string::npos);
  CHECK(r.ends_with("\r\n\r\n{\"id\":7}\n"));
  // Over max_body: status only, and the replay says the body was not kept.
  idem::Capture big(4);
  big.head(rh);
  big.body("12345");
  CHECK_FALSE(big.kept);
  CHECK(big.data.empty());
  rec.body_kept = false;
  rec.body.clear();
  const std::string r2 = idem::replay_response(rec, false, 11, fence, false);
  CHECK(r2.starts_with("HTTP/1.1 201 "));
  CHECK(r2.find("idempotency-body-not-kept") != std::string::npos);
  CHECK(r2.find("Connection: close\r\n") != std::string::npos);
}

TEST_CASE("idempotency: problems carry their pinned types and statuses") {
  CHECK(idem::malformed("Idempotency-Key", "x").type == "idempotency-key-malformed");
  CHECK(idem::malformed("Idempotency-Key", "x").status == 400);
  CHECK(idem::missing("Idempotency-Key").type == "idempotency-key-missing");
  CHECK(idem::missing("Idempotency-Key").status == 400);
  CHECK(idem::mismatch("k").type == "idempotency-key-mismatch");
  CHECK(idem::mismatch("k").status == 422);
  CHECK(idem::in_flight("k").type == "idempotency-in-flight");
  CHECK(idem::in_flight("k").status == 409);
  CHECK(idem::outcome_unknown("k").type == "idempotency-outcome-unknown");
  CHECK(idem::outcome_unknown("k").status == 409);
  CHECK(idem::limit("r", 3).type == "idempotency-limit");
  CHECK(idem::limit("r", 3).status == 503);
  const std::string r = idem::with_field("HTTP/1.1 409 Conflict\r\nDate: x\r\n\r\n", "Retry-After", "1");
  CHECK(r == "HTTP/1.1 409 Conflict\r\nRetry-After: 1\r\nDate: x\r\n\r\n");
}
