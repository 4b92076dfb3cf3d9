// Keeps the field descriptions of the MultiModelJob CRD (crds/multimodeljob.yaml: what
// `kubectl explain mmj.spec.training` prints) equal to the field tables of docs/manifest.md.
//
// The scheme, which docs/manifest.md states in one sentence at its top:
//  * A docs section is a Markdown heading whose text is a field path (`spec`, `spec.model`,
//    `status.trials[]`; `[]` means the items of an array), and its tables have the header
//    `| field | default | description |` or `| field | description |`. Other headings
//    (`metadata`, prose sections) are not read.
//  * Each row names one field in backticks: `nLayer`, or a dotted path below the heading
//    (`lastCheckpoint.step`, `shardPlan.shards[].firstLayer`). A row naming several fields is an
//    error: split it. The row stands for the field <heading>.<name>.
//  * A cell's text is its Markdown with backticks dropped, `\|` read as `|` and whitespace runs
//    collapsed to one space.
//  * The field's CRD description must be the description cell's text, followed by " Required."
//    when the default cell is `required`, by nothing when it is `—` (or there is no default
//    column), and by " Default: <default cell's text>." otherwise.
//  * A row whose last name is `<field>` (`grid.<field>` under spec.search) stands for every field
//    of that object without a row of its own; `<path>` in its description becomes
//    spec.model.<name> or spec.training.<name>, whichever has a row.
//  * Every CRD field under spec and status needs a row, and every row a CRD field. Every other
//    CRD field (apiVersion, kind, metadata.name: no row) and every array item that is an object
//    needs a non-empty description too, except `metadata` itself, which must have none: the API
//    server refuses a CRD that specifies anything there but name and generateName.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/file_util.h"

