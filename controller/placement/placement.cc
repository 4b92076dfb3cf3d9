#include "controller/placement/placement.h"

#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/cost_model.h"
#include "common/units.h"

namespace hydra::controller {

namespace {
int64_t PlannedBytes(const DeviceInventory& d) {
  return std::max<int64_t>(0, d.total_bytes - d.free_bytes);
}
}  // namespace

int64_t DeviceInventory::UsableBytes() const {
  if (dcgm_free_bytes < 0) return total_bytes;
  // DCGM's free memory leaves out what the agent's allocator holds, its cache included: an idle
  // agent whose allocator kept a finished trial's blocks would otherwise look like a full GPU.
  // (Its CUDA context is used memory too, but no trial can have it; the budget leaves it out.)
  const int64_t ours = process_bytes >= 0 ? process_bytes : PlannedBytes(*this);
  return std::min(total_bytes, dcgm_free_bytes + ours);
}

int64_t DeviceInventory::AvailableBytes() const {
  if (dcgm_free_bytes < 0) return free_bytes;
  return std::clamp<int64_t>(UsableBytes() - PlannedBytes(*this), 0, free_bytes);
}

int64_t AgentInventory::MaxDeviceBytes() const {
  int64_t m = 0;
  for (const auto& d : devices) m = std::max(m, d.UsableBytes());
  return m;
}

int64_t AgentInventory::FreeBytes() const {
  int64_t f = 0;
  for (const auto& d : devices) f += d.AvailableBytes();
  return f;
}

bool AgentInventory::LimitedByDcgm() const {
  return std::any_of(devices.begin(), devices.end(),
                     [](const DeviceInventory& d) { return d.UsableBytes() < d.total_bytes; });
}

namespace {

/// One vector sample: string labels and a finite value; an error says what is wrong.
StatusOr<PrometheusClient::Sample> ParseSample(const nlohmann::json& r) {
  PrometheusClient::Sample s;
  if (!r.is_object() || !r.contains("metric") || !r["metric"].is_object()) {
    return InvalidArgumentError("no label set");
  }
  for (const auto& [k, v] : r["metric"].items()) {
    if (!v.is_string()) return InvalidArgumentError("label " + k + " is not a string");
    s.labels[k] = v.get<std::string>();
  }
  const auto& value = r.contains("value") ? r["value"] : nlohmann::json();
  if (!value.is_array() || value.size() != 2 || !value[1].is_string()) {
    return InvalidArgumentError("no [time, \"value\"] pair");
  }
  const std::string text = value[1].get<std::string>();
  char* end = nullptr;
  s.value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(s.value)) {
    return InvalidArgumentError("value '" + text + "' is not a finite number");
  }
  return s;
}

/// A byte count from a sample: whole, >= 0 and below 2^62; nullopt (logged) otherwise.
std::optional<int64_t> Bytes(const PrometheusClient::Sample& s, double scale, const char* what) {
  const double v = s.value * scale;
  if (v >= 0 && v < 4.6e18) return static_cast<int64_t>(v);
  std::fprintf(stderr, "hydra-controller: skipping %s of %g bytes (out of range)\n", what, v);
  return std::nullopt;
}

/// `metric` restricted to the agents' own scrape job (PromQL string escaping).
std::string FromJob(const std::string& metric, const std::string& job) {
  if (job.empty()) return metric;
  std::string quoted;
  for (char ch : job) {
    if (ch == '\\' || ch == '"') quoted += '\\';
    quoted += ch;
  }
  return metric + "{job=\"" + quoted + "\"}";
}

std::string Label(const PrometheusClient::Sample& s, const char* key) {
  auto it = s.labels.find(key);
  return it == s.labels.end() ? std::string() : it->second;
}

/// Gives each GPU device its DCGM_FI_DEV_FB_FREE (MiB), matched by node and UUID. dcgm-exporter
/// names the node `Hostname` (its default) or `hostname` (relabelled); a series whose UUID no
/// agent reports is another node's or an unmanaged GPU's, and is left alone.
void MatchDcgm(const std::vector<PrometheusClient::Sample>& dcgm,
               std::map<std::pair<std::string, std::string>, DeviceInventory>* devices) {
  std::map<std::pair<std::string, std::string>, DeviceInventory*> by_uuid;
  for (auto& [key, d] : *devices) {
    if (!d.uuid.empty()) by_uuid[{key.first, d.uuid}] = &d;
  }
  for (const auto& s : dcgm) {
    const std::string host =
        s.labels.count("Hostname") ? Label(s, "Hostname") : Label(s, "hostname");
    auto it = by_uuid.find({host, Label(s, "UUID")});
    if (it == by_uuid.end()) continue;
    if (const auto bytes = Bytes(s, 1024.0 * 1024.0, "DCGM_FI_DEV_FB_FREE")) {
      it->second->dcgm_free_bytes = *bytes;
    }
  }
}

}  // namespace

