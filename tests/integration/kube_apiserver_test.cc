// controller/kube against a real kube-apiserver and etcd on loopback (tests/envtest/up): CRUD
// on core and custom resources, watches (in order; resumed from an expired resourceVersion),
// conflicts, leader election on a Lease, Events, and RBAC denial for a service account.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "controller/kube/events.h"
#include "controller/kube/kube_client.h"
#include "controller/kube/kube_config.h"
#include "controller/kube/leader_election.h"
#include "controller/kube/watcher.h"
#include "tests/fakes/subprocess.h"

namespace hydra::kube {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

const std::string kEnvtest = std::string(HYDRA_SOURCE_DIR) + "/tests/envtest";
const ResourceKind kWidgets{"test.hydra.dev", "v1", "widgets", true};

/// One control plane for the whole suite; the watch cache is off and etcd compacts every 2 s,
/// so that an old resourceVersion really expires (410 Gone) within the test.
class KubeClientIntegrationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("hydra-envtest-it-" + std::to_string(::getpid()));
    const std::string cmd = kEnvtest + "/up --dir " + dir_.string() +
                            " --apiserver-arg=--watch-cache=false"
                            " --apiserver-arg=--etcd-compaction-interval=2s 2>" +
                            (dir_.string() + ".up.log");
    std::fprintf(stderr, "starting the test control plane: %s\n", cmd.c_str());
    up_ok_ = std::system(cmd.c_str()) == 0;
    if (!up_ok_) {
      std::fprintf(stderr, "%s\n", fakes::Slurp(dir_.string() + ".up.log").c_str());
      return;
    }
    auto config = LoadKubeconfig((dir_ / "kubeconfig").string());
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      up_ok_ = false;
      return;
    }
    admin_config_ = new KubeConfig(*config);
    auto client = KubeClient::Create(*config);
    admin_ = client.ok() ? client->release() : nullptr;
  }
  static void TearDownTestSuite() {
    delete admin_;
    admin_ = nullptr;
    delete admin_config_;
    std::system((kEnvtest + "/down --dir " + dir_.string() + " 2>/dev/null").c_str());
    fs::remove(dir_.string() + ".up.log");
  }
  void SetUp() override {
    ASSERT_TRUE(up_ok_ && admin_) << "the test control plane did not start";
    ns_ = "t-" + std::to_string(counter_++) + "-" + std::to_string(::getpid());
    auto created = admin_->Create(
        kNamespaces, "",
        {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns_}}}});
    ASSERT_TRUE(created.ok()) << created.status();
  }

  static Json ConfigMap(const std::string& name, const std::string& value) {
    return {{"apiVersion", "v1"},
            {"kind", "ConfigMap"},
            {"metadata", {{"name", name}}},
            {"data", {{"value", value}}}};
  }

  static inline fs::path dir_;
  static inline bool up_ok_ = false;
  static inline KubeConfig* admin_config_ = nullptr;
  static inline KubeClient* admin_ = nullptr;
  static inline int counter_ = 0;
  std::string ns_;
};

TEST_F(KubeClientIntegrationTest, CoreResourceCrudPatchApplyAndPaging) {
  auto& c = *admin_;
  auto created = c.Create(kConfigMaps, ns_, ConfigMap("one", "1"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(c.Create(kConfigMaps, ns_, ConfigMap("one", "1")).status().code(),
            StatusCode::kAlreadyExists);
  auto got = c.Get(kConfigMaps, ns_, "one");
  ASSERT_TRUE(got.ok());
  (*got)["data"]["value"] = "2";
  auto updated = c.Update(kConfigMaps, ns_, *got);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ((*updated)["data"]["value"], "2");
  auto merged = c.Patch(kConfigMaps, ns_, "one", PatchType::kMerge, {{"data", {{"extra", "x"}}}});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ((*merged)["data"]["extra"], "x");
  auto json_patched =
      c.Patch(kConfigMaps, ns_, "one", PatchType::kJson,
              Json::array({{{"op", "replace"}, {"path", "/data/value"}, {"value", "3"}}}));
  ASSERT_TRUE(json_patched.ok()) << json_patched.status();
  EXPECT_EQ((*json_patched)["data"]["value"], "3");
  auto applied = c.Apply(kConfigMaps, ns_, ConfigMap("applied", "a"), "hydra-test");
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ((*applied)["metadata"]["managedFields"][0]["manager"], "hydra-test");
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("page-" + std::to_string(i), "p")).ok());
  }
  auto list = c.List(kConfigMaps, ns_, "", 3);  // three pages and a bit
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_GE((*list)["items"].size(), 9u);
  EXPECT_FALSE((*list)["metadata"].value("resourceVersion", "").empty());
  ASSERT_TRUE(c.Delete(kConfigMaps, ns_, "one").ok());
  EXPECT_EQ(c.Get(kConfigMaps, ns_, "one").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c.Delete(kConfigMaps, ns_, "one").code(), StatusCode::kNotFound);
}

