// Small POSIX socket helpers shared by the test support code (not a public test API).
//
// Thread-safety: free functions; an Fd is owned by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fencegate::testing {

using Clock = std::chrono::steady_clock;
using Headers = std::vector<std::pair<std::string, std::string>>;

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Returns true iff a and b are equal ignoring ASCII case.
bool iequals(std::string_view a, std::string_view b);
std::string to_lower(std::string_view s);
std::string_view trim_ows(std::string_view s);  // strips SP and HTAB at both ends

// First value of header `name` (case-insensitive), or "" if absent.
std::string header_value(const Headers& h, std::string_view name);
std::vector<std::string> header_values(const Headers& h, std::string_view name);
bool has_header(const Headers& h, std::string_view name);

// Connects a blocking TCP socket to 127.0.0.1:port. Returns an invalid Fd on failure.
Fd connect_loopback(std::uint16_t port, std::chrono::milliseconds timeout, std::string* error = nullptr);

// A listening TCP socket on 127.0.0.1 at an ephemeral port (stored in *port). Invalid on failure.
Fd listen_loopback(std::uint16_t* port, int backlog = 64);

// Writes all of `data` (MSG_NOSIGNAL). Returns true iff everything was written.
bool write_all(int fd, std::string_view data);

// Result of one bounded read.
enum class IoStatus { data, eof, timeout, error };
// Waits up to `timeout` for readable data and appends what one recv() returns to `buf`.
IoStatus read_some(int fd, std::string& buf, std::chrono::milliseconds timeout, int* err = nullptr);

// Milliseconds left until `deadline` (>= 0).
std::chrono::milliseconds remaining(Clock::time_point deadline);

}  // namespace fencegate::testing
