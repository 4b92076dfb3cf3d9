#include "common/http/http_server.h"

#include <cpprest/http_listener.h>

namespace hydra::http {

namespace http = web::http;

struct HttpServer::Impl {
  std::map<std::string, Handler> routes;
  std::unique_ptr<http::experimental::listener::http_listener> listener;
};

HttpServer::HttpServer(std::map<std::string, Handler> routes) : impl_(std::make_unique<Impl>()) {
  impl_->routes = std::move(routes);
}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Serve(const std::string& bind_address) {
  std::string address = bind_address;
  if (!address.empty() && address.front() == ':') address = "0.0.0.0" + address;
  try {
    impl_->listener = std::make_unique<http::experimental::listener::http_listener>(
        web::uri(utility::conversions::to_string_t("http://" + address)));
    Impl* impl = impl_.get();
    impl_->listener->support([impl](http::http_request request) {
      if (request.method() != http::methods::GET) {
        request.reply(http::status_codes::MethodNotAllowed, "only GET\n").wait();
        return;
      }
      const std::string path = utility::conversions::to_utf8string(request.relative_uri().path());
      auto it = impl->routes.find(path);
      if (it == impl->routes.end()) {
        request.reply(http::status_codes::NotFound, "not found\n").wait();
        return;
      }
      HttpReply reply;
      try {
        reply = it->second();
      } catch (const std::exception& e) {
        reply = {500, "text/plain; charset=utf-8", std::string("error: ") + e.what() + "\n"};
      }
      http::http_response response(static_cast<http::status_code>(reply.status));
      response.set_body(reply.body, reply.content_type);
      request.reply(response).wait();
    });
    impl_->listener->open().wait();
  } catch (const std::exception& e) {
    impl_->listener.reset();
    return UnavailableError("cannot listen on " + bind_address + ": " + e.what());
  }
  return OkStatus();
}

void HttpServer::Stop() {
  if (!impl_->listener) return;
  try {
    impl_->listener->close().wait();
  } catch (const std::exception&) {
    // Closing a listener that failed is not worth reporting at shutdown.
  }
  impl_->listener.reset();
}

namespace {

/// A probe's answer: 200 "ok" while `why_not` says nothing (or is none), else 503 and why.
HttpReply ProbeReply(const std::function<std::string()>& why_not) {
  const std::string reason = why_not ? why_not() : "";
  return reason.empty() ? HttpReply{200, "text/plain; charset=utf-8", "ok\n"}
                        : HttpReply{503, "text/plain; charset=utf-8", reason + "\n"};
}

}  // namespace

Status ProbeAndMetricsServers::Start(const std::string& metrics_bind,
                                     std::function<std::string()> render,
                                     const std::string& health_bind,
                                     std::function<std::string()> not_ready,
                                     std::function<std::string()> not_live) {
  if (metrics_bind != "0") {
    metrics_ = std::make_unique<HttpServer>(std::map<std::string, HttpServer::Handler>{
        {"/metrics", [render] {
           return HttpReply{200, "text/plain; version=0.0.4; charset=utf-8", render()};
         }}});
    RETURN_IF_ERROR(metrics_->Serve(metrics_bind).WithContext("--metrics-bind-address"));
  }
  if (health_bind != "0") {
    health_ = std::make_unique<HttpServer>(std::map<std::string, HttpServer::Handler>{
        {"/healthz", [not_live] { return ProbeReply(not_live); }},
        {"/readyz", [not_ready] { return ProbeReply(not_ready); }}});
    RETURN_IF_ERROR(health_->Serve(health_bind).WithContext("--health-probe-bind-address"));
  }
  return OkStatus();
}

}  // namespace hydra::http
