#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "agent/executor/compute_device.h"

namespace hydra::executor {

// Activation offload (ActivationPolicy::kOffload): a shard's forward keeps its autograd graph,
// but the tensors the graph saved for backward leave the device for host memory until the
// backward, when they come back into the same storages (storage_in_place), so the graph reads
// them unchanged. Python reaches what autograd saves through
// torch.autograd.graph.saved_tensors_hooks; C++ has no such API, so the hooks come from the
// autograd engine's default hooks (Engine::get_default_saved_variable_hooks), overridden by an
// engine installed before main (set_default_engine_stub) that hands them out only inside a
// SavedTensorCapture.

// SavedTensorCaptureAvailable() (executor.h) says whether captures see anything.

/// While alive, every tensor the calling thread's autograd operations save for backward is
/// appended to `saved` (an alias sharing its storage; the graph unpacks the same alias). Other
/// threads, and this thread outside the scope, save as usual. Not nestable.
class SavedTensorCapture {
 public:
  explicit SavedTensorCapture(std::vector<torch::Tensor>* saved);
  ~SavedTensorCapture();
  SavedTensorCapture(const SavedTensorCapture&) = delete;
  SavedTensorCapture& operator=(const SavedTensorCapture&) = delete;

 private:
  std::vector<torch::Tensor>* previous_;
};

/// The storages a forward saved, on their way to host memory and back.
class OffloadedGraph {
 public:
  OffloadedGraph() = default;
  OffloadedGraph(const OffloadedGraph&) = delete;
  OffloadedGraph& operator=(const OffloadedGraph&) = delete;
  /// Waits for its copies: their host memory goes back to its pool.
  ~OffloadedGraph();
  /// The distinct storages of `saved` on `device`, other than those of `keep` (the shard's
  /// weights, which leave the device by their own way, and the boundary activations the step
  /// keeps anyway). All of them, however small: the plan counts the whole graph gone from the
  /// device (a graph's storages under 256 KiB left behind were uncounted device memory: a
  /// ResNet's plan went 3% over its budget).
  OffloadedGraph(const std::vector<torch::Tensor>& saved, const std::vector<torch::Tensor>& keep,
                 const torch::Device& device);

  /// Bytes of the storages it moves.
  int64_t bytes() const { return bytes_; }
  size_t storages() const { return views_.size(); }

  /// Copies every storage into host memory from `pool` on the write-back stream, after the
  /// compute issued so far, and frees its device memory in place (the caching allocator keeps
  /// it from reuse until the copy is done). Throws c10::Error when host memory is refused.
  void MoveOut(DeviceStreams& streams, HostTensorPool& pool);

  /// Gives every storage device memory again (allocated on the calling thread's current
  /// stream) and copies its bytes back on the prefetch stream, after its copy out; compute
  /// must wait for in_done() before the backward reads the graph.
  void MoveIn(DeviceStreams& streams);

  /// Once compute waits for in_done(), before the backward that reads it: drops this object's
  /// references to the device storages, so that the graph's own are the last and the backward
  /// frees each storage once it has read it (as the plan's LiveBytes counts: before, a shard's
  /// whole graph stayed to the end of its backward, 2 MB past a 42 MB budget in
  /// device_memory_test), not when the host copies are released. The copy in is recorded on
  /// its stream: the allocator reuses the memory only after it.
  void ReleaseDevice() { views_.clear(); }

  const StreamMark& in_done() const { return in_done_; }
  /// Whether the host copies are no longer read (the copy in is done).
  bool Settled() const { return in_done_.Reached(); }
  /// Blocks until the copy in is done; the host copies may then be dropped.
  void Settle() const { in_done_.Synchronize(); }

 private:
  std::vector<torch::Tensor> views_;  // each storage whole, as bytes
  std::vector<torch::Tensor> host_;   // their host copies while offloaded
  StreamMark out_done_, in_done_;
  int64_t bytes_ = 0;
};

}  // namespace hydra::executor
