// Message-body framing for the relay: a strict decoder of the chunked transfer coding, used for
// request bodies from clients and response bodies from upstreams.
//
// The proxy never forwards chunk framing as received. It decodes every chunk here and writes its
// own canonical framing ("<hex>\r\n<data>\r\n" ... "0\r\n\r\n"), so an upstream can only ever see
// what this decoder understood: chunk extensions and trailer fields are checked, then dropped.
//
// Refused: a chunk size that is not hex or longer than 16 digits, a body over the limit, bare CR
// or LF anywhere in the framing, whitespace other than before ';', control bytes in extensions or
// trailers, malformed trailer fields, a chunk-size line (with extensions) or a trailer section
// longer than `max_meta` bytes.
//
// Pure; no I/O. One decoder per body; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fencegate::proxy {

class ChunkDecoder {
 public:
  explicit ChunkDecoder(std::uint64_t max_body = UINT64_MAX, std::size_t max_meta = 16 * 1024)
      : max_body_(max_body), max_meta_(max_meta) {}

  // Consumes bytes of `in` and stops after one run of chunk data, at the end of the body, or at
  // an error. Returns the bytes consumed; *data is the run of body bytes found (a view into `in`,
  // possibly empty). Call again with the rest until done(), failed(), or the input is used up.
  std::size_t feed(std::string_view in, std::string_view* data);

  bool done() const { return state_ == State::done; }
  bool failed() const { return state_ == State::error; }
  // Failed because the body grew over max_body (answer 413 rather than 400).
  bool too_large() const { return too_large_; }
  const char* error() const { return error_; }
  std::uint64_t body_bytes() const { return total_; }

 private:
  enum class State {
    size,
    size_ws,
    ext,
    size_lf,
    data,
    data_cr,
    data_lf,
    trailer,
    trailer_name,
    trailer_value,
    trailer_lf,
    final_lf,
    done,
    error
  };
  std::size_t fail(const char* why, std::size_t consumed);

  std::uint64_t max_body_;
  std::size_t max_meta_;
  State state_ = State::size;
  std::uint64_t size_ = 0;       // current chunk size being read, then bytes left of its data
  int digits_ = 0;
  std::uint64_t total_ = 0;
  std::size_t meta_ = 0;
  bool too_large_ = false;
  const char* error_ = "";
};

// Appends the chunked framing of one data run (nothing for an empty run) or of the last chunk.
void append_chunk_header(std::string& out, std::size_t n);  // "<hex>\r\n"
inline constexpr std::string_view kChunkEnd = "\r\n";       // after each chunk's data
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace fencegate::proxy
