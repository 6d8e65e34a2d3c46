// Listener setup, one for both listeners (the data path's in server.cpp, the admin API's in
// admin.cpp): resolve the configured address, open, SO_REUSEADDR, bind, listen. Internal to
// proxy/ (it includes Asio).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <string>

#include "config/config.h"

namespace fencegate::proxy {

struct ListenError {
  bool resolving = false;  // the address did not resolve (else: open, bind or listen failed)
  std::string message;
};

// Opens `acceptor` listening on `listen`. Returns false with *error set if it cannot.
template <class Acceptor>
bool open_listener(Acceptor& acceptor, const config::Endpoint& listen, ListenError* error) {
  namespace net = boost::asio;
  using tcp = net::ip::tcp;
  boost::system::error_code ec;
  std::string host = listen.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  tcp::resolver resolver(acceptor.get_executor());
  auto results = resolver.resolve(host, std::to_string(listen.port), ec);
  if (ec || results.empty()) {
    *error = ListenError{true, ec.message()};
    return false;
  }
  tcp::endpoint ep = results.begin()->endpoint();
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    *error = ListenError{false, ec.message()};
    return false;
  }
  return true;
}

// "address:port" the acceptor is bound to ("[v6]:port" for IPv6), for the log.
template <class Acceptor>
std::string bound_address(const Acceptor& acceptor) {
  boost::system::error_code ec;
  auto bound = acceptor.local_endpoint(ec);
  const std::string ip = bound.address().to_string();
  return (bound.address().is_v6() ? "[" + ip + "]" : ip) + ":" + std::to_string(bound.port());
}

}  // namespace fencegate::proxy
