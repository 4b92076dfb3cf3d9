#include "common/yaml_document.h"

#include <yaml-cpp/eventhandler.h>

#include <sstream>

namespace hydra {
namespace {

/// Notes where each document starts and whether it is only a null (what the stuck parser
/// produces); builds nothing.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    start = mark;
    events = 0;
    only_null = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override { only_null = ++events == 1; }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { Other(); }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Other();
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Other();
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Other();
  }
  void OnMapEnd() override {}

  YAML::Mark start;
  int events = 0;
  bool only_null = false;

 private:
  void Other() {
    ++events;
    only_null = false;
  }
};

/// The number of documents in `text`, counting at most 2; throws YAML::Exception on malformed
/// text, including a parser that reports the same empty document twice.
int CountDocuments(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentCounter counter;
  int count = 0;
  YAML::Mark previous;
  bool previous_only_null = false;
  while (count < 2 && parser.HandleNextDocument(counter)) {
    if (count > 0 && previous_only_null && counter.only_null && counter.start.pos == previous.pos) {
      throw YAML::ParserException(counter.start, "unexpected token");
    }
    previous = counter.start;
    previous_only_null = counter.only_null;
    ++count;
  }
  return count;
}

}  // namespace

YamlDocument LoadOneYamlDocument(const std::string& text) {
  YamlDocument doc;
  try {
    const int count = CountDocuments(text);
    if (count != 1) {
      doc.error = count == 0 ? "expected exactly one YAML document, found none"
                             : "expected exactly one YAML document, found more";
      return doc;
    }
    doc.root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    doc.error = "malformed YAML: " + e.msg;
    doc.line = e.mark.line + 1;
  }
  return doc;
}

}  // namespace hydra
