#include "controller/kube/kube_client.h"

// cpprestsdk's U() macro collides with other headers; we use plain std::string throughout.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>

#include <boost/asio/ssl.hpp>
#include <thread>

namespace hydra::kube {
namespace {

namespace http = web::http;
using Clock = std::chrono::steady_clock;

std::string Reason(int code) {
  switch (code) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "HTTP " + std::to_string(code);
  }
}

/// The Status object the API server sends with an error, as a hydra Status.
Status ApiError(const std::string& what, int code, const std::string& body) {
  std::string message = body, reason;
  auto j = Json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    message = j.value("message", body);
    reason = j.value("reason", "");
  }
  const std::string text = what + ": " + std::to_string(code) + " " + Reason(code) + ": " + message;
  switch (code) {
    case 400:
    case 422: return InvalidArgumentError(text);
    case 401:
    case 403: return PermissionDeniedError(text);
    case 404: return NotFoundError(text);
    case 409:
      return reason == "AlreadyExists" ? AlreadyExistsError(text)
                                       : Status(StatusCode::kAborted, text);
    case 410: return Status(StatusCode::kOutOfRange, text);
    case 429: return ResourceExhaustedError(text);
    case 504: return Status(StatusCode::kDeadlineExceeded, text);
    default:
      if (code >= 500) return UnavailableError(text);
      return Status(StatusCode::kUnknown, text);
  }
}

bool HasPem(const std::string& text) { return text.find("-----BEGIN") != std::string::npos; }

std::string PatchContentType(PatchType type) {
  switch (type) {
    case PatchType::kMerge: return "application/merge-patch+json";
    case PatchType::kJson: return "application/json-patch+json";
    case PatchType::kStrategicMerge: return "application/strategic-merge-patch+json";
  }
  return "application/merge-patch+json";
}

}  // namespace

struct KubeClient::Impl {
  KubeConfig config;
  std::unique_ptr<TokenFile> token_file;  // set when the token comes from a file
  RetryPolicy retry;
  http::client::http_client_config http_config;
  std::unique_ptr<http::client::http_client> client;
  std::atomic<int64_t> requests{0};

  http::http_request NewRequest(const std::string& method, const std::string& path_and_query) {
    http::http_request req(method);
    req.set_request_uri(path_and_query);
    req.headers().add("Accept", "application/json");
    req.headers().add("User-Agent", "hydra-controller");
    const std::string token = token_file ? token_file->Current() : config.bearer_token;
    if (!token.empty()) req.headers().add("Authorization", "Bearer " + token);
    return req;
  }

  std::chrono::milliseconds Backoff(int attempt, const http::http_response* resp) const {
    if (resp) {
      auto it = resp->headers().find("Retry-After");
      if (it != resp->headers().end()) {
        try {
          return std::chrono::milliseconds(static_cast<int64_t>(std::stod(it->second) * 1000));
        } catch (...) {
          // An HTTP date instead of seconds: fall back to our own backoff.
        }
      }
    }
    auto d = retry.initial * (1 << std::min(attempt, 16));
    return std::min<std::chrono::milliseconds>(d, retry.max);
  }

  StatusOr<Json> Do(const std::string& method, const std::string& path_and_query, const Json& body,
                    const std::string& content_type) {
    const std::string what = method + " " + path_and_query;
    const std::string payload = body.is_null() ? "" : body.dump();
    for (int attempt = 0;; ++attempt) {
      const bool last = attempt + 1 >= std::max(1, retry.attempts);
      auto req = NewRequest(method, path_and_query);
      if (!body.is_null()) req.set_body(payload, content_type);
      ++requests;
      try {
        http::http_response resp = client->request(req).get();
        const int code = resp.status_code();
        std::string text = resp.extract_utf8string(true).get();
        if (code < 300) {
          if (text.empty()) return Json(nullptr);
          auto j = Json::parse(text, nullptr, false);
          if (j.is_discarded()) return InternalError(what + ": the server's answer is not JSON");
          return j;
        }
        if ((code == 429 || code >= 500) && !last) {
          std::this_thread::sleep_for(Backoff(attempt, &resp));
          continue;
        }
        return ApiError(what, code, text);
      } catch (const std::exception& e) {
        if (!last) {
          std::this_thread::sleep_for(Backoff(attempt, nullptr));
          continue;
        }
        return UnavailableError(what + " on " + config.server + ": " + e.what());
      }
    }
  }
};