TEST_F(KubeClientIntegrationTest, CustomResourceCrudWithStatusSubresource) {
  auto& c = *admin_;
  Json crd = {
      {"apiVersion", "apiextensions.k8s.io/v1"},
      {"kind", "CustomResourceDefinition"},
      {"metadata", {{"name", "widgets.test.hydra.dev"}}},
      {"spec",
       {{"group", "test.hydra.dev"},
        {"scope", "Namespaced"},
        {"names", {{"plural", "widgets"}, {"singular", "widget"}, {"kind", "Widget"}}},
        {"versions",
         Json::array({{{"name", "v1"},
                       {"served", true},
                       {"storage", true},
                       {"subresources", {{"status", Json::object()}}},
                       {"schema",
                        {{"openAPIV3Schema",
                          {{"type", "object"},
                           {"properties",
                            {{"spec",
                              {{"type", "object"},
                               {"properties", {{"size", {{"type", "integer"}, {"minimum", 1}}}}}}},
                             {"status",
                              {{"type", "object"},
                               {"properties", {{"phase", {{"type", "string"}}}}}}}}}}}}}}})}}}};
  auto made = c.Create(kCustomResourceDefinitions, "", crd);
  ASSERT_TRUE(made.ok() || made.status().code() == StatusCode::kAlreadyExists) << made.status();
  // Wait until the new type is served.
  StatusOr<Json> list = UnavailableError("not yet");
  for (int i = 0; i < 100 && !list.ok(); ++i) {
    list = c.List(kWidgets, ns_);
    if (!list.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(list.ok()) << list.status();
  Json w = {{"apiVersion", "test.hydra.dev/v1"},
            {"kind", "Widget"},
            {"metadata", {{"name", "w1"}}},
            {"spec", {{"size", 3}}}};
  ASSERT_TRUE(c.Create(kWidgets, ns_, w).ok());
  w["metadata"]["name"] = "bad";
  w["spec"]["size"] = 0;
  auto invalid = c.Create(kWidgets, ns_, w);
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument) << invalid.status();
  EXPECT_THAT(invalid.status().message(), HasSubstr("spec.size"));
  // Status goes through the subresource only.
  auto with_status = c.UpdateWithRetry(
      kWidgets, ns_, "w1",
      [](Json& o) {
        o["status"] = {{"phase", "Ready"}};
        return true;
      },
      5, /*status=*/true);
  ASSERT_TRUE(with_status.ok()) << with_status.status();
  EXPECT_EQ((*with_status)["status"]["phase"], "Ready");
  auto applied_status = c.Apply(kWidgets, ns_,
                                {{"apiVersion", "test.hydra.dev/v1"},
                                 {"kind", "Widget"},
                                 {"metadata", {{"name", "w1"}}},
                                 {"status", {{"phase", "Done"}}}},
                                "hydra-test", true, "status");
  ASSERT_TRUE(applied_status.ok()) << applied_status.status();
  EXPECT_EQ((*c.Get(kWidgets, ns_, "w1"))["status"]["phase"], "Done");
  ASSERT_TRUE(c.Delete(kWidgets, ns_, "w1").ok());
}

TEST_F(KubeClientIntegrationTest, ConflictingUpdatesAreDetectedAndRetried) {
  auto& c = *admin_;
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("counter", "0")).ok());
  auto stale = *c.Get(kConfigMaps, ns_, "counter");
  auto fresh = stale;
  fresh["data"]["value"] = "fresh";
  ASSERT_TRUE(c.Update(kConfigMaps, ns_, fresh).ok());
  stale["data"]["value"] = "stale";
  auto lost = c.Update(kConfigMaps, ns_, stale);
  EXPECT_TRUE(IsConflict(lost.status())) << lost.status();
  EXPECT_THAT(lost.status().message(), HasSubstr("409 Conflict"));
  ASSERT_TRUE(
      c.Patch(kConfigMaps, ns_, "counter", PatchType::kMerge, {{"data", {{"value", "0"}}}}).ok());
  // Two writers increment concurrently; every increment survives.
  auto work = [&] {
    for (int i = 0; i < 15; ++i) {
      auto r = c.UpdateWithRetry(
          kConfigMaps, ns_, "counter",
          [](Json& o) {
            o["data"]["value"] =
                std::to_string(std::stoi(o["data"]["value"].get<std::string>()) + 1);
            return true;
          },
          50);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ((*c.Get(kConfigMaps, ns_, "counter"))["data"]["value"], "30");
}

struct Recorder {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> events;  // (type, name)
  void operator()(const std::string& type, const Json& o) {
    std::lock_guard<std::mutex> lock(mu);
    events.emplace_back(type, o["metadata"].value("name", ""));
  }
  std::vector<std::pair<std::string, std::string>> For(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& e : events) {
      if (e.second == name) out.push_back(e);
    }
    return out;
  }
};