PrometheusClient::PrometheusClient(std::string base_url) : base_url_(std::move(base_url)) {
  while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
}

StatusOr<std::vector<PrometheusClient::Sample>> PrometheusClient::Query(
    const std::string& promql) const {
  std::string body;
  int code = 0;
  try {
    web::http::client::http_client_config cfg;
    cfg.set_timeout(std::chrono::seconds(10));
    web::http::client::http_client client(base_url_, cfg);
    auto resp = client
                    .request(web::http::methods::GET,
                             "/api/v1/query?query=" + web::uri::encode_data_string(promql))
                    .get();
    code = resp.status_code();
    body = resp.extract_utf8string(true).get();
  } catch (const std::exception& e) {
    return UnavailableError("Prometheus at " + base_url_ + ": " + e.what());
  }
  auto j = nlohmann::json::parse(body, nullptr, false);
  const bool usable = j.is_object() && j.value("status", "") == "success" && j.contains("data") &&
                      j["data"].is_object() && j["data"].contains("result") &&
                      j["data"]["result"].is_array();
  if (!usable) {
    const std::string error = j.is_object() && j.contains("error") && j["error"].is_string()
                                  ? j["error"].get<std::string>()
                                  : body.substr(0, 200);
    return UnavailableError("Prometheus at " + base_url_ + " answered " + std::to_string(code) +
                            " to '" + promql + "': " + error);
  }
  std::vector<Sample> out;
  for (const auto& r : j["data"]["result"]) {
    auto sample = ParseSample(r);
    if (!sample.ok()) {
      std::fprintf(stderr, "hydra-controller: skipping a sample of '%s': %s\n", promql.c_str(),
                   sample.status().message().c_str());
      continue;
    }
    out.push_back(std::move(sample).value());
  }
  return out;
}

StatusOr<std::vector<AgentInventory>> FetchInventory(const PrometheusClient& prometheus,
                                                     const std::string& agent_scrape_job) {
  ASSIGN_OR_RETURN(auto info, prometheus.Query(FromJob("hydra_agent_info", agent_scrape_job)));
  ASSIGN_OR_RETURN(auto total,
                   prometheus.Query(FromJob("hydra_device_memory_total_bytes", agent_scrape_job)));
  ASSIGN_OR_RETURN(auto free,
                   prometheus.Query(FromJob("hydra_device_memory_free_bytes", agent_scrape_job)));
  // dcgm-exporter is optional: a failed query only means no DCGM data; so are the agents'
  // allocator series (agents without GPUs, or of an older version, have none).
  auto dcgm = prometheus.Query("DCGM_FI_DEV_FB_FREE");
  auto reserved = prometheus.Query(FromJob("hydra_gpu_allocator_reserved_bytes", agent_scrape_job));
  std::map<std::string, AgentInventory> by_node;
  for (const auto& s : info) {
    const std::string node = Label(s, "node"), endpoint = Label(s, "grpc_endpoint");
    if (node.empty() || endpoint.empty()) continue;
    // An agent pod of one job's spec.agents serves only that job: not the shared pool.
    if (!Label(s, "dedicated_job_uid").empty()) continue;
    auto& a = by_node[node];
    a.node = node;
    a.endpoint = endpoint;
    a.version = Label(s, "version");
    if (auto optimizer = ParseOptimizerFlag(Label(s, "optimizer")); optimizer.ok()) {
      a.optimizer = *optimizer;
    }
  }
  std::map<std::pair<std::string, std::string>, DeviceInventory> devices;
  for (const auto& s : total) {
    const std::string node = Label(s, "node"), device = Label(s, "device");
    const auto bytes = Bytes(s, 1, "hydra_device_memory_total_bytes");
    if (node.empty() || device.empty() || !bytes) continue;
    auto& d = devices[{node, device}];
    d.name = device;
    d.total_bytes = *bytes;
    d.uuid = Label(s, "UUID");
  }
  for (const auto& s : free) {
    auto it = devices.find({Label(s, "node"), Label(s, "device")});
    const auto bytes = Bytes(s, 1, "hydra_device_memory_free_bytes");
    if (it != devices.end() && bytes) it->second.free_bytes = *bytes;
  }
  if (dcgm.ok()) MatchDcgm(*dcgm, &devices);
  if (reserved.ok()) {
    for (const auto& s : *reserved) {
      auto it = devices.find({Label(s, "node"), Label(s, "device")});
      const auto bytes = Bytes(s, 1, "hydra_gpu_allocator_reserved_bytes");
      if (it != devices.end() && bytes) it->second.process_bytes = *bytes;
    }
  }
  for (const auto& [key, d] : devices) {
    auto it = by_node.find(key.first);
    if (it != by_node.end()) it->second.devices.push_back(d);
  }
  std::vector<AgentInventory> out;
  for (auto& [node, a] : by_node) {
    if (!a.devices.empty()) out.push_back(std::move(a));
  }
  return out;
}

