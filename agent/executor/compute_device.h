#pragma once
// Torch-facing: include only from executor translation units.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "agent/executor/executor.h"
#include "agent/executor/slab_pool.h"
#include "common/devices.h"

namespace hydra::executor {

/// The torch device a DeviceSpec computes on: the CPU for CPU devices, (kCUDA, index) for GPUs.
torch::Device TorchDevice(const DeviceSpec& device);

/// Where an executor built for one of a factory's devices computes.
struct Placement {
  torch::Device device = torch::kCPU;
  bool discrete = false;  ///< its memory is apart from the host's (ExecutorDevices::Discrete)
  int bound = -1;         ///< TrialExecutorInterface::BoundDevice: the index if discrete, else -1
};
/// The placement on device `index` of `devices`; INVALID_ARGUMENT for an unknown index.
StatusOr<Placement> PlaceOn(const ExecutorDevices& devices, int index);

/// A LibTorch error met while `what` ("training step 3 of t-1") ran on `device`, as a Status:
/// RESOURCE_EXHAUSTED when it ran out of memory (c10::OutOfMemoryError, as CUDA's caching
/// allocator throws it, or the CPU allocator's failure), naming the device, on a GPU what the
/// caching allocator holds, and what to change; INTERNAL otherwise.
Status TorchErrorStatus(const c10::Error& e, const std::string& what, const torch::Device& device);

/// LibTorch's caching allocator's current bytes on GPU `device` (CapGpuMemory initialised it);
/// nullopt for a CPU device, a build without CUDA, or a GPU whose allocator is not set up.
std::optional<DeviceAllocatorBytes> CachingAllocatorBytes(const DeviceSpec& device);

/// After a failure on GPU `device`: why the GPU can no longer be used by this process (CUDA's
/// name and text of an error that stays, such as an illegal address, an uncorrectable ECC
/// error or a GPU fallen off the bus: the context is lost until the process restarts), or
/// nullopt where the GPU works (an error of one call, out of memory), for a CPU device or a
/// build without CUDA. Waits for the GPU's work; for error paths only.
std::optional<std::string> DeviceFailure(const DeviceSpec& device);

/// How the disk tier's slabs are pinned for `device`: page-locked in place (cudaHostRegister)
/// for a GPU, so its copies from them are asynchronous; nothing for a CPU device.
SlabPinning PinningFor(const torch::Device& device);

/// Waits for all work on a GPU (every stream): for set-up and teardown only, never in the
/// steady state. Nothing on a CPU device.
void SynchronizeDevice(const torch::Device& device);
/// SynchronizeDevice while a failure is being reported (copies it left under way read memory
/// about to be freed): an error of its own is dropped, the failure reported is the first.
void SynchronizeAfterFailure(const torch::Device& device) noexcept;

/// Gives the memory LibTorch's caching allocator keeps cached (freed tensors' blocks) back to
/// the GPU, after set-up work such as a pilot, so that it does not count as the trials'
/// reserved memory. Nothing on a CPU device.
void ReleaseCachedDeviceMemory(const torch::Device& device);

/// A point in one stream's work that other streams, or the host, can wait for. On a CPU device
/// every mark is already reached. Copyable; empty marks are reached.
class StreamMark {
 public:
  StreamMark() = default;
  /// True once the work before the mark is done (never blocks).
  bool Reached() const;
  /// Blocks the calling thread until the work before the mark is done. Any thread may call
  /// it (a disk tier's I/O thread waits so for a copy out before writing its bytes).
  void Synchronize() const;

 private:
  friend class DeviceStreams;
  std::shared_ptr<void> event_;  // at::cuda::CUDAEvent in the CUDA build; null: reached
};

/// The streams an executor uses on one device (issue 17: "compute on its own stream, prefetch
/// and write-back on dedicated copy streams ordered with CUDA events"). Compute runs on a
/// stream of its own (ComputeScope makes it the calling thread's current stream); copies into
/// the device run on a prefetch stream and copies out on a write-back stream, each ordered
/// after the marks it is given, so a prefetch and a write-back overlap the compute between
/// them, and nothing synchronises the whole device. Memory a copy reads or writes is handed to
/// the caching allocator as used by that stream (record_stream), so it is not reused before
/// the copy is done.
/// On a CPU device the same calls copy at once and every mark is reached: the executor's
/// logic is the same, which is how CPU tests exercise it. Not thread-safe: one executor's
/// thread at a time.
class DeviceStreams {
 public:
  explicit DeviceStreams(torch::Device device);
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  torch::Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }

