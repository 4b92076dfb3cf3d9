#include "controller/agentclient/agent_client.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>

#include <cstdio>
#include <set>

#include "common/file_util.h"

namespace hydra::controller {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

hydra::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return OkStatus();
  return hydra::Status(static_cast<StatusCode>(s.error_code()), what + ": " + s.error_message());
}

StatusOr<std::unique_ptr<GrpcAgentPool>> GrpcAgentPool::Create(
    const AgentTls& tls, std::chrono::milliseconds refresh, std::chrono::milliseconds rpc_timeout,
    std::chrono::milliseconds status_timeout, std::chrono::milliseconds forget_after) {
  std::unique_ptr<GrpcAgentPool> pool(new GrpcAgentPool());
  pool->forget_after_ = forget_after;
  pool->refresh_ = refresh;
  pool->rpc_timeout_ = rpc_timeout;
  pool->status_timeout_ = status_timeout;
  if (tls.ca_file.empty() && tls.extra_ca_pem.empty()) {
    if (!tls.cert_file.empty()) {
      return InvalidArgumentError("--agent-tls-cert-file needs --agent-tls-ca-file");
    }
    if (!tls.server_name.empty()) {
      return InvalidArgumentError("--agent-tls-server-name needs --agent-tls-ca-file");
    }
    pool->creds_ = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions o;
    if (!tls.ca_file.empty()) {
      ASSIGN_OR_RETURN(o.pem_root_certs, ReadPemFile("--agent-tls-ca-file", tls.ca_file));
    }
    if (!o.pem_root_certs.empty() && o.pem_root_certs.back() != '\n') o.pem_root_certs += '\n';
    o.pem_root_certs += tls.extra_ca_pem;
    if (!tls.cert_file.empty()) {
      ASSIGN_OR_RETURN(o.pem_cert_chain, ReadPemFile("--agent-tls-cert-file", tls.cert_file));
      ASSIGN_OR_RETURN(o.pem_private_key, ReadPemFile("--agent-tls-key-file", tls.key_file));
    }
    pool->creds_ = grpc::SslCredentials(o);
    pool->server_name_ = tls.server_name;
  }
  return pool;
}

GrpcAgentPool::~GrpcAgentPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [endpoint, e] : entries_) {
      if (e.poller) retired_.push_back(std::move(e.poller));
    }
  }
  Reap(/*all=*/true);
}

std::shared_ptr<v1::AgentService::Stub> GrpcAgentPool::StubFor(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  return StubLocked(endpoint, entries_[endpoint]);
}

std::shared_ptr<v1::AgentService::Stub> GrpcAgentPool::StubLocked(const std::string& endpoint,
                                                                  Entry& e) {
  if (!e.stub) {
    grpc::ChannelArguments args;
    const std::string& name = e.server_name.empty() ? server_name_ : e.server_name;
    if (!name.empty()) args.SetSslTargetNameOverride(name);
    // A new pod's agent refuses connections until it listens: dial again within seconds of
    // that, not after gRPC's default backoff (which grows to two minutes).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
    e.channel = grpc::CreateCustomChannel(endpoint, creds_, args);
    e.stub = v1::AgentService::NewStub(e.channel);
  }
  return e.stub;
}

hydra::Status GrpcAgentPool::Assign(const std::string& endpoint,
                                    const v1::AssignTrialRequest& request,
                                    v1::AssignTrialResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + rpc_timeout_);
  return FromGrpc(StubFor(endpoint)->AssignTrial(&ctx, request, response),
                  "AssignTrial " + request.trial().name() + " on " + endpoint);
}

hydra::Status GrpcAgentPool::Cancel(const std::string& endpoint, const v1::TrialRef& trial,
                                    bool delete_checkpoints) {
  v1::CancelTrialRequest req;
  *req.mutable_trial() = trial;
  req.set_delete_checkpoints(delete_checkpoints);
  return CallCancel(endpoint, req);
}

