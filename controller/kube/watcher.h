#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "controller/kube/kube_client_interface.h"

namespace hydra::kube {

struct WatcherOptions {
  int watch_timeout_seconds = 300;                 ///< each watch request; the watcher then resumes
  std::chrono::milliseconds initial_backoff{200};  ///< after a failed list or watch, doubling
  std::chrono::milliseconds max_backoff{10000};
  std::string label_selector;
};

/// Keeps a view of one resource type in sync, as client-go's reflector does: list, then watch
/// from the list's resourceVersion with bookmarks; after a dropped connection resume from the
/// last resourceVersion seen (with backoff); when the server says the version expired
/// (410 Gone) relist and report the difference (ADDED / MODIFIED / DELETED for what changed
/// meanwhile), so a handler misses nothing. Events reach the handler in order, on the
/// watcher's thread.
class Watcher {
 public:
  /// Called with ADDED, MODIFIED or DELETED and the object (for DELETED: its last state).
  using Handler = std::function<void(const std::string& type, const Json& object)>;

  /// `client` is borrowed. `ns` empty: all namespaces.
  Watcher(KubeClientInterface* client, ResourceKind kind, std::string ns, Handler handler,
          WatcherOptions options = {});
  ~Watcher();

  void Start();
  /// Stops after the current request; the handler is not called afterwards.
  void Stop();

  /// True once the first list was delivered.
  bool synced() const { return synced_.load(); }
  /// Times the watcher listed (1 + relists after 410 Gone).
  int lists() const { return lists_.load(); }
  /// Watches the server answered 410 Gone (the resourceVersion was compacted away): each one
  /// is followed by a relist.
  int expired() const { return expired_.load(); }
  /// The last error a list or watch returned (OK if none since the last success).
  Status last_error() const;
  /// The objects as last seen, by "namespace/name".
  std::map<std::string, Json> Snapshot() const;

 private:
  void Run();
  Status Relist();

  KubeClientInterface* client_;
  ResourceKind kind_;
  std::string ns_;
  Handler handler_;
  WatcherOptions options_;
  std::atomic<bool> stop_{false}, synced_{false};
  std::atomic<int> lists_{0}, expired_{0};
  std::string resource_version_;
  mutable std::mutex mu_;  // guards store_, last_error_
  std::map<std::string, Json> store_;
  Status last_error_;
  std::thread thread_;
};

/// "namespace/name" (or "name" for cluster-scoped objects).
std::string ObjectKey(const Json& object);

}  // namespace hydra::kube
