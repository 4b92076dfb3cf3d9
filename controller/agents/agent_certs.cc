#include "controller/agents/agent_certs.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <memory>
#include <sstream>

namespace hydra::controller {
namespace {

using Clock = std::chrono::system_clock;

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Ext = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION, X509_EXTENSION_free>>;

/// OpenSSL's last error, for a message.
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

Bio MemoryOf(const std::string& text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

std::string Drain(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

StatusOr<Cert> ParseCert(const std::string& pem, const std::string& what) {
  Bio bio = MemoryOf(pem);
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return InvalidArgumentError(what + ": not a PEM certificate (" + OpenSslError() + ")");
  return cert;
}

StatusOr<Key> ParseKey(const std::string& pem, const std::string& what) {
  Bio bio = MemoryOf(pem);
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return InvalidArgumentError(what + ": not a PEM private key (" + OpenSslError() + ")");
  return key;
}

StatusOr<std::string> ReadFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  if (!in) return InvalidArgumentError(flag + ": cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Ext ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return InternalError("certificate extension " + value + ": " + OpenSslError());
  }
  return OkStatus();
}

/// A random positive 128-bit serial number.
Status SetSerial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return InternalError("serial: " + OpenSslError());
  bytes[0] &= 0x7f;
  std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>> bn(BN_bin2bn(bytes, sizeof bytes, nullptr));
  if (!bn || !BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert))) {
    return InternalError("serial: " + OpenSslError());
  }
  return OkStatus();
}

StatusOr<Cert> NewServerCert(X509* ca_cert, EVP_PKEY* key, const std::string& dns_name,
                             std::chrono::hours validity) {
  Cert cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) return InternalError(OpenSslError());
  RETURN_IF_ERROR(SetSerial(cert.get()));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300);  // clocks are never quite equal
  X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                  static_cast<long>(std::chrono::seconds(validity).count()));
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(dns_name.c_str()), -1, -1, 0);
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert)) != 1 ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return InternalError(OpenSslError());
  }
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert, NID_basic_constraints, "critical,CA:FALSE"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert, NID_key_usage,
                               "critical,digitalSignature,keyEncipherment"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert, NID_ext_key_usage, "serverAuth"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert, NID_subject_alt_name, "DNS:" + dns_name));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert, NID_authority_key_identifier, "keyid"));
  return cert;
}

}  // namespace

StatusOr<CertificateAuthority> LoadCertificateAuthority(const std::string& cert_file,
                                                        const std::string& key_file) {
  CertificateAuthority ca;
  ASSIGN_OR_RETURN(ca.cert_pem, ReadFile(cert_file, "--agent-pod-ca-cert-file"));
  ASSIGN_OR_RETURN(ca.key_pem, ReadFile(key_file, "--agent-pod-ca-key-file"));
  ASSIGN_OR_RETURN(Cert cert, ParseCert(ca.cert_pem, "--agent-pod-ca-cert-file " + cert_file));
  ASSIGN_OR_RETURN(Key key, ParseKey(ca.key_pem, "--agent-pod-ca-key-file " + key_file));
  if (X509_check_ca(cert.get()) == 0) {
    return InvalidArgumentError("--agent-pod-ca-cert-file " + cert_file +
                                ": not a CA certificate (basicConstraints CA:TRUE)");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgumentError("--agent-pod-ca-key-file " + key_file + " is not the key of " +
                                cert_file);
  }
  return ca;
}

StatusOr<IssuedCertificate> IssueServerCertificate(const CertificateAuthority& ca,
                                                   const std::string& dns_name,
                                                   std::chrono::hours validity) {
  ASSIGN_OR_RETURN(Cert ca_cert, ParseCert(ca.cert_pem, "the agents' CA"));
  ASSIGN_OR_RETURN(Key ca_key, ParseKey(ca.key_pem, "the agents' CA key"));
  Key key(EVP_EC_gen("P-256"));
  if (!key) return InternalError("a P-256 key: " + OpenSslError());
  ASSIGN_OR_RETURN(Cert cert, NewServerCert(ca_cert.get(), key.get(), dns_name, validity));
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0) {
    return InternalError("signing the certificate for " + dns_name + ": " + OpenSslError());
  }
  Bio cert_out(BIO_new(BIO_s_mem())), key_out(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(cert_out.get(), cert.get()) != 1 ||
      PEM_write_bio_PrivateKey(key_out.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) !=
          1) {
    return InternalError("writing the certificate for " + dns_name + ": " + OpenSslError());
  }
  IssuedCertificate out{Drain(cert_out.get()), Drain(key_out.get()), {}};
  ASSIGN_OR_RETURN(out.not_after, CertificateNotAfter(out.cert_pem));
  return out;
}

StatusOr<Clock::time_point> CertificateNotAfter(const std::string& cert_pem) {
  ASSIGN_OR_RETURN(Cert cert, ParseCert(cert_pem, "certificate"));
  struct tm t {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &t) != 1) {
    return InvalidArgumentError("certificate: unreadable notAfter");
  }
  return Clock::from_time_t(timegm(&t));
}

std::string AgentServerName(const std::string& ns, const std::string& job) {
  return job + "." + ns + ".agents.hydra.dev";
}

std::string AgentTlsSecretName(const std::string& job) { return job + "-agent-tls"; }

std::string Base64Encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

StatusOr<std::string> Base64Decode(const std::string& text) {
  if (text.size() % 4 != 0) return InvalidArgumentError("not base64: its length is not 4k");
  std::string out(3 * (text.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return InvalidArgumentError("not base64");
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t pad = 0;
  while (pad < 2 && pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

}  // namespace hydra::controller