namespace hydra {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::string kSource = HYDRA_SOURCE_DIR;
const std::string kCrdFile = "crds/multimodeljob.yaml";
const std::string kDocsFile = "docs/manifest.md";
constexpr char kWildcard[] = "<field>";
constexpr char kNoDefault[] = "—";

/// One row of a docs field table.
struct DocRow {
  std::string path;         ///< the field it documents, e.g. "status.trials[].lastCheckpoint.step"
  std::string description;  ///< the description cell's text
  std::string default_value;  ///< the default cell's text; empty in a two-column table
  int line = 0;               ///< 1-based line in the Markdown
};

/// The field tables of a Markdown file, and what is wrong with them.
struct DocTables {
  std::vector<DocRow> rows;
  std::vector<std::string> problems;
};

/// One field of the CRD's schema, or the items of an array of objects ("status.trials[]").
struct CrdField {
  std::string path;
  std::string description;  ///< as written (after YAML's folding); empty when it has none
  bool is_items = false;
};

/// A Markdown cell as plain text: backticks dropped, `\|` as `|`, whitespace collapsed, trimmed.
std::string PlainText(const std::string& cell) {
  std::string out;
  bool space = false;
  for (size_t i = 0; i < cell.size(); ++i) {
    char ch = cell[i];
    if (ch == '`') continue;
    if (ch == '\\' && i + 1 < cell.size() && cell[i + 1] == '|') {
      ch = '|';
      ++i;
    }
    if (std::isspace(static_cast<unsigned char>(ch))) {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += ch;
  }
  return out;
}

/// The cells of a table row `| a | b |`, split at pipes that are not escaped as `\|`; raw text.
std::vector<std::string> SplitRow(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  size_t begin = line.find('|') + 1;
  size_t end = line.find_last_of('|');
  for (size_t i = begin; i < end; ++i) {
    if (line[i] == '\\' && i + 1 < end && line[i + 1] == '|') {
      cell += "\\|";
      ++i;
    } else if (line[i] == '|') {
      cells.push_back(cell);
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  cells.push_back(cell);
  return cells;
}

/// Whether a heading's text is a field path of the CRD's spec or status.
bool IsFieldPath(const std::string& text) {
  static const std::regex kPath(R"((spec|status)(\.[A-Za-z][A-Za-z0-9]*(\[\])?)*)");
  return std::regex_match(text, kPath);
}

/// Reads the field tables under the field-path headings of `markdown`.
DocTables ParseDocTables(const std::string& markdown) {
  static const std::regex kSeparator(R"(\s*:?-+:?\s*)");
  static const std::regex kName(
      R"(`([A-Za-z][A-Za-z0-9]*(\[\])?(\.[A-Za-z][A-Za-z0-9]*(\[\])?)*(\.<field>)?|<field>)`)");
  DocTables docs;
  std::set<std::string> seen;
  std::istringstream in(markdown);
  std::string line;
  int n = 0;
  bool fenced = false;
  std::string section;              // the current heading's field path; empty if none
  std::vector<std::string> header;  // the current table's header; empty outside a table
  bool usable = false;              // the current table has one of the two layouts
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "docs/manifest.md:" + std::to_string(n) + ": ";
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced) continue;
    if (line.rfind('#', 0) == 0) {
      const size_t text_at = line.find_first_not_of('#');
      const std::string text = text_at == std::string::npos ? "" : PlainText(line.substr(text_at));
      section = IsFieldPath(text) ? text : "";
      header.clear();
      continue;
    }
    if (line.rfind('|', 0) != 0) {
      header.clear();
      continue;
    }
    if (section.empty()) continue;
    std::vector<std::string> cells = SplitRow(line);
    if (header.empty()) {
      for (const auto& c : cells) header.push_back(PlainText(c));
      usable = header == std::vector<std::string>{"field", "default", "description"} ||
               header == std::vector<std::string>{"field", "description"};
      if (!usable) {
        docs.problems.push_back(where + "a table under the heading " + section +
                                " must have the header | field | default | description | or "
                                "| field | description |, not " +
                                line);
      }
      continue;
    }
    if (!usable) continue;
    bool separator = true;
    for (const auto& c : cells) separator = separator && std::regex_match(c, kSeparator);
    if (separator) continue;
    if (cells.size() != header.size()) {
      docs.problems.push_back(where + std::to_string(cells.size()) + " cells, the header has " +
                              std::to_string(header.size()) + ": " + line);
      continue;
    }
    std::string field = cells[0];
    field.erase(0, field.find_first_not_of(' '));
    field.erase(field.find_last_not_of(' ') + 1);
    std::smatch m;
    if (!std::regex_match(field, m, kName)) {
      docs.problems.push_back(where +
                              "the field cell must name one field in backticks (split a "
                              "row that documents several): " +
                              cells[0]);
      continue;
    }
    DocRow row{section + "." + m[1].str(), PlainText(cells.back()),
               header.size() == 3 ? PlainText(cells[1]) : "", n};
    if (row.description.empty()) {
      docs.problems.push_back(where + row.path + " has an empty description");
      continue;
    }
    if (header.size() == 3 && row.default_value.empty()) {
      docs.problems.push_back(where + row.path + " has an empty default (write " + kNoDefault +
                              " for none, or required)");
      continue;
    }
    if (!seen.insert(row.path).second) {
      docs.problems.push_back(where + row.path + " has a second row");
      continue;
    }
    docs.rows.push_back(row);
  }
  return docs;
}

/// The CRD description that `row` demands.
std::string ExpectedDescription(const DocRow& row) {
  if (row.default_value.empty() || row.default_value == kNoDefault) return row.description;
  if (row.default_value == "required") return row.description + " Required.";
  return row.description + " Default: " + row.default_value + ".";
}

/// Appends the fields of an openAPIV3Schema object below `path`, depth first.
void CollectFields(const YAML::Node& schema, const std::string& path, std::vector<CrdField>* out) {
  auto description = [](const YAML::Node& node) {
    const YAML::Node d = node["description"];
    return d && d.IsScalar() ? d.Scalar() : std::string();
  };
  if (const YAML::Node props = schema["properties"]; props && props.IsMap()) {
    for (const auto& kv : props) {
      const std::string child = (path.empty() ? "" : path + ".") + kv.first.Scalar();
      out->push_back({child, description(kv.second), false});
      CollectFields(kv.second, child, out);
    }
  }
  if (const YAML::Node items = schema["items"];
      items && items.IsMap() &&
      (items["properties"] || (items["type"] && items["type"].Scalar() == "object"))) {
    out->push_back({path + "[]", description(items), true});
    CollectFields(items, path + "[]", out);
  }
}

/// The parent path of a field path ("spec.search.grid" of "spec.search.grid.nLayer").
std::string Parent(const std::string& path) { return path.substr(0, path.rfind('.')); }

/// The last name of a field path ("nLayer" of "spec.search.grid.nLayer").
std::string LastName(const std::string& path) { return path.substr(path.rfind('.') + 1); }

bool UnderSpecOrStatus(const std::string& path) {
  return path.rfind("spec.", 0) == 0 || path.rfind("status.", 0) == 0;
}

/// The CRD and the docs, read once for all tests.
class CrdDocsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto markdown = ReadFile(kSource + "/" + kDocsFile);
    ASSERT_TRUE(markdown.ok()) << markdown.status().message();
    docs_ = ParseDocTables(*markdown);
    for (const auto& row : docs_.rows) rows_[row.path] = row;
    YAML::Node crd;
    ASSERT_NO_THROW(crd = YAML::LoadFile(kSource + "/" + kCrdFile));
    const YAML::Node versions = crd["spec"]["versions"];
    ASSERT_TRUE(versions && versions.IsSequence() && versions.size() > 0) << "no spec.versions";
    for (const auto& v : versions) {
      const YAML::Node schema = v["schema"]["openAPIV3Schema"];
      ASSERT_TRUE(schema.IsMap()) << "version " << v["name"] << " has no openAPIV3Schema";
      std::vector<CrdField> fields;
      CollectFields(schema, "", &fields);
      versions_.push_back({v["name"].Scalar(), fields});
    }
  }

