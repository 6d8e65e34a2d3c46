// Local replies: problem+json bodies, the reason phrase table and the data path's reply head.
#include "proxy/local_reply.h"

#include <cstdio>
#include <ctime>

#include "common/json.h"
#include "common/log.h"

namespace fencegate::proxy {

const char* reason_phrase(unsigned status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 428: return "Precondition Required";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
  }
}

std::string problem_body(const Problem& p, std::string_view extra_members) {
  std::string b = "{\"type\":" + json::quote("urn:fencegate:problem:" + p.type) + ",\"title\":" + json::quote(p.title) +
                  ",\"status\":" + std::to_string(p.status) + ",\"detail\":" + json::quote(p.detail);
  if (!p.resource.empty()) {
    b += ",\"resource\":" + json::quote(p.resource);
    b += ",\"presented_generation\":" + (p.presented ? std::to_string(*p.presented) : std::string("null"));
    b += ",\"current_generation\":" + (p.current ? std::to_string(*p.current) : std::string("null"));
  }
  if (!extra_members.empty()) {
    b += ',';
    b += extra_members;
  }
  b += "}\n";
  return b;
}

std::string_view http_date() {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  thread_local std::time_t last = -1;
  thread_local char buf[32];
  const std::time_t now = std::time(nullptr);
  if (now != last) {
    std::tm t{};
    gmtime_r(&now, &t);
    std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[t.tm_wday], t.tm_mday,
                  kMonths[t.tm_mon], t.tm_year + 1900, t.tm_hour, t.tm_min, t.tm_sec);
    last = now;
  }
  return buf;
}

std::string local_reply(const Problem& p, bool keep_alive, int version, const FenceHeaders& fence, bool head_only) {
  std::string body = problem_body(p);
  std::string r = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  r += std::to_string(p.status);
  r += ' ';
  r += reason_phrase(p.status);
  r += "\r\nDate: ";
  r += http_date();
  r += "\r\nContent-Type: application/problem+json\r\nContent-Length: ";
  r += std::to_string(body.size());
  r += "\r\nCache-Control: no-store\r\n";
  if (fence.generation) r += "Fencing-Generation: " + std::to_string(*fence.generation) + "\r\n";
  if (!fence.observe.empty()) r += "Fencing-Observe: " + fence.observe + "\r\n";
  if (!keep_alive) r += "Connection: close\r\n";
  else if (version == 10) r += "Connection: keep-alive\r\n";
  r += "\r\n";
  if (!head_only) r += body;
  return r;
}

}  // namespace fencegate::proxy
