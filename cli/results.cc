#include "cli/results.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/gnuplot.h"
#include "common/file_util.h"
#include "common/job_json.h"
#include "common/units.h"

namespace hydra::cli {
namespace {

namespace fs = std::filesystem;

nlohmann::json NumberOrNull(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

double NumberOrNaN(const nlohmann::json& j) {
  return j.is_number() ? j.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string Fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

nlohmann::ordered_json TrialResultJson(const TrialResult& r) {
  nlohmann::ordered_json j;
  j["name"] = r.trial.name;
  j["hyperparameters"] = HyperparametersJson(r.trial);
  j["precision"] = PrecisionName(r.trial.training.precision);
  j["state"] = r.state;
  if (!r.message.empty()) j["message"] = r.message;
  j["finalTrainLoss"] = NumberOrNull(r.final_train_loss);
  j["finalValLoss"] = NumberOrNull(r.final_val_loss);
  j["steps"] = r.step;
  j["tokensPerSecond"] = r.tokens_per_second;
  j["wallSeconds"] = r.wall_seconds;
  j["shards"] = r.shards;
  j["peakDeviceBytes"] = r.peak_device_bytes;
  j["trainLoss"] = CurveJson(r.train_curve);
  j["valLoss"] = CurveJson(r.val_curve);
  return j;
}

Status WriteTrialResultFile(const std::string& path, const TrialResult& r,
                            const std::string& fingerprint) {
  nlohmann::ordered_json j = TrialResultJson(r);
  j["fingerprint"] = fingerprint;
  j["trainSeconds"] = r.train_seconds;
  j["trainedTokens"] = r.trained_tokens;
  return WriteFileAtomically(path, j.dump(2) + "\n");
}

StatusOr<TrialResult> ReadTrialResultFile(const std::string& path, const Trial& trial,
                                          std::string* fingerprint) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  TrialResult r;
  r.trial = trial;
  try {
    auto j = nlohmann::json::parse(text);
    *fingerprint = j.at("fingerprint").get<std::string>();
    r.state = j.at("state").get<std::string>();
    r.final_train_loss = NumberOrNaN(j.at("finalTrainLoss"));
    r.final_val_loss = NumberOrNaN(j.at("finalValLoss"));
    r.step = j.at("steps").get<int64_t>();
    r.tokens_per_second = j.at("tokensPerSecond").get<double>();
    r.wall_seconds = j.at("wallSeconds").get<double>();
    r.train_seconds = j.at("trainSeconds").get<double>();
    r.trained_tokens = j.at("trainedTokens").get<int64_t>();
    r.shards = j.at("shards").get<int64_t>();
    r.peak_device_bytes = j.at("peakDeviceBytes").get<int64_t>();
    r.train_curve = CurveFromJson(j.at("trainLoss"));
    r.val_curve = CurveFromJson(j.at("valLoss"));
    if (!r.train_curve.empty()) r.last_loss = r.train_curve.back().loss;
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(path + ": " + e.what());
  }
  return r;
}

Status WriteResults(const std::string& output_dir, const std::string& job,
                    const std::vector<TrialResult>& ranked) {
  nlohmann::ordered_json j;
  j["job"] = job;
  j["trials"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < ranked.size(); ++i) {
    auto t = TrialResultJson(ranked[i]);
    t["rank"] = i + 1;
    j["trials"].push_back(t);
  }
  RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(output_dir) / "results.json").string(), j.dump(2) + "\n"));

  std::vector<std::string> hp_fields;
  if (!ranked.empty()) {
    for (const auto& hp : ranked.front().trial.hyperparameters) hp_fields.push_back(hp.field);
  }
  std::ostringstream csv;
  csv << "rank,trial";
  for (const auto& f : hp_fields) csv << "," << f;
  csv << ",state,finalTrainLoss,finalValLoss,steps,tokensPerSecond,wallSeconds,shards,"
         "peakDeviceBytes,precision\n";
  for (size_t i = 0; i < ranked.size(); ++i) {
    const auto& r = ranked[i];
    csv << i + 1 << "," << CsvField(r.trial.name);
    for (const auto& hp : r.trial.hyperparameters)
      csv << "," << CsvField(FormatParamValue(hp.value));
    auto num = [](double v) {
      if (!std::isfinite(v)) return std::string();
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.6g", v);
      return std::string(buf);
    };
    csv << "," << r.state << "," << num(r.final_train_loss) << "," << num(r.final_val_loss) << ","
        << r.step << "," << num(r.tokens_per_second) << "," << num(r.wall_seconds) << ","
        << r.shards << "," << r.peak_device_bytes << ","
        << PrecisionName(r.trial.training.precision) << "\n";
  }
  return WriteFileAtomically((fs::path(output_dir) / "results.csv").string(), csv.str());
}