hydra::Status GrpcAgentPool::Suspend(const std::string& endpoint, const v1::TrialRef& trial) {
  v1::CancelTrialRequest req;
  *req.mutable_trial() = trial;
  req.set_checkpoint(true);
  return CallCancel(endpoint, req);
}

hydra::Status GrpcAgentPool::CallCancel(const std::string& endpoint,
                                        const v1::CancelTrialRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + rpc_timeout_ + std::chrono::seconds(30));
  v1::CancelTrialResponse resp;
  const auto& trial = req.trial();
  return FromGrpc(StubFor(endpoint)->CancelTrial(&ctx, req, &resp),
                  std::string(req.checkpoint() ? "CancelTrial (suspend) " : "CancelTrial ") +
                      trial.namespace_() + "/" + trial.job() + "/" + trial.name() + " on " +
                      endpoint);
}

hydra::Status GrpcAgentPool::Limit(const std::string& endpoint,
                                   const v1::LimitTrialRequest& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + rpc_timeout_);
  v1::LimitTrialResponse resp;
  const auto& t = request.trial();
  return FromGrpc(
      StubFor(endpoint)->LimitTrial(&ctx, request, &resp),
      "LimitTrial " + t.namespace_() + "/" + t.job() + "/" + t.name() + " on " + endpoint);
}

StatusOr<v1::GetStatusResponse> GrpcAgentPool::LastStatus(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(endpoint);
  if (it == entries_.end() || !it->second.ever_ok) {
    return NotFoundError("agent " + endpoint + " not reached yet" +
                         (it == entries_.end() || it->second.last_error.empty()
                              ? std::string()
                              : ": " + it->second.last_error));
  }
  const auto age = Clock::now() - it->second.last_ok_at;
  const double seconds = std::chrono::duration<double>(age).count();
  if (!it->second.last_ok) {
    return UnavailableError("agent " + endpoint + " unreachable for " +
                            std::to_string(static_cast<int>(seconds)) +
                            " s: " + it->second.last_error);
  }
  if (age > refresh_ + status_timeout_) {
    // The poll in flight has not come back: a cut network drops packets without an error.
    return UnavailableError("agent " + endpoint + " has not answered for " +
                            std::to_string(static_cast<int>(seconds)) + " s");
  }
  return it->second.last;
}

void GrpcAgentPool::Track(const std::vector<std::string>& endpoints) {
  const std::set<std::string> want(endpoints.begin(), endpoints.end());
  for (const auto& e : want) StubFor(e);
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (want.count(it->first)) it->second.last_wanted = now;
      if (now - it->second.last_wanted <= forget_after_) {
        ++it;
        continue;
      }
      Retire(it->second);
      it = entries_.erase(it);
    }
    for (const auto& endpoint : want) {
      auto& e = entries_[endpoint];
      if (e.poller) continue;
      e.poller = std::make_shared<Poller>();
      e.poller->thread = std::thread(&GrpcAgentPool::Poll, this, endpoint, e.poller);
    }
  }
  Reap(/*all=*/false);
}

void GrpcAgentPool::Forget(const std::vector<std::string>& endpoints) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& endpoint : endpoints) {
      auto it = entries_.find(endpoint);
      if (it == entries_.end()) continue;
      Retire(it->second);
      entries_.erase(it);
    }
  }
  Reap(/*all=*/false);
}

void GrpcAgentPool::Retire(Entry& e) {
  if (!e.poller) return;
  e.poller->stop = true;
  e.poller->cv.notify_all();
  retired_.push_back(std::move(e.poller));
}

size_t GrpcAgentPool::pollers() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [endpoint, e] : entries_) n += e.poller != nullptr;
  for (const auto& p : retired_) n += !p->finished;
  return n;
}

void GrpcAgentPool::Reap(bool all) {
  std::vector<std::shared_ptr<Poller>> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if (all || (*it)->finished) {
        (*it)->stop = true;
        (*it)->cv.notify_all();
        done.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : done) {
    if (p->thread.joinable()) p->thread.join();
  }
}

