// Fuzz target: the relay's body framing, proxy/framing.h ChunkDecoder, and the upstream response
// scanner, proxy/head.h scan_response_head.
//
// Input: one byte picks a read-boundary step (1..32) and a body limit, the rest is the wire.
// Properties on arbitrary bytes: never crashes; the decoder consumes input in order and never
// more than it was given; decoded data are views into the input, never longer than what was
// consumed; the result (body, done/failed, bytes consumed) does not depend on how the input was
// split into reads; done and failed never both hold; a body over the limit fails as too_large;
// the decoded body, re-framed as one chunk and decoded again, decodes to itself. The response
// scanner's complete heads end at the first CRLFCRLF and every field lies inside the head.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proxy/framing.h"
#include "proxy/head.h"
#include "tests/fuzz/fuzz_check.h"

using namespace fencegate::proxy;
using fencegate::fuzz::show;

namespace {

struct Run {
  std::string body;
  std::size_t consumed = 0;
  bool done = false, failed = false, too_large = false;
};

Run decode(std::string_view in, std::size_t step, std::uint64_t limit) {
  ChunkDecoder d(limit, 256);
  Run r;
  std::size_t pos = 0;
  while (pos < in.size() && !d.done() && !d.failed()) {
    std::string_view piece = in.substr(pos, step);
    std::size_t used = 0;
    while (used < piece.size() && !d.done() && !d.failed()) {
      std::string_view data;
      std::size_t n = d.feed(piece.substr(used), &data);
      FUZZ_CHECK(n <= piece.size() - used, "consumed more than given");
      FUZZ_CHECK(data.size() <= n, "data longer than what was consumed");
      if (!data.empty())
        FUZZ_CHECK(data.data() >= piece.data() + used && data.data() + data.size() <= piece.data() + used + n,
                   "data is not a view of the consumed input");
      r.body += data;
      used += n;
      if (n == 0) break;
    }
    pos += used;
    if (used < piece.size()) break;
  }
  r.consumed = pos;
  r.done = d.done();
  r.failed = d.failed();
  r.too_large = d.too_large();
  FUZZ_CHECK(!(r.done && r.failed), "done and failed");
  FUZZ_CHECK(!r.too_large || r.failed, "too_large without failing");
  FUZZ_CHECK(d.body_bytes() <= limit || !r.done, "a body over the limit completed");
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t step = 1 + (data[0] & 31);
  const std::uint64_t limit = (data[0] & 0x80) ? 64 : UINT64_MAX;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);

  Run whole = decode(in, in.size() ? in.size() : 1, limit);
  Run split = decode(in, step, limit);
  FUZZ_CHECK(whole.body == split.body && whole.done == split.done && whole.failed == split.failed &&
                 whole.consumed == split.consumed,
             "the result depends on read boundaries: " + show(in) + " step " + std::to_string(step));
  if (whole.done) {
    FUZZ_CHECK(whole.body.size() <= whole.consumed, "body longer than the framing that carried it");
    std::string again;
    if (!whole.body.empty()) {
      append_chunk_header(again, whole.body.size());
      again += whole.body;
      again += kChunkEnd;
    }
    again += kLastChunk;
    Run re = decode(again, again.size(), UINT64_MAX);
    FUZZ_CHECK(re.done && re.body == whole.body && re.consumed == again.size(),
               "our own framing does not decode to the same body: " + show(again));
  }

  ResponseHead h;
  HeadScan s = scan_response_head(in, 4096, &h);
  if (s.status == HeadStatus::complete) {
    FUZZ_CHECK(s.length == in.find("\r\n\r\n") + 4, "response head does not end at the first CRLFCRLF");
    FUZZ_CHECK(h.status >= 100 && h.status <= 999 && (h.version == 10 || h.version == 11), "bad status/version");
    for (const auto& f : h.fields) {
      FUZZ_CHECK(f.name.data() >= in.data() && f.value.data() + f.value.size() <= in.data() + s.length,
                 "field outside the head");
      for (unsigned char c : f.value) FUZZ_CHECK(c != '\r' && c != '\n' && c != 0, "CR/LF/NUL in a field value");
    }
  }
  return 0;
}
