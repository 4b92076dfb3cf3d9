#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "controller/kube/kube_client_interface.h"

namespace hydra::fakes {

/// An in-memory API server for unit tests of one controller component: objects by kind,
/// namespace and name, with uids, resourceVersions (one counter, as etcd's revision), optimistic
/// concurrency on Update, a status subresource for kinds that have one, generation bumps on spec
/// changes, equality label selectors, finalizers and graceful deletion of pods bound to a node
/// (they keep a deletionTimestamp until `FinishDeletion`, as a kubelet would). Failures can be
/// injected per verb and kind. Server-side apply and watches are not faked (UNIMPLEMENTED).
class FakeKubeClient : public kube::KubeClientInterface {
 public:
  using Json = kube::Json;

  StatusOr<Json> Get(const kube::ResourceKind& kind, const std::string& ns,
                     const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Count("get", kind));
    auto it = objects_.find(Key(kind, ns, name));
    if (it == objects_.end()) return NotFound(kind, name);
    return it->second;
  }

  StatusOr<Json> List(const kube::ResourceKind& kind, const std::string& ns,
                      const std::string& label_selector = "", int64_t = 500) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Count("list", kind));
    Json items = Json::array();
    for (const auto& [key, object] : objects_) {
      const auto& [plural, object_ns, name] = key;
      if (plural != kind.plural || (!ns.empty() && object_ns != ns)) continue;
      if (Matches(object, label_selector)) items.push_back(object);
    }
    return Json{{"kind", "List"},
                {"metadata", {{"resourceVersion", std::to_string(revision_)}}},
                {"items", items}};
  }

  StatusOr<Json> Create(const kube::ResourceKind& kind, const std::string& ns,
                        const Json& object) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Count("create", kind));
    Json o = object;
    auto& md = o["metadata"];
    if (!md.contains("name") && md.contains("generateName")) {
      md["name"] = md["generateName"].get<std::string>() + std::to_string(++generated_);
    }
    const std::string name = md.value("name", "");
    if (name.empty()) return InvalidArgumentError("create " + kind.plural + ": name is required");
    const auto key = Key(kind, ns, name);
    if (objects_.count(key)) {
      return AlreadyExistsError("POST " + kind.plural + ": 409 Conflict: " + kind.plural + " \"" +
                                name + "\" already exists");
    }
    if (kind.namespaced) md["namespace"] = ns;
    md["uid"] = "uid-" + std::to_string(++generated_);
    md["generation"] = 1;
    md["creationTimestamp"] = "2026-01-01T00:00:00Z";
    if (HasStatusSubresource(kind)) o.erase("status");  // a create sets no status
    if (kind.plural == "pods") o["status"] = {{"phase", "Pending"}};
    md["resourceVersion"] = std::to_string(++revision_);
    objects_[key] = o;
    return o;
  }

  StatusOr<Json> Update(const kube::ResourceKind& kind, const std::string& ns,
                        const Json& object) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Count("update", kind));
    return Store(kind, ns, object, /*status_only=*/false);
  }

  StatusOr<Json> UpdateStatus(const kube::ResourceKind& kind, const std::string& ns,
                              const Json& object) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Count("update_status", kind));
    return Store(kind, ns, object, /*status_only=*/true);
  }

  Status Delete(const kube::ResourceKind& kind, const std::string& ns,
                const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Count("delete", kind));
    auto it = objects_.find(Key(kind, ns, name));
    if (it == objects_.end()) return NotFound(kind, name);
    Json& o = it->second;
    const bool finalizers = !o["metadata"].value("finalizers", Json::array()).empty();
    const bool on_node = kind.plural == "pods" && !o["spec"].value("nodeName", "").empty();
    if (!finalizers && !on_node) {
      objects_.erase(it);
      return OkStatus();
    }
    if (!o["metadata"].contains("deletionTimestamp")) {
      o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z";
      o["metadata"]["resourceVersion"] = std::to_string(++revision_);
    }
    return OkStatus();
  }

  StatusOr<Json> Patch(const kube::ResourceKind& kind, const std::string& ns,
                       const std::string& name, kube::PatchType type, const Json& patch,
                       const std::string& subresource = "") override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(Count("patch", kind));
    if (type != kube::PatchType::kMerge) return UnimplementedError("the fake merges patches only");
    auto it = objects_.find(Key(kind, ns, name));
    if (it == objects_.end()) return NotFound(kind, name);
    Json o = it->second;
    o.merge_patch(patch);
    o["metadata"]["resourceVersion"] = std::to_string(++revision_);
    it->second = o;
    return o;
  }

  StatusOr<Json> Apply(const kube::ResourceKind&, const std::string&, const Json&,
                       const std::string&, bool = true, const std::string& = "") override {
    return UnimplementedError("the fake has no server-side apply");
  }

  Status WatchOnce(const kube::ResourceKind&, const std::string&, const std::string&, int,
                   const std::function<bool(const kube::WatchEvent&)>&,
                   const std::atomic<bool>* = nullptr) override {
    return UnimplementedError("the fake has no watches");
  }

  int64_t requests() const override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const auto& [k, v] : calls_) n += v;
    return n;
  }

  // --- test controls ---

  /// Puts an object as it is (a fixture), with a fresh resourceVersion.
  Json Put(const kube::ResourceKind& kind, const std::string& ns, Json object) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& md = object["metadata"];
    if (kind.namespaced) md["namespace"] = ns;
    if (!md.contains("uid")) md["uid"] = "uid-" + std::to_string(++generated_);
    md["resourceVersion"] = std::to_string(++revision_);
    objects_[Key(kind, ns, md.value("name", ""))] = object;
    return object;
  }
  /// The stored object, or null.
  Json Peek(const kube::ResourceKind& kind, const std::string& ns, const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(Key(kind, ns, name));
    return it == objects_.end() ? Json() : it->second;
  }
  /// Names of the stored objects of a kind in a namespace, sorted.
  std::vector<std::string> Names(const kube::ResourceKind& kind, const std::string& ns) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [key, o] : objects_) {
      if (std::get<0>(key) == kind.plural && std::get<1>(key) == ns)
        out.push_back(std::get<2>(key));
    }
    return out;
  }
  /// Removes an object at once (a kubelet finishing a pod's deletion, the garbage collector).
  void FinishDeletion(const kube::ResourceKind& kind, const std::string& ns,
                      const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.erase(Key(kind, ns, name));
  }
  /// The next `verb` ("get", "list", "create", "update", "update_status", "delete", "patch") on
  /// `kind` fails with `status`.
  void FailNext(const std::string& verb, const kube::ResourceKind& kind, Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[{verb, kind.plural}].push_back(std::move(status));
  }
  /// Calls of `verb` on `kind` so far (failed ones included).
  int64_t Calls(const std::string& verb, const kube::ResourceKind& kind) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find({verb, kind.plural});
    return it == calls_.end() ? 0 : it->second;
  }

 private:
  using ObjectKey = std::tuple<std::string, std::string, std::string>;  // plural, ns, name

  ObjectKey Key(const kube::ResourceKind& kind, const std::string& ns,
                const std::string& name) const {
    return {kind.plural, kind.namespaced ? ns : "", name};
  }
  static bool HasStatusSubresource(const kube::ResourceKind& kind) {
    return kind.plural == "multimodeljobs" || kind.plural == "pods";
  }
  static Status NotFound(const kube::ResourceKind& kind, const std::string& name) {
    return NotFoundError("GET " + kind.plural + "/" + name + ": 404 Not Found: " + kind.plural +
                         " \"" + name + "\" not found");
  }
  Status Count(const std::string& verb, const kube::ResourceKind& kind) {
    ++calls_[{verb, kind.plural}];
    auto it = failures_.find({verb, kind.plural});
    if (it == failures_.end() || it->second.empty()) return OkStatus();
    Status s = it->second.front();
    it->second.pop_front();
    return s;
  }
  /// "a=b,c=d" (and "a!=b", "a" for presence) against metadata.labels.
  static bool Matches(const Json& object, const std::string& selector) {
    const Json labels = object["metadata"].value("labels", Json::object());
    std::stringstream terms(selector);
    for (std::string term; std::getline(terms, term, ',');) {
      if (term.empty()) continue;
      const auto neq = term.find("!=");
      const auto eq = term.find('=');
      if (neq != std::string::npos) {
        const std::string k = term.substr(0, neq), v = term.substr(neq + 2);
        if (labels.value(k, "") == v) return false;
      } else if (eq != std::string::npos) {
        const std::string k = term.substr(0, eq), v = term.substr(eq + 1);
        if (!labels.contains(k) || labels[k] != v) return false;
      } else if (!labels.contains(term)) {
        return false;
      }
    }
    return true;
  }
  StatusOr<Json> Store(const kube::ResourceKind& kind, const std::string& ns, const Json& object,
                       bool status_only) {
    const std::string name = object["metadata"].value("name", "");
    auto it = objects_.find(Key(kind, ns, name));
    if (it == objects_.end()) return NotFound(kind, name);
    Json& stored = it->second;
    const std::string rv = object["metadata"].value("resourceVersion", "");
    if (!rv.empty() && rv != stored["metadata"].value("resourceVersion", "")) {
      return Status(StatusCode::kAborted, "PUT " + kind.plural + "/" + name +
                                              ": 409 Conflict: the object has been modified");
    }
    Json next = stored;
    if (status_only) {
      next["status"] = object.value("status", Json::object());
    } else {
      next = object;
      next["metadata"]["uid"] = stored["metadata"]["uid"];
      next["metadata"]["generation"] = stored["metadata"].value("generation", 1);
      if (stored["metadata"].contains("deletionTimestamp")) {
        next["metadata"]["deletionTimestamp"] = stored["metadata"]["deletionTimestamp"];
      }
      if (HasStatusSubresource(kind)) next["status"] = stored.value("status", Json());
      if (next.value("spec", Json()) != stored.value("spec", Json())) {
        next["metadata"]["generation"] = next["metadata"]["generation"].get<int64_t>() + 1;
      }
      if (next["status"].is_null()) next.erase("status");
    }
    next["metadata"]["resourceVersion"] = std::to_string(++revision_);
    if (next["metadata"].contains("deletionTimestamp") &&
        next["metadata"].value("finalizers", Json::array()).empty() &&
        !(kind.plural == "pods" && !next["spec"].value("nodeName", "").empty())) {
      objects_.erase(it);  // the last finalizer is gone
      return next;
    }
    stored = next;
    return next;
  }

  mutable std::mutex mu_;
  std::map<ObjectKey, Json> objects_;
  int64_t revision_ = 100, generated_ = 0;
  std::map<std::pair<std::string, std::string>, int64_t> calls_;
  std::map<std::pair<std::string, std::string>, std::deque<Status>> failures_;
};

}  // namespace hydra::fakes
