#include "controller/placement/placement.h"

#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_client.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/cost_model.h"
#include "common/units.h"

namespace hydra::controller {

int64_t AgentInventory::MaxDeviceBytes() const {
  int64_t m = 0;
  for (const auto& d : devices) m = std::max(m, d.total_bytes);
  return m;
}

int64_t AgentInventory::FreeBytes() const {
  int64_t f = 0;
  for (const auto& d : devices) f += d.free_bytes;
  return dcgm_free_bytes >= 0 ? std::min(f, dcgm_free_bytes) : f;
}

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
  if (j.is_discarded() || j.value("status", "") != "success") {
    return UnavailableError(
        "Prometheus at " + base_url_ + " answered " + std::to_string(code) + " to '" + promql +
        "': " + (j.is_discarded() ? body.substr(0, 200) : j.value("error", "")));
  }
  std::vector<Sample> out;
  for (const auto& r : j["data"]["result"]) {
    Sample s;
    for (const auto& [k, v] : r["metric"].items()) s.labels[k] = v.get<std::string>();
    try {
      s.value = std::stod(r["value"][1].get<std::string>());
    } catch (...) {
      continue;  // garbage: not a usable sample
    }
    if (!std::isfinite(s.value)) continue;  // NaN / Inf: no usable value either
    out.push_back(std::move(s));
  }
  return out;
}

StatusOr<std::vector<AgentInventory>> FetchInventory(const PrometheusClient& prometheus) {
  ASSIGN_OR_RETURN(auto info, prometheus.Query("hydra_agent_info"));
  ASSIGN_OR_RETURN(auto total, prometheus.Query("hydra_device_memory_total_bytes"));
  ASSIGN_OR_RETURN(auto free, prometheus.Query("hydra_device_memory_free_bytes"));
  // dcgm-exporter is optional: a failed query only means no DCGM data.
  auto dcgm = prometheus.Query("DCGM_FI_DEV_FB_FREE");
  std::map<std::string, AgentInventory> by_node;
  for (const auto& s : info) {
    const std::string node = s.labels.count("node") ? s.labels.at("node") : "";
    const std::string endpoint =
        s.labels.count("grpc_endpoint") ? s.labels.at("grpc_endpoint") : "";
    if (node.empty() || endpoint.empty()) continue;
    auto& a = by_node[node];
    a.node = node;
    a.endpoint = endpoint;
    a.version = s.labels.count("version") ? s.labels.at("version") : "";
  }
  std::map<std::pair<std::string, std::string>, DeviceInventory> devices;
  for (const auto& s : total) {
    if (!s.labels.count("node") || !s.labels.count("device")) continue;
    auto& d = devices[{s.labels.at("node"), s.labels.at("device")}];
    d.name = s.labels.at("device");
    d.total_bytes = static_cast<int64_t>(s.value);
  }
  for (const auto& s : free) {
    if (!s.labels.count("node") || !s.labels.count("device")) continue;
    auto it = devices.find({s.labels.at("node"), s.labels.at("device")});
    if (it != devices.end()) it->second.free_bytes = static_cast<int64_t>(s.value);
  }
  for (const auto& [key, d] : devices) {
    auto it = by_node.find(key.first);
    if (it != by_node.end()) it->second.devices.push_back(d);
  }
  if (dcgm.ok()) {
    for (const auto& s : *dcgm) {
      std::string host = s.labels.count("Hostname")   ? s.labels.at("Hostname")
                         : s.labels.count("hostname") ? s.labels.at("hostname")
                                                      : "";
      auto it = by_node.find(host);
      if (it == by_node.end()) continue;
      if (it->second.dcgm_free_bytes < 0) it->second.dcgm_free_bytes = 0;
      it->second.dcgm_free_bytes += static_cast<int64_t>(s.value * 1024.0 * 1024.0);  // MiB
    }
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

std::vector<Placement> PlaceTrials(std::vector<TrialToPlace> trials,
                                   const std::vector<AgentInventory>& agents,
                                   std::map<std::string, int>* load,
                                   std::map<std::string, std::string>* waiting) {
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
      Trial on_agent = t.trial;
      const int64_t device = a.MaxDeviceBytes();
      if (!on_agent.resources.device_memory_budget ||
          *on_agent.resources.device_memory_budget > device) {
        if (on_agent.resources.device_memory_budget &&
            *on_agent.resources.device_memory_budget > device) {
          why = "deviceMemoryBudget " + FormatBytes(*on_agent.resources.device_memory_budget) +
                " is more than any agent's device (" + a.node + ": " + FormatBytes(device) + ")";
          continue;
        }
        on_agent.resources.device_memory_budget = device;
      }
      // A model file's layers are known only once it is loaded, which the agent does: it
      // plans such a trial itself (an empty plan here).
      auto plan = on_agent.model.family == "torchscript"
                      ? StatusOr<PartitionPlan>(PartitionPlan{})
                      : PlanShards(on_agent, PartitionOptionsFor(on_agent));
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