Status PlotLossCurves(const std::string& output_dir, const std::vector<TrialResult>& ranked) {
  const fs::path dir = fs::path(output_dir) / "plot";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("creating " + dir.string() + ": " + ec.message());
  std::ostringstream train_plot, val_plot;
  int n = 0;
  for (const auto& r : ranked) {
    if (r.train_curve.empty()) continue;
    const std::string file = (dir / (r.trial.name + ".dat")).string();
    std::ostringstream data;
    // Block 0: training loss smoothed over a window of ~2% of the steps; block 1: validation.
    const size_t window = std::max<size_t>(1, r.train_curve.size() / 50);
    double sum = 0;
    for (size_t i = 0; i < r.train_curve.size(); ++i) {
      sum += r.train_curve[i].loss;
      if (i >= window) sum -= r.train_curve[i - window].loss;
      data << r.train_curve[i].step << " " << sum / std::min(i + 1, window) << "\n";
    }
    data << "\n\n";
    for (const auto& p : r.val_curve) data << p.step << " " << p.loss << "\n";
    RETURN_IF_ERROR(WriteFileAtomically(file, data.str()));
    const std::string sep = n ? ", " : "";
    train_plot << sep << "'" << file << "' index 0 with lines lw 2 lc " << n + 1 << " title '"
               << r.trial.name << "'";
    val_plot << sep << "'" << file << "' index 1 with linespoints lw 2 pt 7 lc " << n + 1
             << " title '" << r.trial.name << "'";
    ++n;
  }
  if (n == 0) return OkStatus();
  const std::string png = (fs::path(output_dir) / "loss.png").string();
  std::ostringstream script;
  script << "set terminal pngcairo size 1400,560 font 'sans,10'\n"
         << "set output '" << png << "'\n"
         << "set multiplot layout 1,2\n"
         << "set grid\nset xlabel 'step'\nset ylabel 'loss (nats/token)'\n"
         << "set key top right font ',8'\n"
         << "set title 'training loss (smoothed)'\nplot " << train_plot.str() << "\n"
         << "set title 'validation loss'\nplot " << val_plot.str() << "\n"
         << "unset multiplot\n";
  const std::string script_path = (dir / "loss.gp").string();
  RETURN_IF_ERROR(WriteFileAtomically(script_path, script.str()));
  Status s = RunGnuplot(script_path);
  if (s.code() == StatusCode::kUnavailable) {
    return UnavailableError(s.message() + "; loss.png was not drawn, the data is in " +
                            dir.string());
  }
  return s;
}

std::string FormatRankedTable(const std::vector<TrialResult>& ranked) {
  std::vector<std::string> hp_fields;
  if (!ranked.empty()) {
    for (const auto& hp : ranked.front().trial.hyperparameters) hp_fields.push_back(hp.field);
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"rank", "trial"};
  header.insert(header.end(), hp_fields.begin(), hp_fields.end());
  // A job's trials share one dataset, so one unit for the column.
  const char* unit = ranked.empty() ? "tokens/s" : ThroughputUnit(ranked.front().trial);
  for (const char* h :
       {"val loss", "train loss", "steps", unit, "wall", "shards", "peak device", "state"}) {
    header.push_back(h);
  }
  rows.push_back(header);
  for (size_t i = 0; i < ranked.size(); ++i) {
    const auto& r = ranked[i];
    std::vector<std::string> row = {std::to_string(i + 1), r.trial.name};
    for (const auto& hp : r.trial.hyperparameters) row.push_back(FormatParamValue(hp.value));
    row.push_back(Fixed(r.final_val_loss, 4));
    row.push_back(Fixed(r.final_train_loss, 4));
    row.push_back(std::to_string(r.step));
    row.push_back(Fixed(r.tokens_per_second, 0));
    row.push_back(FormatDuration(r.wall_seconds));
    row.push_back(std::to_string(r.shards));
    row.push_back(FormatBytes(r.peak_device_bytes));
    row.push_back(r.state);
    rows.push_back(row);
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t c = 0; c < rows[i].size(); ++c) {
      const bool left = c == 1 || c + 1 == rows[i].size();
      const std::string& cell = rows[i][c];
      const std::string pad(width[c] - cell.size(), ' ');
      out << (c ? "  " : "") << (left ? cell + pad : pad + cell);
    }
    out << "\n";
    if (i == 0) {
      size_t total = 0;
      for (size_t w : width) total += w + 2;
      out << std::string(total - 2, '-') << "\n";
    }
  }
  for (const auto& r : ranked) {
    if (r.state == "Failed") out << "\n" << r.trial.name << " failed: " << r.message << "\n";
  }
  return out.str();
}

}  // namespace hydra::cli
