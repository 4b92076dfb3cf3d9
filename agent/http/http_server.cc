#include "agent/http/http_server.h"

#include <cpprest/http_listener.h>

namespace hydra::agent {

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

}  // namespace hydra::agent
