#pragma once

#include <string>

/// What hydra-agent makes of its gRPC bind address. Pure functions, no I/O.
namespace hydra::agent {

/// The host part of "host:port", "[v6]:port" or ":port" (then ""), without brackets.
std::string HostOf(const std::string& address);

/// Whether `host` listens on every interface ("", "0.0.0.0", "::", "[::]").
bool IsWildcardHost(const std::string& host);

/// Whether `host` is only reachable from this machine (127.0.0.0/8, ::1, localhost).
bool IsLoopbackHost(const std::string& host);

/// The endpoint hydra_agent_info advertises when --grpc-advertise-address is not given: the
/// bound address itself when it names one host (that is where the agent can be reached), else
/// <node name>:<port>.
std::string DefaultAdvertiseAddress(const std::string& bind_address, int port,
                                    const std::string& node_name);

}  // namespace hydra::agent