  /// Waits for everything issued on the three streams, then uses streams on `device`: those it
  /// used there before, if any (a trial moving back and forth within its steps would otherwise
  /// draw new ones from LibTorch's pool each time, whose 32 a device would soon share between
  /// trials, and leave cached memory under streams no one uses).
  void MoveTo(torch::Device device);

  /// While alive, the calling thread's LibTorch work on this device goes to the compute stream.
  class ComputeScope {
   public:
    explicit ComputeScope(DeviceStreams& streams);
    ~ComputeScope();
    ComputeScope(const ComputeScope&) = delete;
    ComputeScope& operator=(const ComputeScope&) = delete;

   private:
    std::shared_ptr<void> guard_;  // c10::cuda::CUDAStreamGuard in the CUDA build
  };

  /// The point the compute stream has reached in the work issued so far.
  StreamMark MarkCompute();
  /// Makes the compute stream wait for `mark` (the host does not wait).
  void ComputeWaits(const StreamMark& mark);

  /// Copies each src[i] (host) into dst[i] (device) on the prefetch stream, asynchronously
  /// where the host side is pinned, after `after` and after `dst_free`: the compute stream's
  /// mark past its last use of dst's memory. For memory allocated on the compute stream that is
  /// MarkCompute() taken when it was allocated (earlier compute may have used the block; none
  /// queued later can), so a copy into memory reserved ahead does not wait for the compute
  /// queued since; for tensors compute reads, MarkCompute() now. Returns the copies' end.
  StreamMark CopyIn(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src,
                    const StreamMark& after, const StreamMark& dst_free);
  /// Copies each src[i] (device) into dst[i] (host) on the write-back stream, after `after`
  /// and after all compute issued so far (which may be what wrote src).
  StreamMark CopyOut(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src,
                     const StreamMark& after);

 private:
  enum class Direction { kIn, kOut };
  StreamMark Copy(Direction direction, const std::vector<torch::Tensor>& dst,
                  const std::vector<torch::Tensor>& src, const StreamMark& after,
                  const StreamMark& compute);
  torch::Device device_;
  std::shared_ptr<void> cuda_;                 // the three streams in the CUDA build
  std::map<int, std::shared_ptr<void>> used_;  // device index -> cuda_ there, once left
};

/// Host memory for a device's copies: pinned (page-locked, so copies to and from a GPU are
/// asynchronous DMA) when `device` is a GPU; plain memory for a CPU device. Zero-filled.
torch::Tensor HostTensorFor(const torch::Device& device, at::IntArrayRef shape,
                            torch::ScalarType dtype);

/// Host memory for a discrete device's copies of a trial's state (its host tier, gradients
/// bound for a host optimizer, bf16 transit copies): tensors carved end to end from one slab of
/// a bounded SlabPool, pinned once (cudaHostRegister) when the pool makes the slab on a GPU,
/// plain memory for a CPU device. Unlike LibTorch's pinned allocator (HostTensorFor), which
/// rounds every allocation up to a power of two (up to twice the bytes the tier ledger counts)
/// and keeps it cached for good, a slab is the size asked for (to a page) and goes back to the
/// pool when its last tensor is dropped, to be handed out again for the same size (a shard's
/// gradients every step). Past the pool's limit slabs are plain, unmapped when dropped. The
/// caller keeps a slab's tensors alive until the copies that use them are done.
class HostTensorPool {
 public:
  HostTensorPool(const torch::Device& device, size_t limit_bytes);

  /// Tensors of `shapes` and `types` (as many of each) in one slab, each at a 64-byte
  /// boundary; their contents are whatever the slab's last user left. Throws c10::Error (out of
  /// memory) when the system refuses the memory.
  std::vector<torch::Tensor> Get(const std::vector<std::vector<int64_t>>& shapes,
                                 const std::vector<torch::ScalarType>& types);
  /// One tensor in a slab of its own.
  torch::Tensor GetOne(at::IntArrayRef shape, torch::ScalarType type);

  SlabPool::Stats stats() const { return pool_.stats(); }

 private:
  SlabPool pool_;
};

}  // namespace hydra::executor
