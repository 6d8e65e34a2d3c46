// Read readiness that Asio does not track: "this socket's receive queue is empty".
//
// Asio's epoll reactor watches every socket edge-triggered and, before it queues a read, tries
// the read at once (a "speculative" read). It skips that try only after a read saw EOF. So a
// proxy that reads a request, answers it and reads again pays one recv() that fails with EAGAIN
// on each side of every exchange: two of the eight system calls of a proxied request.
//
// nginx avoids them with the rule used here: a stream read that returned fewer bytes than it
// asked for drained the receive queue, and any byte that arrives after it raises a new epoll
// edge, which makes the reactor read again. drained() records that rule in the reactor's own
// per-socket flag, so the next read goes straight to waiting, with no system call.
//
// What the rule cannot see is an end of stream that came with the last data (its edge merged
// with theirs), or bytes behind a TCP urgent mark (a read stops short there). A read that
// trusts the mark then waits for an edge that does not come. So the session trusts it only
// where that is cheap to undo: on a client connection from its second answer on, and only
// until the next watchdog tick (20 ms), when the read tries after all. Pooled upstream
// connections are checked with a peek before reuse, which sees an EOF.
//
// REQUIRES: the socket's io_context runs on one thread (the workers' do; no I/O locking), and
// drained() is called on that thread. With another Boost than the one this was written against
// (1.81, Debian bookworm), or another reactor, drained() does nothing: correct, one recv slower.
#pragma once

#include <boost/asio/basic_stream_socket.hpp>
#include <boost/version.hpp>

#include <cstddef>

#if BOOST_VERSION == 108100 && defined(BOOST_ASIO_HAS_EPOLL) && !defined(BOOST_ASIO_HAS_IO_URING) && \
    !defined(BOOST_ASIO_HAS_IOCP)
#include <boost/asio/detail/epoll_reactor.hpp>

#include <type_traits>
#define FENCEGATE_READINESS 1
#endif

namespace fencegate::proxy::readiness {

#ifdef FENCEGATE_READINESS
namespace detail {

using Reactor = boost::asio::detail::epoll_reactor;
using State = std::remove_pointer_t<Reactor::per_descriptor_data>;
using SpecFlags = bool (State::*)[Reactor::max_ops];

// The reactor keeps its per-socket flag private. An explicit instantiation may name a private
// member ([temp.spec.general]: access is not checked there), so this one hands out a pointer to
// it through a friend function.
struct SpecTag {
  friend SpecFlags member(SpecTag);
};
template <SpecFlags P>
struct Expose {
  friend SpecFlags member(SpecTag) { return P; }
};
template struct Expose<&State::try_speculative_>;

// basic_socket's implementation is protected: a derived class may form a pointer to it.
template <class Sock>
struct ImplOf : Sock {
  static constexpr auto impl() { return &ImplOf::impl_; }
};

}  // namespace detail
#endif

namespace detail {
// Sets whether the next read on `s` tries at once (Asio's default) or waits for epoll.
template <class Sock>
void set_try(Sock& s, bool on) {
#ifdef FENCEGATE_READINESS
  State* st = (s.*ImplOf<Sock>::impl()).get_implementation().reactor_data_;
  if (st) (st->*member(SpecTag{}))[Reactor::read_op] = on;
#else
  (void)s, (void)on;  // another Boost or reactor: reads keep trying first
#endif
}
}  // namespace detail

// Records that `s`'s receive queue is empty right now (a peek just found nothing, not even an
// EOF): its next read waits for epoll instead of trying first. Call it at once after the
// system call that found the queue empty, before the thread returns to the reactor: an edge
// that the reactor handles later undoes it, as it must.
template <class Sock>
void mark_empty(Sock& s) {
  detail::set_try(s, false);
}

// Records that a read on `s` asked for `asked` bytes and got `got` (no error): a short read
// drained the queue (mark_empty's rules apply).
template <class Sock>
void drained(Sock& s, std::size_t got, std::size_t asked) {
  if (got > 0 && got < asked) mark_empty(s);  // EOF is Asio's own case; a full buffer may leave more
}

// Forgets a mark: the next read on `s` tries at once, as Asio does by default. For reads that
// must see an EOF that arrived with the last data at once (a request body, the rest of a head).
template <class Sock>
void unknown(Sock& s) {
  detail::set_try(s, true);
}

// True iff the marks take effect in this build.
constexpr bool tracked() {
#ifdef FENCEGATE_READINESS
  return true;
#else
  return false;
#endif
}

}  // namespace fencegate::proxy::readiness
