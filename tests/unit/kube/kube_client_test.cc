// The Kubernetes client against a scripted HTTP server on loopback (cpprestsdk's listener):
// kubeconfig and in-cluster configuration, error mapping, retries with Retry-After, paging.
// Behaviour against a real kube-apiserver is in tests/integration/kube_client_test.cc.
#define _TURN_OFF_PLATFORM_STRING
#include "controller/kube/kube_client.h"

#include <cpprest/http_listener.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "controller/kube/kube_config.h"
#include "controller/kube/watcher.h"
#include "tests/fakes/scripted_http_server.h"

namespace hydra::kube {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using fakes::ScriptedServer;

std::unique_ptr<KubeClient> ClientFor(const ScriptedServer& server, RetryPolicy retry = {}) {
  KubeConfig c;
  c.server = server.url();
  c.bearer_token = "secret-token";
  c.source = "test";
  retry.initial = std::chrono::milliseconds(10);
  auto client = KubeClient::Create(c, retry);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(client).value();
}

TEST(KubeClientTest, PathsFollowTheApiLayout) {
  EXPECT_EQ(KubeClient::Path(kConfigMaps, "ns", "a"), "/api/v1/namespaces/ns/configmaps/a");
  EXPECT_EQ(KubeClient::Path(kNamespaces, "ignored", "x"), "/api/v1/namespaces/x");
  EXPECT_EQ(KubeClient::Path(kLeases, "kube-system"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases");
  ResourceKind mmj{"hydra.dev", "v1alpha1", "multimodeljobs", true};
  EXPECT_EQ(KubeClient::Path(mmj, "", ""), "/apis/hydra.dev/v1alpha1/multimodeljobs");
  EXPECT_EQ(KubeClient::Path(mmj, "team", "j", "status"),
            "/apis/hydra.dev/v1alpha1/namespaces/team/multimodeljobs/j/status");
}

TEST(KubeClientTest, ApiErrorsBecomeTypedStatusesWithTheServersMessage) {
  ScriptedServer server;
  auto client = ClientFor(server);
  server.Push(
      403,
      R"({"kind":"Status","reason":"Forbidden","message":"configmaps is forbidden: User \"system:serviceaccount:a:b\" cannot list"})");
  auto forbidden = client->List(kConfigMaps, "a");
  EXPECT_EQ(forbidden.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(forbidden.status().message(), HasSubstr("403 Forbidden: configmaps is forbidden"));
  server.Push(404, R"({"reason":"NotFound","message":"configmaps \"x\" not found"})");
  EXPECT_EQ(client->Get(kConfigMaps, "a", "x").status().code(), StatusCode::kNotFound);
  server.Push(409, R"({"reason":"AlreadyExists","message":"exists"})");
  EXPECT_EQ(client->Create(kConfigMaps, "a", Json::object()).status().code(),
            StatusCode::kAlreadyExists);
  server.Push(409, R"({"reason":"Conflict","message":"the object has been modified"})");
  auto conflict = client->Update(kConfigMaps, "a", {{"metadata", {{"name", "x"}}}});
  EXPECT_TRUE(IsConflict(conflict.status())) << conflict.status();
  server.Push(422, R"({"reason":"Invalid","message":"spec.x: Invalid value"})");
  EXPECT_EQ(client->Create(kConfigMaps, "a", Json::object()).status().code(),
            StatusCode::kInvalidArgument);
  server.Push(410, R"({"reason":"Expired","message":"too old resource version"})");
  EXPECT_TRUE(IsGone(client->Get(kConfigMaps, "a", "x").status()));
  // None of these was retried: 6 requests for 6 calls, each with the bearer token.
  EXPECT_EQ(server.requests().size(), 6u);
}

TEST(KubeClientTest, TooManyRequestsAndServerErrorsAreRetriedHonouringRetryAfter) {
  ScriptedServer server;
  auto client = ClientFor(server);
  server.Push(429, R"({"message":"slow down"})", {{"Retry-After", "1"}});
  server.Push(503, R"({"message":"unavailable"})");
  server.Push(200, R"({"metadata":{"name":"x"}})");
  const auto t0 = std::chrono::steady_clock::now();
  auto got = client->Get(kConfigMaps, "a", "x");
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["metadata"]["name"], "x");
  EXPECT_EQ(server.requests().size(), 3u);
  EXPECT_GE(waited, 1.0) << "Retry-After: 1 was not honoured";

  // Retries run out: the last error is returned.
  for (int i = 0; i < 5; ++i) server.Push(500, R"({"message":"etcd down"})");
  auto failed = client->Get(kConfigMaps, "a", "x");
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr("etcd down"));
}

