#pragma once
// TLS for a job's own agent pods: the controller issues each job a serving certificate for a
// name of its own, signed by the agents' CA, and checks each pod's agent against that name, so
// a certificate one namespace can read never passes for another namespace's agents.

#include <chrono>
#include <string>

#include "common/status.h"

namespace hydra::controller {

/// The CA the controller signs job agents' certificates with (PEM).
struct CertificateAuthority {
  std::string cert_pem;
  std::string key_pem;
};

/// Reads and checks the CA's certificate and key files: both PEM, the key the certificate's,
/// the certificate a CA (basicConstraints CA:TRUE). INVALID_ARGUMENT naming the file otherwise.
StatusOr<CertificateAuthority> LoadCertificateAuthority(const std::string& cert_file,
                                                        const std::string& key_file);

/// A certificate and its private key (PEM), and when it expires.
struct IssuedCertificate {
  std::string cert_pem;
  std::string key_pem;
  std::chrono::system_clock::time_point not_after;
};

/// A server certificate for `dns_name` (CN and the one DNS SAN; serverAuth), valid from five
/// minutes ago for `validity`, with a new P-256 key, signed by `ca`.
StatusOr<IssuedCertificate> IssueServerCertificate(const CertificateAuthority& ca,
                                                   const std::string& dns_name,
                                                   std::chrono::hours validity);

/// When a PEM certificate expires; INVALID_ARGUMENT if it is not one.
StatusOr<std::chrono::system_clock::time_point> CertificateNotAfter(const std::string& cert_pem);

/// The name a job's agents prove: "<job>.<namespace>.agents.hydra.dev" (a DNS name: the job's
/// name and namespace are DNS-1123 labels or subdomains).
std::string AgentServerName(const std::string& ns, const std::string& job);

/// The Secret of the job's namespace that holds its agents' certificate: "<job>-agent-tls".
std::string AgentTlsSecretName(const std::string& job);

/// Base64 (RFC 4648, padded), as Secrets carry their data.
std::string Base64Encode(const std::string& bytes);
/// INVALID_ARGUMENT for text that is not padded base64.
StatusOr<std::string> Base64Decode(const std::string& text);

}  // namespace hydra::controller
