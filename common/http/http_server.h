#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"

namespace hydra::http {

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

/// The two endpoints both Hydra binaries serve, Kubernetes style: /metrics (Prometheus text
/// format) on --metrics-bind-address, and /healthz + /readyz on --health-probe-bind-address;
/// "0" disables either.
class ProbeAndMetricsServers {
 public:
  /// `render` returns the metrics text; `not_ready` "" when ready, else why not (/readyz's
  /// 503); `not_live` likewise for /healthz (none: always live). UNAVAILABLE naming the flag
  /// whose address cannot be bound.
  Status Start(const std::string& metrics_bind, std::function<std::string()> render,
               const std::string& health_bind, std::function<std::string()> not_ready,
               std::function<std::string()> not_live = nullptr);

 private:
  std::unique_ptr<HttpServer> metrics_, health_;
};

}  // namespace hydra::http
