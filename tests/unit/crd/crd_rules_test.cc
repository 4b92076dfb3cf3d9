// The CRD's validation against the rules `hydra validate` and the agents enforce
// (common/job.h): one rule set. Every searchable field's type, bounds and enum, in spec and in
// spec.search.grid, and the limits that are not per field (trials per job, evalSequences, the
// job's name, byte quantities below 2^63) must be what the C++ rules say.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "common/job.h"

namespace hydra {
namespace {

using ::testing::HasSubstr;

const std::string kSource = HYDRA_SOURCE_DIR;

YAML::Node Schema() {
  const YAML::Node crd = YAML::LoadFile(kSource + "/crds/multimodeljob.yaml");
  return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

/// The CEL rule text a float field with bounds the schema keywords cannot state uses.
std::string FloatRule(const FieldRule& r) {
  auto literal = [](double v) {
    std::string s = Number(v);
    return s.find_first_of(".e") == std::string::npos ? s + ".0" : s;
  };
  return std::string("self ") + (r.min_exclusive ? "> " : ">= ") + literal(r.min) +
         " && self <= " + literal(r.max);
}

/// What is wrong with `node` (the schema of one value) as the CRD's form of rule `r`.
std::string Mismatch(const FieldRule& r, const YAML::Node& node) {
  const std::string type = node["type"] ? node["type"].as<std::string>() : "";
  if (r.kind == FieldRule::Kind::kEnum) {
    if (type != "string" || !node["enum"]) return "want a string enum";
    if (node["enum"].as<std::vector<std::string>>() != r.enums) return "enum differs";
    return "";
  }
  if (type != (r.kind == FieldRule::Kind::kInt ? "integer" : "number")) return "type " + type;
  if (node["x-kubernetes-validations"]) {
    const std::string rule = node["x-kubernetes-validations"][0]["rule"].as<std::string>();
    return rule == FloatRule(r) ? "" : "rule '" + rule + "', want '" + FloatRule(r) + "'";
  }
  if (!node["minimum"] || node["minimum"].as<double>() != r.min) return "minimum";
  if (node["exclusiveMinimum"].IsDefined() != r.min_exclusive) return "exclusiveMinimum";
  if (std::isfinite(r.max) && (!node["maximum"] || node["maximum"].as<double>() != r.max)) {
    return "maximum (want " + Number(r.max) + ")";
  }
  return "";
}

TEST(CrdRulesTest, EverySearchableFieldHasTheRulesOfTheCpp) {
  const YAML::Node spec = Schema()["properties"]["spec"]["properties"];
  const YAML::Node grid = spec["search"]["properties"]["grid"]["properties"];
  for (const auto& r : SearchableFieldRules()) {
    const YAML::Node field = spec[r.section]["properties"][r.name];
    ASSERT_TRUE(field.IsDefined()) << "spec." << r.section << "." << r.name;
    EXPECT_EQ(Mismatch(r, field), "") << "spec." << r.section << "." << r.name;
    const YAML::Node axis = grid[r.name];
    ASSERT_TRUE(axis.IsDefined()) << "spec.search.grid." << r.name;
    EXPECT_EQ(Mismatch(r, axis["items"]), "") << "spec.search.grid." << r.name << "[]";
  }
}

TEST(CrdRulesTest, TheLimitsOutsideTheFieldTableAgree) {
  const YAML::Node root = Schema();
  const YAML::Node spec = root["properties"]["spec"];
  EXPECT_EQ(spec["properties"]["dataset"]["properties"]["evalSequences"]["maximum"].as<int64_t>(),
            kMaxEvalSequences);
  EXPECT_EQ(root["properties"]["metadata"]["properties"]["name"]["maxLength"].as<size_t>(),
            kMaxJobNameLength);
  // The trial count: one CEL rule multiplying the sizes of every grid field's list (in double,
  // which cannot overflow), against kMaxTrialsPerJob; it must name every searchable field.
  std::string count_rule;
  for (const auto& v : spec["x-kubernetes-validations"]) {
    const std::string rule = v["rule"].as<std::string>();
    if (rule.find("<= " + std::to_string(kMaxTrialsPerJob) + ".0") != std::string::npos) {
      count_rule = rule;
    }
  }
  ASSERT_FALSE(count_rule.empty()) << "no rule bounds the trials per job";
  for (const auto& r : SearchableFieldRules()) {
    EXPECT_THAT(count_rule, HasSubstr("size(self.search.grid." + r.name + ")")) << r.name;
  }
  // Byte quantities: below 2^63 (8Ei); the device budget above 0.
  const YAML::Node res = spec["properties"]["resources"]["properties"];
  for (const char* field : {"deviceMemoryBudget", "hostMemoryBudget"}) {
    std::string rules;
    for (const auto& v : res[field]["x-kubernetes-validations"]) {
      rules += v["rule"].as<std::string>() + "\n";
    }
    EXPECT_THAT(rules, HasSubstr("isLessThan(quantity('8Ei'))")) << field;
  }
  EXPECT_THAT(res["deviceMemoryBudget"]["x-kubernetes-validations"][0]["rule"].as<std::string>(),
              HasSubstr("isGreaterThan(quantity('0'))"));
}

}  // namespace
}  // namespace hydra
