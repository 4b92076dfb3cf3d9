#include "controller/kube/kube_config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/file_util.h"

namespace hydra::kube {
namespace {

namespace fs = std::filesystem;

StatusOr<std::string> Base64Decode(const std::string& in, const std::string& what) {
  static const std::string kChars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t val = 0;
  int bits = -8;
  for (char c : in) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    const auto pos = kChars.find(c);
    if (pos == std::string::npos) return InvalidArgumentError(what + ": not base64");
    val = ((val << 6) | static_cast<uint32_t>(pos)) & 0xFFFFFFu;  // 24 bits are enough
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

/// The value of `<key>-data` (base64) or of the file `<key>` (relative to `dir`); empty if
/// neither is set.
StatusOr<std::string> DataOrFile(const YAML::Node& node, const std::string& key,
                                 const std::string& dir, const std::string& where) {
  if (node[key + "-data"])
    return Base64Decode(node[key + "-data"].as<std::string>(), where + "." + key + "-data");
  if (node[key]) {
    fs::path p = node[key].as<std::string>();
    if (p.is_relative()) p = fs::path(dir) / p;
    auto text = ReadFile(p.string());
    if (!text.ok()) return text.status().WithContext(where + "." + key);
    return text;
  }
  return std::string();
}

const YAML::Node Named(const YAML::Node& list, const std::string& name, const std::string& field) {
  if (list && list.IsSequence()) {
    for (const auto& item : list) {
      if (item["name"] && item["name"].as<std::string>() == name) return item[field];
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);  // tests false, unlike a default Node
}

}  // namespace

StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context_name) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status().WithContext("kubeconfig");
  const std::string dir = fs::absolute(path).parent_path().string();
  KubeConfig config;
  config.source = path;
  try {
    YAML::Node root = YAML::Load(*text);
    std::string ctx = context_name;
    if (ctx.empty() && root["current-context"]) ctx = root["current-context"].as<std::string>();
    if (ctx.empty())
      return InvalidArgumentError(path + ": no current-context and no context given");
    YAML::Node context = Named(root["contexts"], ctx, "context");
    if (!context) return NotFoundError(path + ": context '" + ctx + "' not found");
    if (context["namespace"]) config.default_namespace = context["namespace"].as<std::string>();
    const std::string cluster_name = context["cluster"] ? context["cluster"].as<std::string>() : "";
    YAML::Node cluster = Named(root["clusters"], cluster_name, "cluster");
    if (!cluster) return NotFoundError(path + ": cluster '" + cluster_name + "' not found");
    if (!cluster["server"])
      return InvalidArgumentError(path + ": cluster '" + cluster_name + "' has no server");
    config.server = cluster["server"].as<std::string>();
    while (!config.server.empty() && config.server.back() == '/') config.server.pop_back();
    if (cluster["insecure-skip-tls-verify"]) {
      config.insecure_skip_tls_verify = cluster["insecure-skip-tls-verify"].as<bool>();
    }
    ASSIGN_OR_RETURN(config.ca_pem,
                     DataOrFile(cluster, "certificate-authority", dir, "cluster " + cluster_name));
    const std::string user_name = context["user"] ? context["user"].as<std::string>() : "";
    YAML::Node user = Named(root["users"], user_name, "user");
    if (user) {
      const std::string where = "user " + user_name;
      ASSIGN_OR_RETURN(config.client_cert_pem, DataOrFile(user, "client-certificate", dir, where));
      ASSIGN_OR_RETURN(config.client_key_pem, DataOrFile(user, "client-key", dir, where));
      if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
        return InvalidArgumentError(path + ": " + where +
                                    " needs both a client certificate and a client key");
      }
      if (user["token"]) {
        config.bearer_token = user["token"].as<std::string>();
      } else if (user["tokenFile"]) {
        config.token_file = user["tokenFile"].as<std::string>();
        if (fs::path(config.token_file).is_relative()) {
          config.token_file = (fs::path(dir) / config.token_file).string();
        }
        ASSIGN_OR_RETURN(config.bearer_token, ReadFile(config.token_file));
      }
      if (user["exec"] || user["auth-provider"]) {
        return UnimplementedError(
            path + ": " + where +
            " uses an exec or auth-provider plugin, which hydra does not run; "
            "use a token or a client certificate");
      }
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(path + ": malformed kubeconfig: " + e.msg);
  }
  config.bearer_token = TrimToken(config.bearer_token);
  return config;
}

StatusOr<KubeConfig> InClusterConfig(const std::string& secrets_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !port || !*host || !*port) {
    return FailedPreconditionError(
        "not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT unset); pass a kubeconfig");
  }
  KubeConfig config;
  config.source = "in-cluster service account (" + secrets_dir + ")";
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  config.server = "https://" + h + ":" + port;
  config.token_file = secrets_dir + "/token";
  ASSIGN_OR_RETURN(config.bearer_token, ReadFile(config.token_file));
  config.bearer_token = TrimToken(config.bearer_token);
  ASSIGN_OR_RETURN(config.ca_pem, ReadFile(secrets_dir + "/ca.crt"));
  if (auto ns = ReadFile(secrets_dir + "/namespace"); ns.ok() && !ns->empty()) {
    config.default_namespace = *ns;
  }
  return config;
}

std::string TrimToken(std::string token) {
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  return token;
}

TokenFile::TokenFile(std::string path, std::string initial)
    : path_(std::move(path)), token_(std::move(initial)) {
  ::stat(path_.c_str(), &seen_);
}

std::string TokenFile::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0) return token_;
  const bool changed = now.st_ino != seen_.st_ino || now.st_size != seen_.st_size ||
                       now.st_mtim.tv_sec != seen_.st_mtim.tv_sec ||
                       now.st_mtim.tv_nsec != seen_.st_mtim.tv_nsec;
  if (!changed) return token_;
  if (auto text = ReadFile(path_); text.ok() && !TrimToken(*text).empty()) {
    token_ = TrimToken(*text);
    seen_ = now;
  }
  return token_;
}

StatusOr<KubeConfig> DefaultKubeConfig(const std::string& explicit_path) {
  if (!explicit_path.empty()) return LoadKubeconfig(explicit_path);
  if (const char* env = std::getenv("KUBECONFIG"); env && *env) {
    std::string first = env;
    first = first.substr(0, first.find(':'));
    return LoadKubeconfig(first);
  }
  if (const char* home = std::getenv("HOME")) {
    const std::string path = std::string(home) + "/.kube/config";
    if (fs::exists(path)) return LoadKubeconfig(path);
  }
  return InClusterConfig();
}

}  // namespace hydra::kube