bool Eventually(const std::function<bool()>& pred,
                std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

TEST_F(KubeClientIntegrationTest, WatchSeesCreateUpdateDeleteInOrder) {
  auto& c = *admin_;
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("before", "b")).ok());
  Recorder rec;
  WatcherOptions o;
  o.watch_timeout_seconds = 5;  // also exercises resuming after the server ends a watch
  Watcher w(
      &c, kConfigMaps, ns_, [&](const std::string& t, const Json& obj) { rec(t, obj); }, o);
  w.Start();
  ASSERT_TRUE(Eventually([&] { return w.synced(); }));
  EXPECT_EQ(rec.For("before"),
            (std::vector<std::pair<std::string, std::string>>{{"ADDED", "before"}}));
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("x", "1")).ok());
  ASSERT_TRUE(c.Patch(kConfigMaps, ns_, "x", PatchType::kMerge, {{"data", {{"value", "2"}}}}).ok());
  std::this_thread::sleep_for(std::chrono::seconds(6));  // past one watch timeout
  ASSERT_TRUE(c.Patch(kConfigMaps, ns_, "x", PatchType::kMerge, {{"data", {{"value", "3"}}}}).ok());
  ASSERT_TRUE(c.Delete(kConfigMaps, ns_, "x").ok());
  const std::vector<std::pair<std::string, std::string>> want = {
      {"ADDED", "x"}, {"MODIFIED", "x"}, {"MODIFIED", "x"}, {"DELETED", "x"}};
  EXPECT_TRUE(Eventually([&] { return rec.For("x").size() >= 4; }));
  EXPECT_EQ(rec.For("x"), want);
  // A plain resume must not relist. The suite's API server compacts etcd every 2 s without a
  // watch cache, so a resume may find its version compacted (410 Gone); only those may relist.
  EXPECT_EQ(w.lists(), 1 + w.expired()) << "a plain resume must not relist";
  w.Stop();
}

TEST_F(KubeClientIntegrationTest, WatchResumedFromAnExpiredVersionRelistsAndMissesNothing) {
  auto& c = *admin_;
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("keep", "1")).ok());
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("change", "1")).ok());
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("remove", "1")).ok());
  Recorder rec;
  Watcher w(&c, kConfigMaps, ns_, [&](const std::string& t, const Json& obj) { rec(t, obj); });
  w.Start();
  ASSERT_TRUE(Eventually([&] { return w.synced(); }));
  w.Stop();  // the watcher is away (a dropped connection, a paused controller)...
  ASSERT_TRUE(
      c.Patch(kConfigMaps, ns_, "change", PatchType::kMerge, {{"data", {{"value", "2"}}}}).ok());
  ASSERT_TRUE(c.Delete(kConfigMaps, ns_, "remove").ok());
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("new", "1")).ok());
  // ...long enough for etcd to compact its resourceVersion away.
  std::this_thread::sleep_for(std::chrono::seconds(7));
  w.Start();
  ASSERT_TRUE(Eventually([&] { return w.lists() >= 2; })) << w.last_error();
  ASSERT_TRUE(Eventually([&] { return rec.For("new").size() == 1; }));
  EXPECT_EQ(rec.For("change").back().first, "MODIFIED");
  EXPECT_EQ(rec.For("remove").back().first, "DELETED");
  EXPECT_EQ(rec.For("new").back().first, "ADDED");
  EXPECT_EQ(rec.For("keep").size(), 1u) << "unchanged objects are not reported again";
  auto view = w.Snapshot();
  EXPECT_EQ(view.count(ns_ + "/remove"), 0u);
  EXPECT_EQ(view.count(ns_ + "/new"), 1u);
  // And it keeps watching from the new list.
  ASSERT_TRUE(c.Create(kConfigMaps, ns_, ConfigMap("after", "1")).ok());
  EXPECT_TRUE(Eventually([&] { return rec.For("after").size() == 1; }));
  w.Stop();
}