TEST(KubeClientTest, ListFollowsContinueTokens) {
  ScriptedServer server;
  auto client = ClientFor(server);
  server.Push(
      200,
      R"({"metadata":{"resourceVersion":"42","continue":"p2"},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]})");
  server.Push(
      200,
      R"({"metadata":{"resourceVersion":"42","continue":"p3"},"items":[{"metadata":{"name":"c"}}]})");
  server.Push(200, R"({"metadata":{"resourceVersion":"42"},"items":[{"metadata":{"name":"d"}}]})");
  auto list = client->List(kConfigMaps, "ns", "app=x", 2);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ((*list)["items"].size(), 4u);
  EXPECT_EQ((*list)["metadata"]["resourceVersion"], "42");
  EXPECT_FALSE((*list)["metadata"].contains("continue"));
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_THAT(reqs[0], HasSubstr("limit=2"));
  EXPECT_THAT(reqs[0], HasSubstr("labelSelector=app%3Dx"));
  EXPECT_THAT(reqs[2], HasSubstr("continue=p3"));
}

TEST(KubeClientTest, WatchDeliversEventsAndReportsExpiry) {
  ScriptedServer server;
  auto client = ClientFor(server);
  server.Push(
      200,
      "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"5\"}}}\n"
      "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"9\"}}}\n"
      "{\"type\":\"DELETED\",\"object\":{\"metadata\":{\"name\":\"a\",\"resourceVersion\":\"10\"}}}"
      "\n");
  std::vector<std::string> types;
  Status s = client->WatchOnce(kConfigMaps, "ns", "4", 5, [&](const WatchEvent& e) {
    types.push_back(e.type);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(types, (std::vector<std::string>{"ADDED", "BOOKMARK", "DELETED"}));
  EXPECT_THAT(server.requests()[0], HasSubstr("allowWatchBookmarks=true"));
  EXPECT_THAT(server.requests()[0], HasSubstr("resourceVersion=4"));
  server.Push(200,
              "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,\"reason\":"
              "\"Expired\",\"message\":\"too old resource version: 4 (77)\"}}\n");
  s = client->WatchOnce(kConfigMaps, "ns", "4", 5, [](const WatchEvent&) { return true; });
  EXPECT_TRUE(IsGone(s)) << s;
}

class KubeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hydra_kubeconfig_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(KubeConfigTest, ReadsDataAndFileEntriesOfTheCurrentContext) {
  std::ofstream(dir_ / "ca.crt") << "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
  std::ofstream(dir_ / "config") << R"(apiVersion: v1
kind: Config
current-context: b
clusters:
- name: one
  cluster: {server: "https://10.0.0.1:6443/", certificate-authority: ca.crt}
users:
- name: alice
  user: {client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==, client-key-data: LS0tLS1CRUdJTiBLRVktLS0tLQo=}
- name: bob
  user: {token: abc123}
contexts:
- name: a
  context: {cluster: one, user: alice}
- name: b
  context: {cluster: one, user: bob, namespace: team}
)";
  auto b = LoadKubeconfig((dir_ / "config").string());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->server, "https://10.0.0.1:6443");
  EXPECT_EQ(b->bearer_token, "abc123");
  EXPECT_EQ(b->default_namespace, "team");
  EXPECT_THAT(b->ca_pem, HasSubstr("BEGIN CERTIFICATE"));
  auto a = LoadKubeconfig((dir_ / "config").string(), "a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->client_cert_pem, "-----BEGIN CERTIFICATE-----\n");
  EXPECT_EQ(a->client_key_pem, "-----BEGIN KEY-----\n");
  auto missing = LoadKubeconfig((dir_ / "config").string(), "nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("context 'nope'"));
}

TEST_F(KubeConfigTest, ExecPluginsAndBrokenFilesAreExplained) {
  std::ofstream(dir_ / "exec") << R"(current-context: c
clusters: [{name: k, cluster: {server: "https://k"}}]
users: [{name: u, user: {exec: {command: aws}}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
)";
  auto e = LoadKubeconfig((dir_ / "exec").string());
  EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(e.status().message(), HasSubstr("exec"));
  std::ofstream(dir_ / "bad") << "clusters: [unclosed";
  EXPECT_EQ(LoadKubeconfig((dir_ / "bad").string()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadKubeconfig((dir_ / "none").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(KubeConfigTest, InClusterConfigurationFromTheServiceAccount) {
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(InClusterConfig(dir_.string()).status().code(), StatusCode::kFailedPrecondition);
  std::ofstream(dir_ / "token") << "sa-token\n";
  std::ofstream(dir_ / "ca.crt") << "-----BEGIN CERTIFICATE-----\n";
  std::ofstream(dir_ / "namespace") << "hydra-system";
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  auto c = InClusterConfig(dir_.string());
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://10.96.0.1:443");
  EXPECT_EQ(c->bearer_token, "sa-token");
  EXPECT_EQ(c->default_namespace, "hydra-system");
}

}  // namespace
}  // namespace hydra::kube