  /// The row documenting CRD field `path`: its own, or its object's `<field>` row with `<path>`
  /// replaced. Null if none; `problem` says why a wildcard row does not apply.
  static const DocRow* RowFor(const std::string& path, DocRow* substituted, std::string* problem) {
    if (auto it = rows_.find(path); it != rows_.end()) return &it->second;
    auto wild = rows_.find(Parent(path) + "." + kWildcard);
    if (wild == rows_.end()) return nullptr;
    *substituted = wild->second;
    const std::string name = LastName(path);
    std::vector<std::string> targets;
    for (const std::string section : {"spec.model.", "spec.training."}) {
      if (rows_.count(section + name)) targets.push_back(section + name);
    }
    if (targets.size() != 1) {
      *problem = path + ": the row " + wild->second.path +
                 " (docs/manifest.md:" + std::to_string(wild->second.line) +
                 ") needs exactly one row spec.model." + name + " or spec.training." + name +
                 " for <path>, found " + std::to_string(targets.size());
      return nullptr;
    }
    const std::string placeholder = "<path>";
    size_t at = substituted->description.find(placeholder);
    while (at != std::string::npos) {
      substituted->description.replace(at, placeholder.size(), targets[0]);
      at = substituted->description.find(placeholder, at + targets[0].size());
    }
    return substituted;
  }

  struct Version {
    std::string name;
    std::vector<CrdField> fields;
  };
  static DocTables docs_;
  static std::map<std::string, DocRow> rows_;
  static std::vector<Version> versions_;
};

DocTables CrdDocsTest::docs_;
std::map<std::string, DocRow> CrdDocsTest::rows_;
std::vector<CrdDocsTest::Version> CrdDocsTest::versions_;

TEST_F(CrdDocsTest, DocsTablesFollowTheScheme) {
  for (const auto& p : docs_.problems) ADD_FAILURE() << p;
  EXPECT_FALSE(docs_.rows.empty()) << "no field tables under spec/status headings in " << kDocsFile;
}

