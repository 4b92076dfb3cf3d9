// The certificates the controller issues a job's agents: signed by the agents' CA for the job's
// own name (checked here with OpenSSL's own verifier), renewal dates, refusals of a bad CA, and
// the base64 of Secrets.
#include "controller/agents/agent_certs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <filesystem>

#include "tests/fakes/test_certs.h"

namespace hydra::controller {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

class AgentCertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("agent-certs-" + std::to_string(::getpid()));
    ASSERT_TRUE(fakes::MakeTestCertificates(dir_));
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string F(const std::string& name) { return (dir_ / name).string(); }
  fs::path dir_;
};

X509* Parse(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return cert;
}

/// OpenSSL's verdict on `leaf` against `ca` for `host` as a TLS server: "" or the reason.
std::string Verify(const std::string& ca_pem, const std::string& leaf_pem,
                   const std::string& host) {
  X509* ca = Parse(ca_pem);
  X509* leaf = Parse(leaf_pem);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx);
  X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  X509_VERIFY_PARAM_set_purpose(param, X509_PURPOSE_SSL_SERVER);
  const bool ok = X509_verify_cert(ctx) == 1;
  const std::string why = ok ? "" : X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx));
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(ca);
  X509_free(leaf);
  return why;
}

TEST_F(AgentCertsTest, AJobsCertificateProvesItsOwnNameOnly) {
  auto ca = LoadCertificateAuthority(F("ca.pem"), F("ca.key"));
  ASSERT_TRUE(ca.ok()) << ca.status().message();
  const std::string name = AgentServerName("team-a", "sweep");
  EXPECT_EQ(name, "sweep.team-a.agents.hydra.dev");
  const auto before = std::chrono::system_clock::now();
  auto cert = IssueServerCertificate(*ca, name, 24h * 365);
  ASSERT_TRUE(cert.ok()) << cert.status().message();
  EXPECT_THAT(cert->key_pem, HasSubstr("PRIVATE KEY"));
  EXPECT_EQ(Verify(ca->cert_pem, cert->cert_pem, name), "");
  EXPECT_NE(Verify(ca->cert_pem, cert->cert_pem, AgentServerName("team-b", "sweep")), "")
      << "another namespace's job of the same name";
  auto rogue = LoadCertificateAuthority(F("rogue-ca.pem"), F("rogue-ca.key"));
  ASSERT_TRUE(rogue.ok());
  EXPECT_NE(Verify(rogue->cert_pem, cert->cert_pem, name), "") << "only its CA signed it";
  const auto off =
      std::chrono::duration_cast<std::chrono::seconds>(cert->not_after - (before + 24h * 365));
  EXPECT_LE(std::abs(off.count()), 60) << "valid for the validity asked";
  auto read_back = CertificateNotAfter(cert->cert_pem);
  ASSERT_TRUE(read_back.ok());
  EXPECT_EQ(*read_back, cert->not_after);
  // Every certificate has its own key.
  auto again = IssueServerCertificate(*ca, name, 24h);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->key_pem, cert->key_pem);
}

TEST_F(AgentCertsTest, ABadCaIsRefusedNamingTheFile) {
  auto missing = LoadCertificateAuthority(F("nope.pem"), F("ca.key"));
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("--agent-pod-ca-cert-file: cannot read"));
  auto leaf = LoadCertificateAuthority(F("server.pem"), F("server.key"));
  EXPECT_THAT(leaf.status().message(), HasSubstr("not a CA certificate"));
  auto mismatched = LoadCertificateAuthority(F("ca.pem"), F("rogue-ca.key"));
  EXPECT_THAT(mismatched.status().message(), HasSubstr("is not the key of"));
  auto not_pem = LoadCertificateAuthority(F("ca.key"), F("ca.key"));
  EXPECT_THAT(not_pem.status().message(), HasSubstr("not a PEM certificate"));
  EXPECT_FALSE(CertificateNotAfter("garbage").ok());
}

TEST(Base64Test, RoundTripsAndRefusesWhatIsNotBase64) {
  for (const std::string& s :
       std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    auto back = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(back.ok()) << s;
    EXPECT_EQ(*back, s);
  }
  EXPECT_EQ(Base64Encode("hydra"), "aHlkcmE=");
  EXPECT_FALSE(Base64Decode("abc").ok());
  EXPECT_FALSE(Base64Decode("a*c=").ok());
}

}  // namespace
}  // namespace hydra::controller
