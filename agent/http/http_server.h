#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"

namespace hydra::agent {

/// What a route answers: HTTP status, content type and body.
struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

/// A small HTTP server for GET routes: the agent's /metrics and its Kubernetes probes
/// (/healthz, /readyz). Other paths answer 404, other methods 405.
///
/// Built on cpprestsdk's listener: civetweb (which prometheus-cpp's Exposer uses) starts its
/// threads with fixed 100 KiB stacks, which pthread_create refuses in a process that loads
/// LibTorch (its static TLS is larger), so the Exposer cannot run inside hydra-agent.
class HttpServer {
 public:
  using Handler = std::function<HttpReply()>;
  /// `routes` maps exact paths to handlers, called on the server's threads.
  explicit HttpServer(std::map<std::string, Handler> routes);
  ~HttpServer();

  /// Listens on `bind_address` ("127.0.0.1:8080", or ":8080" for every interface).
  /// UNAVAILABLE if it cannot.
  Status Serve(const std::string& bind_address);
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hydra::agent
