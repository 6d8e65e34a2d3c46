#include "proxy/framing.h"

#include "common/hex.h"
#include "proxy/head.h"

namespace fencegate::proxy {

namespace {

using common::hex_value;

// Extension and trailer-value bytes: HTAB, SP, VCHAR, obs-text.
bool is_text(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

}  // namespace

std::size_t ChunkDecoder::fail(const char* why, std::size_t consumed) {
  state_ = State::error;
  error_ = why;
  return consumed;
}

std::size_t ChunkDecoder::feed(std::string_view in, std::string_view* data) {
  *data = {};
  std::size_t i = 0;
  while (i < in.size()) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    if (state_ == State::data) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(size_, in.size() - i));
      *data = in.substr(i, n);
      size_ -= n;
      if (size_ == 0) state_ = State::data_cr;
      return i + n;
    }
    if (state_ == State::done || state_ == State::error) return i;
    if (++meta_ > max_meta_) return fail("chunk line or trailer section too long", i);
    switch (state_) {
      case State::size: {
        int v = hex_value(c);
        if (v >= 0) {
          if (++digits_ > 16) return fail("chunk size too long", i);
          size_ = size_ * 16 + static_cast<std::uint64_t>(v);
        } else if (digits_ == 0) {
          return fail("malformed chunk size", i);
        } else if (c == ' ' || c == '\t') {
          state_ = State::size_ws;
        } else if (c == ';') {
          state_ = State::ext;
        } else if (c == '\r') {
          state_ = State::size_lf;
        } else {
          return fail("malformed chunk size", i);
        }
        break;
      }
      case State::size_ws:
        if (c == ';') state_ = State::ext;
        else if (c != ' ' && c != '\t') return fail("malformed chunk extension", i);
        break;
      case State::ext:
        if (c == '\r') state_ = State::size_lf;
        else if (!is_text(c)) return fail("invalid character in a chunk extension", i);
        break;
      case State::size_lf:
        if (c != '\n') return fail("bare CR in chunk framing", i);
        if (size_ > max_body_ - total_) {
          too_large_ = true;
          return fail("body too large", i);
        }
        total_ += size_;
        digits_ = 0;
        state_ = size_ == 0 ? State::trailer : State::data;
        break;
      case State::data_cr:
        if (c != '\r') return fail("chunk data longer than its size", i);
        state_ = State::data_lf;
        break;
      case State::data_lf:
        if (c != '\n') return fail("bare CR in chunk framing", i);
        state_ = State::size;
        meta_ = 0;  // the limit is per chunk line, and for the trailer section as a whole
        break;
      case State::trailer:  // at the start of a trailer line or the final CRLF
        if (c == '\r') state_ = State::final_lf;
        else if (is_tchar(c)) state_ = State::trailer_name;
        else return fail("malformed trailer field", i);
        break;
      case State::trailer_name:
        if (c == ':') state_ = State::trailer_value;
        else if (!is_tchar(c)) return fail("malformed trailer field", i);
        break;
      case State::trailer_value:
        if (c == '\r') state_ = State::trailer_lf;
        else if (!is_text(c)) return fail("invalid character in a trailer field", i);
        break;
      case State::trailer_lf:
        if (c != '\n') return fail("bare CR in trailer fields", i);
        state_ = State::trailer;
        break;
      case State::final_lf:
        if (c != '\n') return fail("bare CR after the last chunk", i);
        state_ = State::done;
        return i + 1;
      default: break;
    }
    ++i;
  }
  return i;
}

void append_chunk_header(std::string& out, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  char tmp[20];
  int k = 0;
  do {
    tmp[k++] = kHex[n & 15];
    n >>= 4;
  } while (n);
  while (k) out += tmp[--k];
  out += "\r\n";
}

}  // namespace fencegate::proxy
