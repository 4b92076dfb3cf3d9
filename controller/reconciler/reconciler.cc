#include "controller/reconciler/reconciler.h"

#include "controller/kube/events.h"
#include "controller/kube/leader_election.h"
#include "controller/reconciler/pass.h"
#include "controller/reconciler/phases.h"

namespace hydra::controller {

using Clock = std::chrono::steady_clock;

CachedPrometheusInventory::CachedPrometheusInventory(std::string prometheus_url,
                                                     std::string agent_scrape_job,
                                                     std::chrono::milliseconds max_age)
    : prometheus_(std::move(prometheus_url)),
      agent_scrape_job_(std::move(agent_scrape_job)),
      max_age_(max_age) {}

StatusOr<std::vector<AgentInventory>> CachedPrometheusInventory::Inventory() {
  std::lock_guard<std::mutex> lock(mu_);
  if (Clock::now() - fetched_at_ > max_age_) {
    cached_ = FetchInventory(prometheus_, agent_scrape_job_);
    fetched_at_ = Clock::now();
  }
  return cached_;
}

std::string ManifestText(const kube::Json& job) {
  kube::Json metadata = {{"name", job["metadata"].value("name", "")}};
  for (const char* key : {"namespace", "uid"}) {
    if (const std::string v = job["metadata"].value(key, ""); !v.empty()) metadata[key] = v;
  }
  kube::Json m = {{"apiVersion", job.value("apiVersion", "")},
                  {"kind", job.value("kind", "")},
                  {"metadata", metadata},
                  {"spec", job.value("spec", kube::Json::object())}};
  return m.dump();
}

Reconciler::Reconciler(kube::KubeClientInterface* kube, AgentPoolInterface* agents,
                       InventorySourceInterface* inventory, ReconcilerOptions options)
    : kube_(kube),
      agents_(agents),
      inventory_(inventory),
      options_(std::move(options)),
      memory_(std::make_unique<AgentMemory>()) {}

Reconciler::~Reconciler() = default;

StatusOr<ReconcileResult> Reconciler::Reconcile(const std::string& ns, const std::string& name) {
  const ReconcileContext ctx{kube_,     agents_,       inventory_,
                             &options_, memory_.get(), [] { return kube::TimeNow(); }};
  Pass pass;
  if (Status read = ReadJob(ctx, ns, name, pass); !read.ok()) {
    if (read.code() == StatusCode::kNotFound) return pass.result;  // gone
    return read;
  }
  if (pass.job["metadata"].contains("deletionTimestamp")) {
    RETURN_IF_ERROR(Finalize(ctx, pass));
    return pass.result;
  }
  const auto again_soon = [&pass] {
    pass.result.requeue_after = std::chrono::milliseconds(100);  // re-read and recompute
    return pass.result;
  };
  ASSIGN_OR_RETURN(bool finalizer, EnsureFinalizer(ctx, pass));
  if (!finalizer) return again_soon();
  ASSIGN_OR_RETURN(bool valid, LoadTrials(ctx, pass));
  if (!valid) return pass.result;
  ObserveAgents(ctx, pass);
  FollowTrials(ctx, pass);
  AdoptOrCancelStale(ctx, pass);
  StopEarly(ctx, pass);
  ScaleAgents(ctx, pass);
  ASSIGN_OR_RETURN(bool written, PlaceWaitingTrials(ctx, pass));
  if (written) {
    Summarize(ctx, pass);
    ASSIGN_OR_RETURN(written, WriteStatus(ctx, pass));
  }
  // Decisions reach the agents only once the status holding them is stored.
  if (written) TellAgents(ctx, pass);
  // Restarts count once they are stored, so that a retried pass does not count them again.
  if (pass.wrote) pass.result.restarts_by_reason = std::move(pass.restarts);
  if (!written) return again_soon();
  // A finished job still has pods to take down.
  const bool pods_left = pass.own_agents && !pass.pods.pods.empty();
  if (!pass.all_final || pods_left) pass.result.requeue_after = options_.progress_resync;
  return pass.result;
}

void ReconcileContext::Event(const kube::Json& job, const std::string& type,
                             const std::string& reason, const std::string& message) const {
  // Events are best effort: a failure to record one must not fail the reconcile.
  (void)kube::RecordEvent(*kube, job, type, reason, message, options->component);
}

std::vector<const AgentPodView*> JobPods::Live() const {
  std::vector<const AgentPodView*> out;
  for (const auto& p : pods) {
    if (p.Live() && !removing.count(p.name)) out.push_back(&p);
  }
  return out;
}

const AgentPodView* JobPods::AtEndpoint(const std::string& endpoint) const {
  for (const auto* p : Live()) {
    if (!endpoint.empty() && p->endpoint == endpoint) return p;
  }
  return nullptr;
}

bool Pass::Ours(const v1::TrialStatus& t, const std::string& n, int64_t attempt) const {
  return t.name() == n && t.job() == name && t.namespace_() == ns && t.job_uid() == uid &&
         (t.attempt() >= attempt || t.state() == v1::SUCCEEDED || t.state() == v1::EARLY_STOPPED);
}

v1::TrialRef Pass::Ref(const std::string& trial) const {
  v1::TrialRef ref;
  ref.set_namespace_(ns);
  ref.set_job(name);
  ref.set_job_uid(uid);
  ref.set_name(trial);
  return ref;
}

std::string Truncated(const std::string& message) {
  if (message.size() <= kMaxStatusMessageBytes) return message;
  size_t end = kMaxStatusMessageBytes - 3;
  while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
  return message.substr(0, end) + "...";
}

}  // namespace hydra::controller