double EstimatedRemainingSeconds(const Trial& trial, int64_t steps_done) {
  const auto fp = EstimateTrialFootprint(trial);
  const double tokens = static_cast<double>(trial.training.batch_size * trial.model.context_length);
  return 6.0 * static_cast<double>(fp.parameters) * tokens *
         static_cast<double>(std::max<int64_t>(0, trial.training.steps - steps_done)) / 1e11;
}

PartitionOptions PlanOptionsOn(const Trial& trial, const AgentInventory& agent) {
  PartitionOptions po = PartitionOptionsFor(trial);
  ApplyOptimizerFlag(agent.optimizer, &po);  // as the agent plans
  const bool gpus =
      std::any_of(agent.devices.begin(), agent.devices.end(),
                  [](const DeviceInventory& d) { return d.name.rfind("cuda", 0) == 0; });
  if (gpus) {
    // What every GPU agent's plans may do (its CUDA build's fused attention, graphs kept in
    // the GPU's memory, LayerNorm and GELU recomputed); what needs the agent's measured link
    // (offloads, resident shards) is left to the agent.
    po.fused_attention = true;
    po.stash_on_device = true;
    po.selective_recompute = true;
  }
  return po;
}

std::vector<Placement> PlaceTrials(std::vector<TrialToPlace> trials,
                                   const std::vector<AgentInventory>& agents,
                                   std::map<std::string, int>* load,
                                   std::map<std::string, std::string>* waiting,
                                   bool one_per_device) {
  std::stable_sort(trials.begin(), trials.end(), [](const TrialToPlace& a, const TrialToPlace& b) {
    return a.remaining_seconds > b.remaining_seconds;
  });
  std::vector<Placement> out;
  for (const auto& t : trials) {
    const AgentInventory* best = nullptr;
    double best_score = -1;
    PartitionPlan best_plan;
    std::string why = agents.empty() ? "no agents reported by Prometheus" : "";
    for (const auto& a : agents) {
      if (one_per_device && (*load)[a.endpoint] >= static_cast<int>(a.devices.size())) {
        why = "every agent trains a trial per device; more of the job's agent pods are starting";
        continue;
      }
      Trial on_agent = t.trial;
      const int64_t device = a.MaxDeviceBytes();
      if (!on_agent.resources.device_memory_budget ||
          *on_agent.resources.device_memory_budget > device) {
        if (on_agent.resources.device_memory_budget &&
            *on_agent.resources.device_memory_budget > device) {
          why = "deviceMemoryBudget " + FormatBytes(*on_agent.resources.device_memory_budget) +
                " is more than any agent's device (" + a.node + ": " + FormatBytes(device) +
                (a.LimitedByDcgm()
                     ? ", what DCGM_FI_DEV_FB_FREE leaves beside other processes on its GPUs)"
                     : ")");
          continue;
        }
        on_agent.resources.device_memory_budget = device;
      }
      // A model file's layers are known only once it is loaded, which the agent does: it
      // plans such a trial itself (an empty plan here).
      auto plan = on_agent.model.family == ModelFamily::kTorchScript
                      ? StatusOr<PartitionPlan>(PartitionPlan{})
                      : PlanShards(on_agent, PlanOptionsOn(on_agent, a));
      if (!plan.ok()) {
        why = a.node + ": " + plan.status().message();
        continue;
      }
      const double score =
          static_cast<double>(a.FreeBytes()) / (1.0 + static_cast<double>((*load)[a.endpoint]));
      if (score > best_score) {
        best_score = score;
        best = &a;
        best_plan = *plan;
      }
    }
    if (!best) {
      (*waiting)[t.trial.name] = why;
      continue;
    }
    (*load)[best->endpoint] += 1;
    out.push_back({t.trial.name, best->endpoint, best->node, best_plan});
  }
  return out;
}

}  // namespace hydra::controller
