#include "controller/kube/watcher.h"

#include <algorithm>

namespace hydra::kube {

std::string ObjectKey(const Json& object) {
  const auto& md = object["metadata"];
  const std::string ns = md.value("namespace", "");
  const std::string name = md.value("name", "");
  return ns.empty() ? name : ns + "/" + name;
}

Watcher::Watcher(KubeClientInterface* client, ResourceKind kind, std::string ns, Handler handler,
                 WatcherOptions options)
    : client_(client),
      kind_(std::move(kind)),
      ns_(std::move(ns)),
      handler_(std::move(handler)),
      options_(std::move(options)) {}

Watcher::~Watcher() { Stop(); }

void Watcher::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread(&Watcher::Run, this);
}

void Watcher::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Status Watcher::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

std::map<std::string, Json> Watcher::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_;
}

Status Watcher::Relist() {
  ASSIGN_OR_RETURN(Json list, client_->List(kind_, ns_, options_.label_selector));
  ++lists_;
  std::map<std::string, Json> fresh;
  for (auto& item : list["items"]) fresh[ObjectKey(item)] = item;
  std::map<std::string, Json> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = store_;
    store_ = fresh;
  }
  // The difference to what the handler saw: deletions first, then additions and changes.
  for (const auto& [key, object] : old) {
    if (!fresh.count(key) && !stop_) handler_("DELETED", object);
  }
  for (const auto& [key, object] : fresh) {
    if (stop_) break;
    auto it = old.find(key);
    if (it == old.end()) {
      handler_("ADDED", object);
    } else if (it->second["metadata"].value("resourceVersion", "") !=
               object["metadata"].value("resourceVersion", "")) {
      handler_("MODIFIED", object);
    }
  }
  resource_version_ = list["metadata"].value("resourceVersion", "");
  synced_ = true;
  return OkStatus();
}

void Watcher::Run() {
  auto backoff = options_.initial_backoff;
  // A restarted watcher resumes from where it stopped (and relists if that expired).
  bool need_list = resource_version_.empty();
  auto record = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = s;
  };
  auto sleep = [&](std::chrono::milliseconds d) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (!stop_ && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  while (!stop_) {
    if (need_list) {
      Status s = Relist();
      record(s);
      if (!s.ok()) {
        sleep(backoff);
        backoff = std::min(backoff * 2, options_.max_backoff);
        continue;
      }
      need_list = false;
      backoff = options_.initial_backoff;
    }
    Status s = client_->WatchOnce(
        kind_, ns_, resource_version_, options_.watch_timeout_seconds,
        [&](const WatchEvent& e) {
          if (stop_) return false;
          const std::string rv = e.object["metadata"].value("resourceVersion", "");
          if (e.type == "BOOKMARK") {
            if (!rv.empty()) resource_version_ = rv;
            return true;
          }
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (e.type == "DELETED") {
              store_.erase(ObjectKey(e.object));
            } else {
              store_[ObjectKey(e.object)] = e.object;
            }
          }
          if (!rv.empty()) resource_version_ = rv;
          handler_(e.type, e.object);
          return true;
        },
        &stop_);
    if (stop_) break;
    record(s);
    if (s.ok()) {
      backoff = options_.initial_backoff;  // the server ended the watch: resume at once
    } else if (IsGone(s)) {
      ++expired_;
      need_list = true;  // our resourceVersion expired: relist and report the difference
    } else {
      sleep(backoff);
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }
}

}  // namespace hydra::kube
