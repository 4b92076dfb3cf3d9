#include "agent/rpc/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "common/file_util.h"

namespace hydra::agent {
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& files) {
  if (files.cert_file.empty()) {
    if (!files.key_file.empty() || !files.client_ca_file.empty()) {
      return InvalidArgumentError(
          "--tls-key-file and --tls-client-ca-file need --tls-cert-file as well");
    }
    return grpc::InsecureServerCredentials();
  }
  if (files.key_file.empty()) return InvalidArgumentError("--tls-cert-file needs --tls-key-file");
  grpc::SslServerCredentialsOptions options;
  ASSIGN_OR_RETURN(auto cert, ReadPemFile("--tls-cert-file", files.cert_file));
  ASSIGN_OR_RETURN(auto key, ReadPemFile("--tls-key-file", files.key_file));
  options.pem_key_cert_pairs.push_back({key, cert});
  if (!files.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs,
                     ReadPemFile("--tls-client-ca-file", files.client_ca_file));
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  } else {
    options.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  }
  return grpc::SslServerCredentials(options);
}

StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file, const std::string& cert_file, const std::string& key_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile("CA file", ca_file));
  if (!cert_file.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPemFile("client certificate", cert_file));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadPemFile("client key", key_file));
  }
  return grpc::SslCredentials(options);
}

}  // namespace hydra::agent
