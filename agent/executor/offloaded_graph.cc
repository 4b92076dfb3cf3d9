#include "agent/executor/offloaded_graph.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>
#include <set>

#include "agent/executor/storage_in_place.h"

namespace hydra::executor {
namespace {

using torch::autograd::Engine;
using torch::autograd::SavedVariableHooks;

thread_local std::vector<torch::Tensor>* tls_saved = nullptr;

/// Keeps an alias of the saved tensor (no autograd history: a saved output's own graph node
/// would otherwise hold itself) and gives it back for backward.
class CaptureHooks : public SavedVariableHooks {
 public:
  explicit CaptureHooks(std::vector<torch::Tensor>* saved) : saved_(saved) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    alias_ = tensor.detach();
    saved_->push_back(alias_);
  }
  at::Tensor call_unpack_hook() override { return alias_; }

 private:
  std::vector<torch::Tensor>* saved_;
  at::Tensor alias_;
};

/// LibTorch's engine, but with CaptureHooks as the default saved-tensor hooks inside a
/// SavedTensorCapture.
class CapturingEngine : public Engine {
 public:
  ~CapturingEngine() override { stop(); }  // its threads call into this object
  std::unique_ptr<SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (tls_saved == nullptr) return nullptr;
    return std::make_unique<CaptureHooks>(tls_saved);
  }
  static Engine& Get() {
    static CapturingEngine engine;
    return engine;
  }
};

// Installed before main, so before any backward: LibTorch starts the autograd threads of GPUs
// once per process (a process-wide flag), for whichever engine runs the first backward; an
// engine installed after that finds no queues for its GPUs (an internal assert in 2.11).
const bool kInstalled = [] {
  torch::autograd::set_default_engine_stub(&CapturingEngine::Get);
  return true;
}();

/// A flat byte tensor over all of `t`'s storage, sharing it.
torch::Tensor StorageBytes(const torch::Tensor& t) {
  const auto n = static_cast<int64_t>(t.storage().nbytes());
  return torch::empty({0}, t.options().dtype(torch::kUInt8)).set_(t.storage(), 0, {n}, {1});
}

}  // namespace

bool SavedTensorCaptureAvailable() {
  return kInstalled && &Engine::get_default_engine() == &CapturingEngine::Get();
}

SavedTensorCapture::SavedTensorCapture(std::vector<torch::Tensor>* saved) : previous_(tls_saved) {
  tls_saved = saved;
}

SavedTensorCapture::~SavedTensorCapture() { tls_saved = previous_; }

OffloadedGraph::OffloadedGraph(const std::vector<torch::Tensor>& saved,
                               const std::vector<torch::Tensor>& keep,
                               const torch::Device& device) {
  std::set<const c10::StorageImpl*> seen;
  for (const auto& t : keep) {
    if (t.defined() && t.has_storage()) seen.insert(t.storage().unsafeGetStorageImpl());
  }
  torch::NoGradGuard g;
  for (const auto& t : saved) {
    if (!t.defined() || !t.has_storage() || t.device() != device) continue;
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    const size_t n = t.storage().nbytes();
    if (!seen.insert(s).second || n == 0) continue;
    views_.push_back(StorageBytes(t));
    bytes_ += static_cast<int64_t>(n);
  }
}

OffloadedGraph::~OffloadedGraph() {
  out_done_.Synchronize();
  in_done_.Synchronize();
}

void OffloadedGraph::MoveOut(DeviceStreams& streams, HostTensorPool& pool) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& v : views_) shapes.push_back({v.numel()});
  host_ = pool.Get(shapes, std::vector<torch::ScalarType>(views_.size(), torch::kUInt8));
  out_done_ = streams.CopyOut(host_, views_, StreamMark());
  for (const auto& v : views_) FreeStorageInPlace(v);
}

void OffloadedGraph::MoveIn(DeviceStreams& streams) {
  for (const auto& v : views_) RefillStorage(v);
  in_done_ = streams.CopyIn(views_, host_, out_done_, streams.MarkCompute());
}

}  // namespace hydra::executor