TEST_F(CrdDocsTest, EveryCrdFieldHasADescription) {
  for (const auto& v : versions_) {
    for (const auto& f : v.fields) {
      const std::string where = kCrdFile + " (version " + v.name + "): ";
      if (f.path == "metadata") {
        EXPECT_EQ(f.description, "") << where << "metadata must not have a description: the API "
                                     << "server allows only name and generateName under it";
        continue;
      }
      EXPECT_FALSE(PlainText(f.description).empty())
          << where
          << (f.is_items ? "the items of " + f.path.substr(0, f.path.size() - 2) + " have"
                         : f.path + " has")
          << " no description (or an empty one)";
    }
  }
}

TEST_F(CrdDocsTest, EverySpecAndStatusFieldHasADocsRow) {
  for (const auto& v : versions_) {
    int checked = 0;
    for (const auto& f : v.fields) {
      if (f.is_items || !UnderSpecOrStatus(f.path)) continue;
      ++checked;
      DocRow substituted;
      std::string problem;
      if (RowFor(f.path, &substituted, &problem) != nullptr) continue;
      ADD_FAILURE() << kCrdFile << " (version " << v.name << "): " << f.path << " has no row in "
                    << kDocsFile
                    << (problem.empty()
                            ? " (add | `" + LastName(f.path) +
                                  "` | ... | to the table under the heading " + Parent(f.path) + ")"
                            : ": " + problem);
    }
    EXPECT_GT(checked, 0) << "no spec or status fields in " << kCrdFile;
  }
}

TEST_F(CrdDocsTest, DescriptionsEqualTheirDocsRows) {
  for (const auto& v : versions_) {
    for (const auto& f : v.fields) {
      if (f.is_items || !UnderSpecOrStatus(f.path)) continue;
      DocRow substituted;
      std::string problem;
      const DocRow* row = RowFor(f.path, &substituted, &problem);
      if (row == nullptr) continue;  // EverySpecAndStatusFieldHasADocsRow reports it
      EXPECT_EQ(f.description, ExpectedDescription(*row))
          << f.path << ": the description in " << kCrdFile << " (version " << v.name
          << ") differs from its row in " << kDocsFile << ":" << row->line << " (" << row->path
          << ")\n  CRD:  " << (f.description.empty() ? "(none)" : f.description)
          << "\n  docs: " << ExpectedDescription(*row);
    }
  }
}

TEST_F(CrdDocsTest, EveryDocsRowNamesACrdField) {
  for (const auto& v : versions_) {
    std::set<std::string> paths;
    for (const auto& f : v.fields) {
      if (!f.is_items) paths.insert(f.path);
    }
    for (const auto& row : docs_.rows) {
      if (LastName(row.path) == kWildcard) {
        bool any = false;
        for (const auto& p : paths) any = any || Parent(p) == Parent(row.path);
        EXPECT_TRUE(any) << kDocsFile << ":" << row.line << ": " << row.path
                         << " matches no field of " << Parent(row.path) << " in " << kCrdFile
                         << " (version " << v.name << ")";
        continue;
      }
      EXPECT_TRUE(paths.count(row.path))
          << kDocsFile << ":" << row.line << ": " << row.path << " is not a field of " << kCrdFile
          << " (version " << v.name << "); its row says: " << row.description;
    }
  }
}

// The scheme's own mechanics, on small inputs.

TEST(CrdDocsSchemeTest, PlainTextDropsMarkdown) {
  EXPECT_EQ(PlainText("  `adamw` or\t `sgd`  (with `momentum`) "), "adamw or sgd (with momentum)");
  EXPECT_EQ(PlainText(R"(`a \| b`)"), "a | b");
  EXPECT_EQ(PlainText(" — "), kNoDefault);
}