TEST_F(KubeClientIntegrationTest, ExactlyOneLeaderAndAFastTakeoverAfterItStops) {
  LeaderElectionConfig base;
  base.lease_namespace = ns_;
  base.lease_name = "hydra-controller";
  base.lease_duration = std::chrono::milliseconds(3000);
  base.renew_deadline = std::chrono::milliseconds(2000);
  base.retry_period = std::chrono::milliseconds(200);
  auto ca = base, cb = base;
  ca.identity = "candidate-a";
  cb.identity = "candidate-b";
  std::atomic<int> started{0};
  LeaderElector a(
      admin_, ca, [&] { ++started; }, nullptr);
  LeaderElector b(
      admin_, cb, [&] { ++started; }, nullptr);
  a.Start();
  b.Start();
  ASSERT_TRUE(Eventually([&] { return a.IsLeader() || b.IsLeader(); }));
  for (int i = 0; i < 20; ++i) {  // 2 s of both campaigning
    EXPECT_FALSE(a.IsLeader() && b.IsLeader());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(started.load(), 1);
  LeaderElector& leader = a.IsLeader() ? a : b;
  LeaderElector& other = a.IsLeader() ? b : a;
  const std::string leader_name = &leader == &a ? "candidate-a" : "candidate-b";
  EXPECT_EQ((*admin_->Get(kLeases, ns_, "hydra-controller"))["spec"]["holderIdentity"],
            leader_name);
  // The leader dies without handing the Lease back: the other takes over once it expires.
  const auto t0 = Clock::now();
  leader.Stop(/*release=*/false);
  ASSERT_TRUE(Eventually([&] { return other.IsLeader(); }, std::chrono::seconds(10)));
  const double takeover = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LE(takeover, 3.0 + 0.5) << "not within the lease duration (+ one retry period)";
  auto lease = *admin_->Get(kLeases, ns_, "hydra-controller");
  EXPECT_NE(lease["spec"]["holderIdentity"], leader_name);
  EXPECT_GE(lease["spec"].value("leaseTransitions", 0), 1);
  // A leader that stops politely hands over at once.
  const auto t1 = Clock::now();
  other.Stop(/*release=*/true);
  LeaderElector c(
      admin_,
      [&] {
        auto x = base;
        x.identity = "candidate-c";
        return x;
      }(),
      nullptr, nullptr);
  c.Start();
  ASSERT_TRUE(Eventually([&] { return c.IsLeader(); }, std::chrono::seconds(10)));
  EXPECT_LE(std::chrono::duration<double>(Clock::now() - t1).count(), 2.0);
  c.Stop();
}

TEST_F(KubeClientIntegrationTest, EventsAreRecordedAgainstTheObject) {
  auto cm = admin_->Create(kConfigMaps, ns_, ConfigMap("subject", "1"));
  ASSERT_TRUE(cm.ok());
  auto ev = RecordEvent(*admin_, *cm, "Warning", "TrialFailed", "trial x failed: out of memory",
                        "hydra-controller");
  ASSERT_TRUE(ev.ok()) << ev.status();
  auto list = admin_->Request(
      "GET", KubeClient::Path(kEvents, ns_) + "?fieldSelector=involvedObject.name%3Dsubject");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ((*list)["items"].size(), 1u);
  const auto& e = (*list)["items"][0];
  EXPECT_EQ(e["reason"], "TrialFailed");
  EXPECT_EQ(e["type"], "Warning");
  EXPECT_EQ(e["involvedObject"]["uid"], (*cm)["metadata"]["uid"]);
  EXPECT_EQ(RecordEvent(*admin_, *cm, "Bad", "X", "y", "z").status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(KubeClientIntegrationTest, ServiceAccountWithoutRbacPermissionIsForbidden) {
  ASSERT_TRUE(admin_
                  ->Create(kServiceAccounts, ns_,
                           {{"apiVersion", "v1"},
                            {"kind", "ServiceAccount"},
                            {"metadata", {{"name", "nobody"}}}})
                  .ok());
  auto token = admin_->Request("POST", KubeClient::Path(kServiceAccounts, ns_, "nobody", "token"),
                               {{"apiVersion", "authentication.k8s.io/v1"},
                                {"kind", "TokenRequest"},
                                {"spec", {{"expirationSeconds", 600}}}});
  ASSERT_TRUE(token.ok()) << token.status();
  KubeConfig sa = *admin_config_;
  sa.client_cert_pem.clear();
  sa.client_key_pem.clear();
  sa.bearer_token = (*token)["status"]["token"].get<std::string>();
  RetryPolicy once;
  once.attempts = 1;
  auto client = KubeClient::Create(sa, once);
  ASSERT_TRUE(client.ok());
  auto denied = (*client)->List(kConfigMaps, ns_);
  ASSERT_EQ(denied.status().code(), StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(denied.status().message(), HasSubstr("forbidden"));
  EXPECT_THAT(denied.status().message(), HasSubstr("system:serviceaccount:" + ns_ + ":nobody"));
  // Granting the permission makes the same call work.
  ASSERT_TRUE(admin_
                  ->Create({"rbac.authorization.k8s.io", "v1", "roles", true}, ns_,
                           {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                            {"kind", "Role"},
                            {"metadata", {{"name", "read-cm"}}},
                            {"rules", Json::array({{{"apiGroups", {""}},
                                                    {"resources", {"configmaps"}},
                                                    {"verbs", {"list"}}}})}})
                  .ok());
  ASSERT_TRUE(
      admin_
          ->Create(
              {"rbac.authorization.k8s.io", "v1", "rolebindings", true}, ns_,
              {{"apiVersion", "rbac.authorization.k8s.io/v1"},
               {"kind", "RoleBinding"},
               {"metadata", {{"name", "nobody-reads"}}},
               {"roleRef",
                {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Role"}, {"name", "read-cm"}}},
               {"subjects",
                Json::array(
                    {{{"kind", "ServiceAccount"}, {"name", "nobody"}, {"namespace", ns_}}})}})
          .ok());
  EXPECT_TRUE(
      Eventually([&] { return (*client)->List(kConfigMaps, ns_).ok(); }, std::chrono::seconds(10)));
}

TEST_F(KubeClientIntegrationTest, ARotatedTokenFileIsReadAgain) {
  // Two service accounts: `reader` may list ConfigMaps, `other` may not.
  auto token_of = [&](const std::string& sa) {
    EXPECT_TRUE(
        admin_
            ->Create(
                kServiceAccounts, ns_,
                {{"apiVersion", "v1"}, {"kind", "ServiceAccount"}, {"metadata", {{"name", sa}}}})
            .ok());
    auto token = admin_->Request("POST", KubeClient::Path(kServiceAccounts, ns_, sa, "token"),
                                 {{"apiVersion", "authentication.k8s.io/v1"},
                                  {"kind", "TokenRequest"},
                                  {"spec", {{"expirationSeconds", 600}}}});
    EXPECT_TRUE(token.ok()) << token.status();
    return token.ok() ? (*token)["status"]["token"].get<std::string>() : std::string();
  };
  const std::string reader = token_of("reader"), other = token_of("other");
  // An explicit Role: the aggregated ClusterRole "view" has no rules without the
  // controller-manager that aggregates them.
  ASSERT_TRUE(admin_
                  ->Create({"rbac.authorization.k8s.io", "v1", "roles", true}, ns_,
                           {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                            {"kind", "Role"},
                            {"metadata", {{"name", "configmap-reader"}}},
                            {"rules", Json::array({{{"apiGroups", Json::array({""})},
                                                    {"resources", Json::array({"configmaps"})},
                                                    {"verbs", Json::array({"list"})}}})}})
                  .ok());
  ASSERT_TRUE(admin_
                  ->Create({"rbac.authorization.k8s.io", "v1", "rolebindings", true}, ns_,
                           {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                            {"kind", "RoleBinding"},
                            {"metadata", {{"name", "reader-views"}}},
                            {"roleRef",
                             {{"apiGroup", "rbac.authorization.k8s.io"},
                              {"kind", "Role"},
                              {"name", "configmap-reader"}}},
                            {"subjects", Json::array({{{"kind", "ServiceAccount"},
                                                       {"name", "reader"},
                                                       {"namespace", ns_}}})}})
                  .ok());
  // The token file as kubelet keeps it: replaced (new inode) when it rotates.
  const fs::path dir = fs::temp_directory_path() / ("hydra-token-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write_token = [&](const std::string& token) {
    std::ofstream(dir / "token.new") << token << "\n";
    fs::rename(dir / "token.new", dir / "token");
  };
  write_token(reader);
  KubeConfig sa = *admin_config_;
  sa.client_cert_pem.clear();
  sa.client_key_pem.clear();
  sa.token_file = (dir / "token").string();
  sa.bearer_token = reader;
  RetryPolicy once;
  once.attempts = 1;
  auto client = KubeClient::Create(sa, once);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(
      Eventually([&] { return (*client)->List(kConfigMaps, ns_).ok(); }, std::chrono::seconds(10)));
  write_token(other);
  auto denied = (*client)->List(kConfigMaps, ns_);
  EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(denied.status().message(), HasSubstr("system:serviceaccount:" + ns_ + ":other"));
  write_token(reader);
  EXPECT_TRUE((*client)->List(kConfigMaps, ns_).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hydra::kube
