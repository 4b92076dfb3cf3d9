#include "agent/rpc/addresses.h"

namespace hydra::agent {

std::string HostOf(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  // A bare IPv6 address has several colons and no port to strip.
  if (address.find(':') != colon) return address;
  return address.substr(0, colon);
}

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string DefaultAdvertiseAddress(const std::string& bind_address, int port,
                                    const std::string& node_name) {
  const std::string host = HostOf(bind_address);
  const std::string name = IsWildcardHost(host) ? node_name : host;
  const bool v6 = name.find(':') != std::string::npos;
  return (v6 ? "[" + name + "]" : name) + ":" + std::to_string(port);
}

}  // namespace hydra::agent