TEST(CrdDocsSchemeTest, ComposesDescriptionsFromTheDefaultColumn) {
  EXPECT_EQ(ExpectedDescription({"spec.training.steps", "Steps.", "required", 1}),
            "Steps. Required.");
  EXPECT_EQ(ExpectedDescription({"spec.model.nLayer", "Blocks; 1..1024.", "4", 1}),
            "Blocks; 1..1024. Default: 4.");
  EXPECT_EQ(ExpectedDescription({"spec.model.path", "A file.", kNoDefault, 1}), "A file.");
  EXPECT_EQ(ExpectedDescription({"status.running", "Trials running.", "", 1}), "Trials running.");
}

TEST(CrdDocsSchemeTest, ReadsRowsUnderFieldPathHeadingsOnly) {
  const DocTables docs = ParseDocTables(R"(# Title

## metadata

| field | rule |
|---|---|
| `name`, `labels` | ignored: not a spec or status heading |

## spec.model

| field | default | description |
|---|---|---|
| `nLayer` | 4 | Transformer `blocks`; a \| b. |

```yaml
# spec.dataset
| `fenced` | x | not a table |
```

### status.trials[]

| field | description |
|:--|--:|
| `shardPlan.shards[].firstLayer` | Its first layer. |
| `grid.<field>` | Values for `<path>`. |
)");
  EXPECT_THAT(docs.problems, IsEmpty());
  ASSERT_EQ(docs.rows.size(), 3u);
  EXPECT_EQ(docs.rows[0].path, "spec.model.nLayer");
  EXPECT_EQ(docs.rows[0].default_value, "4");
  EXPECT_EQ(docs.rows[0].description, "Transformer blocks; a | b.");
  EXPECT_EQ(docs.rows[0].line, 13);
  EXPECT_EQ(docs.rows[1].path, "status.trials[].shardPlan.shards[].firstLayer");
  EXPECT_EQ(docs.rows[1].default_value, "");
  EXPECT_EQ(docs.rows[2].path, "status.trials[].grid.<field>");
}

TEST(CrdDocsSchemeTest, ReportsRowsOutsideTheScheme) {
  const DocTables docs = ParseDocTables(R"(## spec.training

| field | default | description |
|---|---|---|
| `beta1`, `beta2` | 0.9, 0.999 | AdamW. |
| `seed` | 1 | |
| `steps` | | Steps. |
| `momentum` | 0.9 | SGD. |
| `momentum` | 0.9 | SGD again. |
| `lrSchedule` | constant |

## status

| field | meaning |
|---|---|
| `running` | Trials running. |
)");
  EXPECT_EQ(docs.rows.size(), 1u);
  ASSERT_EQ(docs.problems.size(), 6u);
  EXPECT_THAT(docs.problems[0], HasSubstr("docs/manifest.md:5: the field cell must name one"));
  EXPECT_THAT(docs.problems[1], HasSubstr("spec.training.seed has an empty description"));
  EXPECT_THAT(docs.problems[2], HasSubstr("spec.training.steps has an empty default"));
  EXPECT_THAT(docs.problems[3], HasSubstr("spec.training.momentum has a second row"));
  EXPECT_THAT(docs.problems[4], HasSubstr("2 cells, the header has 3"));
  EXPECT_THAT(docs.problems[5], HasSubstr("must have the header"));
}

TEST(CrdDocsSchemeTest, CollectsPropertiesAndObjectItems) {
  const YAML::Node schema = YAML::Load(R"(
type: object
properties:
  spec:
    type: object
    description: d
    properties:
      boundaries: {type: array, items: {type: integer}}
  status:
    type: object
    properties:
      trials:
        type: array
        items:
          type: object
          description: one trial
          properties:
            name: {type: string, description: "its
              name"}
)");
  std::vector<CrdField> fields;
  CollectFields(schema, "", &fields);
  std::vector<std::string> got;
  for (const auto& f : fields) {
    got.push_back(f.path + (f.is_items ? " (items)" : "") + "=" + f.description);
  }
  EXPECT_THAT(got,
              ElementsAre("spec=d", "spec.boundaries=", "status=", "status.trials=",
                          "status.trials[] (items)=one trial", "status.trials[].name=its name"));
}

}  // namespace
}  // namespace hydra
