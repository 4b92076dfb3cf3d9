#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace hydra {

/// One YAML document parsed from text, or why the text is not exactly one document.
struct YamlDocument {
  YAML::Node root;
  std::string error;  // empty when `root` holds the one document
  int line = -1;      // 1-based line of the error, -1 when none applies
};

/// Parses `text`, which must hold exactly one YAML document. Unlike YAML::LoadAll, it ends on
/// every input: yaml-cpp 0.7 (Debian 12) reports an endless run of empty documents for some
/// malformed text (", 16]"; jbeder/yaml-cpp#1319, fixed after 0.8), which LoadAll collects
/// until memory runs out. Here documents are counted with a bound and a parser that stops
/// moving is reported as malformed YAML at its position.
YamlDocument LoadOneYamlDocument(const std::string& text);

}  // namespace hydra