void GrpcAgentPool::SetServerName(const std::string& endpoint, const std::string& server_name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = entries_[endpoint];
  if (e.server_name == server_name) return;
  e.server_name = server_name;
  e.stub.reset();  // the next call dials again, checking the new name
  e.last = {};
  e.last_ok = false;
}

double GrpcAgentPool::SecondsSinceContact(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(endpoint);
  if (it == entries_.end()) return 0;
  const auto since = it->second.ever_ok ? it->second.last_ok_at : it->second.tracked_since;
  return std::chrono::duration<double>(Clock::now() - since).count();
}

bool GrpcAgentPool::FirstAnswerDue(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(endpoint);
  if (it == entries_.end() || it->second.ever_ok) return false;
  return Clock::now() - it->second.tracked_since < 2 * (refresh_ + status_timeout_);
}

bool GrpcAgentPool::Refresh(const std::string& endpoint, const Poller* poller) {
  std::shared_ptr<v1::AgentService::Stub> stub;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(endpoint);
    // A retired poller calls no more: its endpoint was forgotten (or is polled anew).
    if (poller != nullptr && (it == entries_.end() || it->second.poller.get() != poller)) {
      return false;
    }
    stub = StubLocked(endpoint, entries_[endpoint]);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + status_timeout_);
  v1::GetStatusResponse resp;
  grpc::Status s = stub->GetStatus(&ctx, {}, &resp);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(endpoint);
  // A retired poller's late answer is dropped: the endpoint left (or came back anew).
  if (it == entries_.end() || (poller != nullptr && it->second.poller.get() != poller)) {
    return false;
  }
  auto& e = it->second;
  LogTransition(endpoint, e, s);
  e.last_ok = s.ok();
  if (s.ok()) {
    e.last = std::move(resp);
    e.ever_ok = true;
    e.last_ok_at = Clock::now();
    e.last_error.clear();
  } else {
    e.last_error = s.error_message();
  }
  return s.ok();
}

bool GrpcAgentPool::AwaitConnection(const std::string& endpoint, const Poller* poller) {
  std::shared_ptr<grpc::Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(endpoint);
    if (it == entries_.end() || it->second.poller.get() != poller) return false;
    channel = it->second.channel;
  }
  // Connected already (the agent answered with an error, or not in time): nothing to drive.
  if (channel == nullptr || channel->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
    return false;
  }
  return channel->WaitForConnected(std::chrono::system_clock::now() + refresh_);
}

void GrpcAgentPool::LogTransition(const std::string& endpoint, const Entry& e,
                                  const grpc::Status& s) {
  // Once a change: an agent that stops answering, starts again, or fails in a new way.
  if (s.ok() && !e.last_ok && !e.last_error.empty()) {
    std::fprintf(stderr, "hydra-controller: agent %s answers\n", endpoint.c_str());
  } else if (!s.ok() && (e.last_ok || e.last_error != s.error_message())) {
    std::fprintf(stderr, "hydra-controller: agent %s does not answer: %s\n", endpoint.c_str(),
                 s.error_message().c_str());
  }
}

StatusOr<v1::GetStatusResponse> GrpcAgentPool::FreshStatus(const std::string& endpoint) {
  Refresh(endpoint, nullptr);
  return LastStatus(endpoint);
}

void GrpcAgentPool::Poll(std::string endpoint, std::shared_ptr<Poller> poller) {
  while (!poller->stop) {
    // An agent that could not be reached: wait for its connection rather than idly, and ask
    // again as soon as it is up.
    if (!Refresh(endpoint, poller.get()) && !poller->stop &&
        AwaitConnection(endpoint, poller.get())) {
      continue;
    }
    std::unique_lock<std::mutex> lock(poller->mu);
    poller->cv.wait_for(lock, refresh_, [&] { return poller->stop.load(); });
  }
  poller->finished = true;
}

}  // namespace hydra::controller
