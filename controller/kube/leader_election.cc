#include "controller/kube/leader_election.h"

#include <ctime>

namespace hydra::kube {
namespace {

using Clock = std::chrono::steady_clock;

std::string FormatUtc(bool micro) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out = buf;
  if (micro) {
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
        1000000;
    char frac[16];
    std::snprintf(frac, sizeof(frac), ".%06lld", static_cast<long long>(us));
    out += frac;
  }
  return out + "Z";
}

}  // namespace

std::string MicroTimeNow() { return FormatUtc(true); }
std::string TimeNow() { return FormatUtc(false); }

LeaderElector::LeaderElector(KubeClientInterface* client, LeaderElectionConfig config,
                             std::function<void()> on_started_leading,
                             std::function<void()> on_stopped_leading)
    : client_(client),
      config_(std::move(config)),
      on_started_(std::move(on_started_leading)),
      on_stopped_(std::move(on_stopped_leading)) {}

LeaderElector::~LeaderElector() { Stop(false); }

void LeaderElector::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread(&LeaderElector::Run, this);
}

void LeaderElector::Stop(bool release) {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (leader_.exchange(false)) {
    if (release) {
      // Hand the Lease back: clear the holder if it is still us.
      (void)client_->UpdateWithRetry(
          kLeases, config_.lease_namespace, config_.lease_name, [&](Json& lease) {
            if (lease["spec"].value("holderIdentity", "") != config_.identity) {
              return false;
            }
            lease["spec"]["holderIdentity"] = "";
            lease["spec"]["leaseDurationSeconds"] = 1;
            lease["spec"]["renewTime"] = MicroTimeNow();
            return true;
          });
    }
    if (on_stopped_) on_stopped_();
  }
}

std::string LeaderElector::observed_holder() const {
  std::lock_guard<std::mutex> lock(mu_);
  return observed_holder_;
}

bool LeaderElector::TryAcquireOrRenew() {
  const int64_t duration_s = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(config_.lease_duration).count());
  auto lease = client_->Get(kLeases, config_.lease_namespace, config_.lease_name);
  if (!lease.ok() && lease.status().code() == StatusCode::kNotFound) {
    Json fresh = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
        {"spec",
         {{"holderIdentity", config_.identity},
          {"leaseDurationSeconds", duration_s},
          {"acquireTime", MicroTimeNow()},
          {"renewTime", MicroTimeNow()},
          {"leaseTransitions", 0}}}};
    auto created = client_->Create(kLeases, config_.lease_namespace, fresh);
    if (!created.ok()) return false;  // someone else created it first
    std::lock_guard<std::mutex> lock(mu_);
    observed_holder_ = config_.identity;
    observed_at_ = Clock::now();
    return true;
  }
  if (!lease.ok()) return false;
  Json& l = *lease;
  const std::string holder = l["spec"].value("holderIdentity", "");
  const std::string renew = l["spec"].value("renewTime", "");
  const int64_t their_duration = l["spec"].value("leaseDurationSeconds", duration_s);
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (holder != observed_holder_ || renew != observed_renew_) {
      observed_holder_ = holder;
      observed_renew_ = renew;
      observed_at_ = now;
    }
    const bool expired = now > observed_at_ + std::chrono::seconds(their_duration);
    if (!holder.empty() && holder != config_.identity && !expired) return false;
  }
  const bool transition = holder != config_.identity;
  l["spec"]["holderIdentity"] = config_.identity;
  l["spec"]["leaseDurationSeconds"] = duration_s;
  l["spec"]["renewTime"] = MicroTimeNow();
  if (transition) {
    l["spec"]["acquireTime"] = MicroTimeNow();
    l["spec"]["leaseTransitions"] = l["spec"].value("leaseTransitions", 0) + 1;
  }
  // Optimistic concurrency: the resourceVersion we read must still be current.
  auto updated = client_->Update(kLeases, config_.lease_namespace, l);
  if (!updated.ok()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  observed_holder_ = config_.identity;
  observed_renew_ = (*updated)["spec"].value("renewTime", "");
  observed_at_ = Clock::now();
  return true;
}

void LeaderElector::Run() {
  auto sleep = [&](std::chrono::milliseconds d) {
    const auto end = Clock::now() + d;
    while (!stop_ && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  while (!stop_) {
    const bool held = TryAcquireOrRenew();
    const auto now = Clock::now();
    if (held) {
      last_renewed_ = now;
      if (!leader_.exchange(true) && on_started_) on_started_();
    } else if (leader_ && now - last_renewed_ > config_.renew_deadline) {
      // Could not renew in time: another candidate may take over now, so stop leading first.
      leader_ = false;
      if (on_stopped_) on_stopped_();
    }
    sleep(config_.retry_period);
  }
}

}  // namespace hydra::kube