KubeClient::KubeClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KubeClient::~KubeClient() = default;

const KubeConfig& KubeClient::config() const { return impl_->config; }
int64_t KubeClient::requests() const { return impl_->requests.load(); }

StatusOr<std::unique_ptr<KubeClient>> KubeClient::Create(const KubeConfig& config,
                                                         RetryPolicy retry) {
  if (config.server.rfind("https://", 0) != 0 && config.server.rfind("http://", 0) != 0) {
    return InvalidArgumentError("server " + config.server + " (from " + config.source +
                                ") is not an http(s) URL");
  }
  if (!config.ca_pem.empty() && !HasPem(config.ca_pem)) {
    return InvalidArgumentError("the CA of " + config.source + " is not PEM");
  }
  if (!config.client_cert_pem.empty() &&
      (!HasPem(config.client_cert_pem) || !HasPem(config.client_key_pem))) {
    return InvalidArgumentError("the client certificate or key of " + config.source +
                                " is not PEM");
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (!config.token_file.empty()) {
    impl->token_file = std::make_unique<TokenFile>(config.token_file, config.bearer_token);
  }
  impl->retry = retry;
  impl->http_config.set_timeout(std::chrono::seconds(60));
  impl->http_config.set_validate_certificates(!config.insecure_skip_tls_verify);
  const std::string ca = config.ca_pem, cert = config.client_cert_pem, key = config.client_key_pem;
  impl->http_config.set_ssl_context_callback([ca, cert, key](boost::asio::ssl::context& ctx) {
    if (!ca.empty()) ctx.add_certificate_authority(boost::asio::buffer(ca));
    if (!cert.empty()) {
      ctx.use_certificate_chain(boost::asio::buffer(cert));
      ctx.use_private_key(boost::asio::buffer(key), boost::asio::ssl::context::pem);
    }
  });
  try {
    impl->client = std::make_unique<http::client::http_client>(config.server, impl->http_config);
  } catch (const std::exception& e) {
    return InvalidArgumentError("server " + config.server + ": " + e.what());
  }
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(impl)));
}

std::string KubeClient::Path(const ResourceKind& kind, const std::string& ns,
                             const std::string& name, const std::string& subresource) {
  std::string p =
      kind.group.empty() ? "/api/" + kind.version : "/apis/" + kind.group + "/" + kind.version;
  if (kind.namespaced && !ns.empty()) p += "/namespaces/" + ns;
  p += "/" + kind.plural;
  if (!name.empty()) p += "/" + name;
  if (!subresource.empty()) p += "/" + subresource;
  return p;
}

StatusOr<Json> KubeClient::Request(const std::string& method, const std::string& path_and_query,
                                   const Json& body, const std::string& content_type) {
  return impl_->Do(method, path_and_query, body, content_type);
}

StatusOr<Json> KubeClient::Get(const ResourceKind& kind, const std::string& ns,
                               const std::string& name) {
  return impl_->Do("GET", Path(kind, ns, name), nullptr, "");
}

StatusOr<Json> KubeClient::List(const ResourceKind& kind, const std::string& ns,
                                const std::string& label_selector, int64_t page_size) {
  Json all;
  std::string cont;
  do {
    std::string q = Path(kind, ns) + "?limit=" + std::to_string(page_size);
    if (!label_selector.empty()) {
      q += "&labelSelector=" + web::uri::encode_data_string(label_selector);
    }
    if (!cont.empty()) q += "&continue=" + web::uri::encode_data_string(cont);
    ASSIGN_OR_RETURN(Json page, impl_->Do("GET", q, nullptr, ""));
    if (all.is_null()) {
      all = page;  // its metadata.resourceVersion is the snapshot the pages belong to
      if (!all.contains("items") || all["items"].is_null()) all["items"] = Json::array();
    } else {
      for (auto& item : page["items"]) all["items"].push_back(std::move(item));
    }
    cont = page["metadata"].value("continue", "");
  } while (!cont.empty());
  all["metadata"].erase("continue");
  return all;
}

