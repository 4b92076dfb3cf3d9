#include "controller/reconciler/job_status.h"

#include <array>
#include <tuple>

namespace hydra::controller {
namespace {

using Json = nlohmann::json;

constexpr std::array<std::pair<TrialState, const char*>, 7> kStateNames = {{
    {TrialState::kPending, "Pending"},
    {TrialState::kRunning, "Running"},
    {TrialState::kSucceeded, "Succeeded"},
    {TrialState::kFailed, "Failed"},
    {TrialState::kInterrupted, "Interrupted"},
    {TrialState::kCancelled, "Cancelled"},
    {TrialState::kEarlyStopped, "EarlyStopped"},
}};

// Readers that take the field's default when it is absent or of another type.
int64_t Int(const Json& j, const char* key, int64_t fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}
std::optional<int64_t> OptInt(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}
std::optional<double> OptNumber(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}
std::string Text(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
Json Object(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : Json::object();
}
Json Array(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : Json::array();
}

// Writers that leave a field out at its "absent" value.
void PutText(Json& j, const char* key, const std::string& v) {
  if (!v.empty()) j[key] = v;
}
template <typename T>
void PutOpt(Json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

ShardPlanStatus ShardPlanFromJson(const Json& j) {
  ShardPlanStatus p;
  p.state_tier = Text(j, "stateTier");
  p.peak_device_bytes = Int(j, "peakDeviceBytes");
  p.shard_count = Int(j, "shardCount");
  p.offloaded_bytes = Int(j, "offloadedBytes");
  p.resident_bytes = Int(j, "residentBytes");
  p.resident_shards = Int(j, "residentShards");
  for (const auto& s : Array(j, "shards")) {
    if (!s.is_object()) continue;
    p.shards.push_back(
        {Int(s, "firstLayer"), Int(s, "lastLayer"), Int(s, "stateBytes"), Text(s, "activations")});
  }
  return p;
}

Json ShardPlanToJson(const ShardPlanStatus& p) {
  Json shards = Json::array();
  for (const auto& s : p.shards) {
    shards.push_back({{"firstLayer", s.first_layer},
                      {"lastLayer", s.last_layer},
                      {"stateBytes", s.state_bytes},
                      {"activations", s.activations}});
  }
  Json plan = {{"stateTier", p.state_tier},
               {"peakDeviceBytes", p.peak_device_bytes},
               {"shardCount", p.shard_count},
               {"shards", shards}};
  // GPU plans' fields, left out at 0 (a CPU's plans have none).
  if (p.offloaded_bytes != 0) plan["offloadedBytes"] = p.offloaded_bytes;
  if (p.resident_bytes != 0) plan["residentBytes"] = p.resident_bytes;
  if (p.resident_shards != 0) plan["residentShards"] = p.resident_shards;
  return plan;
}

Condition ConditionFromJson(const Json& c) {
  return {Text(c, "type"),    Text(c, "status") == "True",  Text(c, "reason"),
          Text(c, "message"), Int(c, "observedGeneration"), Text(c, "lastTransitionTime")};
}

Json ConditionToJson(const Condition& c) {
  return {{"type", c.type},
          {"status", c.status ? "True" : "False"},
          {"reason", c.reason},
          {"message", c.message},
          {"observedGeneration", c.observed_generation},
          {"lastTransitionTime", c.last_transition_time}};
}

}  // namespace

const char* TrialStateName(TrialState state) {
  for (const auto& [s, name] : kStateNames) {
    if (s == state) return name;
  }
  return "Pending";
}

TrialState TrialStateFromName(const std::string& name) {
  for (const auto& [s, n] : kStateNames) {
    if (name == n) return s;
  }
  return TrialState::kPending;
}

bool IsFinal(TrialState s) {
  return s == TrialState::kSucceeded || s == TrialState::kFailed || s == TrialState::kCancelled ||
         s == TrialState::kEarlyStopped;
}

bool TrialEntry::OnAgent() const {
  return !agent_endpoint.empty() && state != TrialState::kInterrupted;
}

void TrialEntry::LeaveAgent() {
  agent.clear();
  agent_endpoint.clear();
}

bool ShardStatus::operator==(const ShardStatus& o) const {
  return std::tie(first_layer, last_layer, state_bytes, activations) ==
         std::tie(o.first_layer, o.last_layer, o.state_bytes, o.activations);
}
bool ShardPlanStatus::operator==(const ShardPlanStatus& o) const {
  return std::tie(state_tier, peak_device_bytes, shard_count, offloaded_bytes, resident_bytes,
                  resident_shards, shards) ==
         std::tie(o.state_tier, o.peak_device_bytes, o.shard_count, o.offloaded_bytes,
                  o.resident_bytes, o.resident_shards, o.shards);
}
bool CheckpointStatus::operator==(const CheckpointStatus& o) const {
  return step == o.step && path == o.path;
}
bool Evaluation::operator==(const Evaluation& o) const { return step == o.step && loss == o.loss; }
bool TrialEntry::operator==(const TrialEntry& o) const { return ToJson(*this) == ToJson(o); }
bool Condition::operator==(const Condition& o) const {
  return std::tie(type, status, reason, message, observed_generation, last_transition_time) ==
         std::tie(o.type, o.status, o.reason, o.message, o.observed_generation,
                  o.last_transition_time);
}
bool AgentPodsStatus::operator==(const AgentPodsStatus& o) const {
  return std::tie(desired, pods, ready, gated) == std::tie(o.desired, o.pods, o.ready, o.gated);
}
bool BestTrial::operator==(const BestTrial& o) const {
  return name == o.name && validation_loss == o.validation_loss &&
         hyperparameters == o.hyperparameters;
}
bool JobStatus::operator==(const JobStatus& o) const { return ToJson(*this) == ToJson(o); }

TrialEntry TrialEntryFromJson(const Json& j) {
  TrialEntry e;
  e.name = Text(j, "name");
  e.hyperparameters = Object(j, "hyperparameters");
  e.agent = Text(j, "agent");
  e.agent_endpoint = Text(j, "agentEndpoint");
  e.state = TrialStateFromName(Text(j, "state"));
  e.message = Text(j, "message");
  e.step = Int(j, "step");
  e.steps = Int(j, "steps");
  e.precision =
      Text(j, "precision") == PrecisionName(Precision::kBf16) ? Precision::kBf16 : Precision::kFp32;
  e.train_loss = OptNumber(j, "trainLoss");
  e.validation_loss = OptNumber(j, "validationLoss");
  e.step_limit = OptInt(j, "stepLimit");
  e.stop_early = OptInt(j, "stopEarly");
  for (const auto& p : Array(j, "evaluations")) {
    if (p.is_array() && p.size() == 2 && p[0].is_number_integer() && p[1].is_number()) {
      e.evaluations.push_back({p[0].get<int64_t>(), p[1].get<double>()});
    }
  }
  e.restarts = Int(j, "restarts");
  e.attempt = Int(j, "attempt");
  e.notices = Int(j, "notices");
  if (auto c = j.find("lastCheckpoint"); c != j.end() && c->is_object()) {
    e.last_checkpoint = CheckpointStatus{Int(*c, "step"), Text(*c, "path")};
  }
  if (auto p = j.find("shardPlan"); p != j.end() && p->is_object()) {
    e.shard_plan = ShardPlanFromJson(*p);
  }
  return e;
}

Json ToJson(const TrialEntry& e) {
  Json j = {{"name", e.name},
            {"hyperparameters", e.hyperparameters},
            {"state", TrialStateName(e.state)},
            {"step", e.step},
            {"steps", e.steps},
            {"restarts", e.restarts}};
  PutText(j, "agent", e.agent);
  PutText(j, "agentEndpoint", e.agent_endpoint);
  PutText(j, "message", e.message);
  if (e.precision != Precision::kFp32) j["precision"] = PrecisionName(e.precision);
  PutOpt(j, "trainLoss", e.train_loss);
  PutOpt(j, "validationLoss", e.validation_loss);
  PutOpt(j, "stepLimit", e.step_limit);
  PutOpt(j, "stopEarly", e.stop_early);
  if (!e.evaluations.empty()) {
    Json evaluations = Json::array();
    for (const auto& v : e.evaluations) evaluations.push_back(Json::array({v.step, v.loss}));
    j["evaluations"] = evaluations;
  }
  if (e.attempt > 0) j["attempt"] = e.attempt;
  if (e.notices > 0) j["notices"] = e.notices;
  if (e.last_checkpoint) {
    j["lastCheckpoint"] = {{"step", e.last_checkpoint->step}, {"path", e.last_checkpoint->path}};
  }
  if (e.shard_plan) j["shardPlan"] = ShardPlanToJson(*e.shard_plan);
  return j;
}

JobStatus JobStatusFromJson(const Json& j) {
  JobStatus s;
  if (!j.is_object()) return s;
  s.observed_generation = Int(j, "observedGeneration");
  s.start_time = Text(j, "startTime");
  s.completion_time = Text(j, "completionTime");
  s.trial_count = Int(j, "trialCount");
  s.pending = Int(j, "pending");
  s.running = Int(j, "running");
  s.succeeded = Int(j, "succeeded");
  s.failed = Int(j, "failed");
  s.early_stopped = OptInt(j, "earlyStopped");
  if (auto b = j.find("bestTrial"); b != j.end() && b->is_object()) {
    s.best_trial = BestTrial{Text(*b, "name"), OptNumber(*b, "validationLoss").value_or(0),
                             Object(*b, "hyperparameters")};
  }
  s.best_validation_loss = Text(j, "bestValidationLoss");
  for (const auto& c : Array(j, "conditions")) {
    if (c.is_object() && !Text(c, "type").empty()) s.conditions.push_back(ConditionFromJson(c));
  }
  for (const auto& t : Array(j, "trials")) {
    if (t.is_object() && !Text(t, "name").empty()) s.trials.push_back(TrialEntryFromJson(t));
  }
  if (auto a = j.find("agents"); a != j.end() && a->is_object()) {
    s.agents =
        AgentPodsStatus{Int(*a, "desired"), Int(*a, "pods"), Int(*a, "ready"), Int(*a, "gated")};
  }
  return s;
}

Json ToJson(const JobStatus& s) {
  Json j = {{"observedGeneration", s.observed_generation},
            {"trialCount", s.trial_count},
            {"pending", s.pending},
            {"running", s.running},
            {"succeeded", s.succeeded},
            {"failed", s.failed}};
  PutText(j, "startTime", s.start_time);
  PutText(j, "completionTime", s.completion_time);
  PutOpt(j, "earlyStopped", s.early_stopped);
  if (s.best_trial) {
    j["bestTrial"] = {{"name", s.best_trial->name},
                      {"validationLoss", s.best_trial->validation_loss},
                      {"hyperparameters", s.best_trial->hyperparameters}};
  }
  PutText(j, "bestValidationLoss", s.best_validation_loss);
  Json conditions = Json::array(), trials = Json::array();
  for (const auto& c : s.conditions) conditions.push_back(ConditionToJson(c));
  for (const auto& t : s.trials) trials.push_back(ToJson(t));
  j["conditions"] = conditions;
  j["trials"] = trials;
  if (s.agents) {
    j["agents"] = {{"desired", s.agents->desired},
                   {"pods", s.agents->pods},
                   {"ready", s.agents->ready},
                   {"gated", s.agents->gated}};
  }
  return j;
}

bool SetCondition(std::vector<Condition>& conditions, const std::string& type, bool status,
                  const std::string& reason, const std::string& message, int64_t generation,
                  const std::string& now) {
  for (auto& c : conditions) {
    if (c.type != type) continue;
    const Condition before = c;
    if (c.status != status) c.last_transition_time = now;
    c.status = status;
    c.reason = reason;
    c.message = message;
    c.observed_generation = generation;
    return !(c == before);
  }
  conditions.push_back({type, status, reason, message, generation, now});
  return true;
}

const Condition* FindCondition(const std::vector<Condition>& conditions, const std::string& type) {
  for (const auto& c : conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

}  // namespace hydra::controller
