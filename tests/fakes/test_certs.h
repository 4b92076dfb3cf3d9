#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace hydra::fakes {

/// Certificates for TLS tests, made with the openssl command in `dir`:
/// ca.pem/ca.key (the cluster CA), server.pem/server.key (SAN 127.0.0.1, localhost),
/// controller.pem/.key (CN hydra-controller, signed by the CA), intruder.pem/.key (CN intruder,
/// signed by the CA), rogue-ca.pem and rogue.pem/.key (CN hydra-controller, signed by another
/// CA), named.pem/.key (SAN DNS:hydra-agent.hydra.svc only: one certificate for every agent,
/// checked against a fixed name). Returns false if openssl failed.
inline bool MakeTestCertificates(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::string d = dir.string();
  auto run = [](const std::string& cmd) {
    return std::system((cmd + " 2>/dev/null").c_str()) == 0;
  };
  auto ca = [&](const std::string& name) {
    return run("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=" + name + " -keyout " +
               d + "/" + name + ".key -out " + d + "/" + name + ".pem");
  };
  auto leaf = [&](const std::string& name, const std::string& cn, const std::string& signer,
                  const std::string& san) {
    const std::string ext = d + "/" + name + ".ext";
    return run("printf 'subjectAltName=" + san + "\\n' > " + ext) &&
           run("openssl req -newkey rsa:2048 -nodes -subj /CN=" + cn + " -keyout " + d + "/" +
               name + ".key -out " + d + "/" + name + ".csr") &&
           run("openssl x509 -req -days 2 -in " + d + "/" + name + ".csr -CA " + d + "/" + signer +
               ".pem -CAkey " + d + "/" + signer + ".key -CAcreateserial -extfile " + ext +
               " -out " + d + "/" + name + ".pem");
  };
  return ca("ca") && ca("rogue-ca") &&
         leaf("server", "hydra-agent", "ca", "IP:127.0.0.1,DNS:localhost") &&
         leaf("controller", "hydra-controller", "ca", "DNS:hydra-controller") &&
         leaf("intruder", "intruder", "ca", "DNS:intruder") &&
         leaf("rogue", "hydra-controller", "rogue-ca", "DNS:hydra-controller") &&
         leaf("named", "hydra-agent", "ca", "DNS:hydra-agent.hydra.svc");
}

}  // namespace hydra::fakes
