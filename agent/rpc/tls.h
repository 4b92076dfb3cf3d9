#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace hydra::agent {

/// PEM files of the gRPC server's TLS set-up.
struct TlsFiles {
  std::string cert_file;       ///< the agent's certificate (chain); empty: no TLS
  std::string key_file;        ///< its private key
  std::string client_ca_file;  ///< when set: mutual TLS, callers need a certificate it signed
};

/// Insecure credentials without a certificate; TLS with one; mutual TLS (clients without a
/// certificate signed by the client CA are refused in the handshake) with a client CA.
/// INVALID_ARGUMENT / NOT_FOUND naming the file that is missing or unreadable.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& files);

/// The client side, for the controller and tests: TLS trusting `ca_file`, presenting
/// `cert_file` + `key_file` when given. Insecure when `ca_file` is empty.
StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file);

}  // namespace hydra::agent
