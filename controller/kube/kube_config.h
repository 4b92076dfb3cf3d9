#pragma once

#include <sys/stat.h>

#include <mutex>
#include <string>

#include "common/status.h"

namespace hydra::kube {

/// How to reach and authenticate to a Kubernetes API server. PEM texts are held in memory.
struct KubeConfig {
  std::string server;           ///< "https://10.0.0.1:443"
  std::string ca_pem;           ///< trusted CA; empty: the system's
  std::string client_cert_pem;  ///< client certificate (chain), with client_key_pem
  std::string client_key_pem;
  std::string bearer_token;
  /// Where bearer_token came from, if a file: read again whenever it changes (kubelet rotates
  /// projected service-account tokens in place).
  std::string token_file;
  bool insecure_skip_tls_verify = false;
  std::string default_namespace = "default";
  std::string source;  ///< where it came from, for error messages
};

/// Reads a kubeconfig file: the named context (or current-context), its cluster's server and
/// CA (certificate-authority or -data), its user's client certificate/key (files or -data) or
/// token (token or tokenFile). Relative file paths resolve against the kubeconfig's directory.
/// INVALID_ARGUMENT / NOT_FOUND naming the file and the missing entry.
StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context = "");

/// The in-cluster configuration: KUBERNETES_SERVICE_HOST/PORT and the service account's token,
/// CA and namespace under `secrets_dir`. FAILED_PRECONDITION outside a pod.
StatusOr<KubeConfig> InClusterConfig(
    const std::string& secrets_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

/// A bearer token file, read again whenever it changes (its inode, size or modification
/// time): a rotated token is used from the next request on. Thread-safe.
class TokenFile {
 public:
  /// `initial` is the token already read from `path`.
  TokenFile(std::string path, std::string initial);
  /// The current token; the last one read while the file cannot be read.
  std::string Current();

 private:
  std::string path_;
  std::mutex mu_;
  std::string token_;
  struct stat seen_ {};
};

/// A token file's text without trailing newlines.
std::string TrimToken(std::string token);

/// What kubectl would use: `explicit_path` if given, else $KUBECONFIG (its first file), else
/// ~/.kube/config if it exists, else the in-cluster configuration.
StatusOr<KubeConfig> DefaultKubeConfig(const std::string& explicit_path = "");

}  // namespace hydra::kube
