// Local replies: the answers fencegate makes itself (refusals, gateway errors), as problem+json
// (RFC 9457), and the one table of HTTP reason phrases. No Asio: both the data path and the admin
// API use it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fencegate::proxy {

// The reason phrase of a status fencegate answers with itself ("Error" for any other).
const char* reason_phrase(unsigned status);

// A problem+json body's fields.
struct Problem {
  Problem(unsigned s, std::string ty, std::string ti, std::string d, std::string res = {},
          std::optional<std::int64_t> pres = std::nullopt, std::optional<std::int64_t> cur = std::nullopt)
      : status(s),
        type(std::move(ty)),
        title(std::move(ti)),
        detail(std::move(d)),
        resource(std::move(res)),
        presented(pres),
        current(cur) {}
  unsigned status = 400;
  std::string type;  // short slug, e.g. "stale-generation" (the body says "urn:fencegate:problem:<type>")
  std::string title;
  std::string detail;
  // Fence context (emitted when resource is set).
  std::string resource;
  std::optional<std::int64_t> presented;
  std::optional<std::int64_t> current;
};

// Fence headers added to every response of a fenced request.
struct FenceHeaders {
  std::optional<std::int64_t> generation;  // Fencing-Generation
  std::string observe;                     // Fencing-Observe
  // For the problem body of a reply that is not a fence decision (502, 504, 408, ...): the
  // fence's fields, so a fenced request's every problem names resource and generations.
  std::string_view resource;               // the route's resource (lives as long as the request)
  std::optional<std::int64_t> presented;   // the request's token, if it had a valid one
};

// Named, not `{}`: GCC 12 mishandles a braced temporary bound to a reference inside co_await
// (it freed a FenceHeaders' string from the wrong address).
inline const FenceHeaders kNoFenceHeaders{};

// The problem+json body (one line, ending in "\n"). `extra_members`, if not empty, is appended
// inside the object as is: JSON members (`"errors":[...]`) without a leading comma.
std::string problem_body(const Problem& p, std::string_view extra_members = {});

// The current time as an HTTP date (RFC 9110 5.6.7, IMF-fixdate), formatted once a second per
// thread.
std::string_view http_date();

// fencegate's own answer on the data path (it is the origin of these: they carry a Date, RFC 9110
// 6.6.1). `head_only`: the answer to a HEAD request, which has the headers of the full answer and
// no body (RFC 9110 9.3.2); body bytes after it would be read as the start of the next response.
std::string local_reply(const Problem& p, bool keep_alive, int version, const FenceHeaders& fence,
                        bool head_only = false);

}  // namespace fencegate::proxy
