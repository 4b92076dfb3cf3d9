#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

/// Helpers for tests on the Kubernetes test control plane (tests/envtest).
namespace hydra::fakes {

/// Runs a shell command; its exit code and combined output.
inline std::pair<int, std::string> Sh(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  std::array<char, 4096> buf{};
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

/// Polls `pred` every 200 ms for at most `seconds`.
inline bool Eventually(const std::function<bool()>& pred, int seconds) {
  for (int i = 0; i < seconds * 5; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return pred();
}

/// Whether Prometheus on 127.0.0.1:`port` answers `count(<metric>)` with `n`.
inline bool PrometheusCountIs(int port, const std::string& metric, int n) {
  auto [rc, body] = Sh("curl -s 'http://127.0.0.1:" + std::to_string(port) +
                       "/api/v1/query?query=count(" + metric + ")'");
  auto j = nlohmann::json::parse(body, nullptr, false);
  return rc == 0 && !j.is_discarded() && j["data"]["result"].size() == 1 &&
         j["data"]["result"][0]["value"][1] == std::to_string(n);
}

/// Polls `kubectl get mmj <name>` (default namespace) until its Complete condition is True, for
/// at most `seconds`. `*job` holds the last object read, for failure messages.
inline bool WaitJobComplete(const std::string& name, int seconds, nlohmann::json* job) {
  return Eventually(
      [&] {
        auto [rc, text] = Sh("kubectl get mmj " + name + " -o json");
        *job = nlohmann::json::parse(text, nullptr, false);
        if (rc != 0 || job->is_discarded() || !job->contains("status")) return false;
        for (const auto& c : (*job)["status"].value("conditions", nlohmann::json::array())) {
          if (c["type"] == "Complete" && c["status"] == "True") return true;
        }
        return false;
      },
      seconds);
}

/// tests/envtest/up into `dir` (with `up_flags` such as "--with-scheduler"), exporting what it
/// prints (KUBECONFIG, HYDRA_ENVTEST_DIR, and PATH when it built its own kubectl) into this
/// process's environment, then applies crds/multimodeljob.yaml. Returns "" on success, else
/// what went wrong.
inline std::string StartControlPlaneWithCrd(const std::filesystem::path& dir,
                                            const std::string& up_flags = "") {
  const std::string src = HYDRA_SOURCE_DIR;
  auto [rc, out] = Sh(src + "/tests/envtest/up --dir " + dir.string() + " " + up_flags);
  if (rc != 0) return "envtest/up failed:\n" + out;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("export ", 0) != 0) continue;
    const auto eq = line.find('=');
    std::string value = line.substr(eq + 1);
    if (!value.empty() && value.front() == '"') value = value.substr(1, value.size() - 2);
    const std::string name = line.substr(7, eq - 7);
    if (name == "PATH") value.replace(value.find("$PATH"), 5, getenv("PATH"));
    setenv(name.c_str(), value.c_str(), 1);
  }
  auto crd = Sh("kubectl apply -f " + src +
                "/crds/multimodeljob.yaml && kubectl wait --for=condition=Established "
                "crd/multimodeljobs.hydra.dev --timeout=60s");
  return crd.first == 0 ? "" : "CRD: " + crd.second;
}

inline void StopControlPlane(const std::filesystem::path& dir) {
  Sh(std::string(HYDRA_SOURCE_DIR) + "/tests/envtest/down --dir " + dir.string());
}

}  // namespace hydra::fakes