StatusOr<Json> KubeClient::Create(const ResourceKind& kind, const std::string& ns,
                                  const Json& object) {
  return impl_->Do("POST", Path(kind, ns), object, "application/json");
}

StatusOr<Json> KubeClient::Update(const ResourceKind& kind, const std::string& ns,
                                  const Json& object) {
  const std::string name = object["metadata"].value("name", "");
  return impl_->Do("PUT", Path(kind, ns, name), object, "application/json");
}

StatusOr<Json> KubeClient::UpdateStatus(const ResourceKind& kind, const std::string& ns,
                                        const Json& object) {
  const std::string name = object["metadata"].value("name", "");
  return impl_->Do("PUT", Path(kind, ns, name, "status"), object, "application/json");
}

Status KubeClient::Delete(const ResourceKind& kind, const std::string& ns,
                          const std::string& name) {
  auto r = impl_->Do("DELETE", Path(kind, ns, name), nullptr, "");
  return r.status();
}

StatusOr<Json> KubeClient::Patch(const ResourceKind& kind, const std::string& ns,
                                 const std::string& name, PatchType type, const Json& patch,
                                 const std::string& subresource) {
  return impl_->Do("PATCH", Path(kind, ns, name, subresource), patch, PatchContentType(type));
}

StatusOr<Json> KubeClient::Apply(const ResourceKind& kind, const std::string& ns,
                                 const Json& object, const std::string& field_manager, bool force,
                                 const std::string& subresource) {
  const std::string name = object["metadata"].value("name", "");
  std::string q = Path(kind, ns, name, subresource) +
                  "?fieldManager=" + web::uri::encode_data_string(field_manager);
  if (force) q += "&force=true";
  // JSON is YAML: the apply content type takes either.
  return impl_->Do("PATCH", q, object, "application/apply-patch+yaml");
}

Status KubeClient::WatchOnce(const ResourceKind& kind, const std::string& ns,
                             const std::string& resource_version, int timeout_seconds,
                             const std::function<bool(const WatchEvent&)>& on_event,
                             const std::atomic<bool>* stop) {
  std::string q = Path(kind, ns) + "?watch=true&allowWatchBookmarks=true&timeoutSeconds=" +
                  std::to_string(timeout_seconds);
  if (!resource_version.empty()) q += "&resourceVersion=" + resource_version;
  const std::string what = "GET " + q;
  // The stream is quiet between events: allow the whole watch plus a margin before the HTTP
  // client gives up.
  http::client::http_client_config cfg = impl_->http_config;
  cfg.set_timeout(std::chrono::seconds(timeout_seconds + 30));
  pplx::cancellation_token_source cts;
  std::atomic<bool> finished{false};
  std::thread canceller([&] {
    while (!finished.load()) {
      if (stop && stop->load()) {
        cts.cancel();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto done = [&](Status s) {
    finished = true;
    canceller.join();
    return s;
  };
  try {
    http::client::http_client client(impl_->config.server, cfg);
    ++impl_->requests;
    http::http_response resp = client.request(impl_->NewRequest("GET", q), cts.get_token()).get();
    if (resp.status_code() >= 300) {
      return done(ApiError(what, resp.status_code(), resp.extract_utf8string(true).get()));
    }
    auto body = resp.body();
    while (true) {
      concurrency::streams::stringstreambuf line;
      const size_t n = body.read_line(line).get();
      if (n == 0 && body.is_eof()) return done(OkStatus());  // the server ended the watch
      const std::string& text = line.collection();
      if (text.empty()) continue;
      auto j = Json::parse(text, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        return done(InternalError(what + ": a watch event that is not JSON"));
      }
      WatchEvent e{j.value("type", ""), j["object"]};
      if (e.type == "ERROR") {
        const int code = e.object.value("code", 500);
        return done(ApiError(what, code, e.object.dump()));
      }
      if (!on_event(e)) return done(OkStatus());
    }
  } catch (const std::exception& e) {
    if (stop && stop->load()) return done(OkStatus());
    return done(UnavailableError(what + ": " + e.what()));
  }
}

}  // namespace hydra::kube
