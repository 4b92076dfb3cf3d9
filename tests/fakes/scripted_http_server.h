#pragma once

// cpprestsdk's U() macro breaks GoogleTest unless turned off.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_listener.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/fakes/subprocess.h"

namespace hydra::fakes {

namespace http = web::http;

/// Answers requests from a script: each entry is (status, body, extra headers).
class ScriptedServer {
 public:
  struct Reply {
    int status;
    std::string body;
    std::map<std::string, std::string> headers;
  };
  ScriptedServer() {
    port_ = FreePort();
    listener_ = std::make_unique<http::experimental::listener::http_listener>(
        "http://127.0.0.1:" + std::to_string(port_));
    listener_->support([this](http::http_request req) {
      Reply r{500, "{}", {}};
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(req.method() + " " + req.request_uri().to_string());
        if (!script_.empty()) {
          r = script_.front();
          script_.pop_front();
        }
      }
      http::http_response resp(static_cast<http::status_code>(r.status));
      for (const auto& [k, v] : r.headers) resp.headers().add(k, v);
      resp.set_body(r.body, "application/json");
      req.reply(resp).wait();
    });
    listener_->open().wait();
  }
  ~ScriptedServer() { listener_->close().wait(); }
  void Push(int status, std::string body, std::map<std::string, std::string> headers = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    script_.push_back({status, std::move(body), std::move(headers)});
  }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  std::unique_ptr<http::experimental::listener::http_listener> listener_;
  std::mutex mu_;
  std::deque<Reply> script_;
  std::vector<std::string> requests_;
};

}  // namespace hydra::fakes
