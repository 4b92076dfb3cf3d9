#include "agent/executor/compute_device.h"

#include <algorithm>

#include "agent/executor/gpus.h"
#include "common/units.h"

#ifdef HYDRA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace hydra::executor {

torch::Device TorchDevice(const DeviceSpec& device) {
  if (device.kind == DeviceKind::kCuda) {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index));
  }
  return torch::Device(torch::kCPU);
}

StatusOr<Placement> PlaceOn(const ExecutorDevices& devices, int index) {
  ASSIGN_OR_RETURN(DeviceSpec spec, devices.At(index));
  Placement p;
  p.device = TorchDevice(spec);
  p.discrete = devices.Discrete(spec);
  p.bound = p.discrete ? index : -1;
  return p;
}

SlabPinning PinningFor(const torch::Device& device) {
#ifdef HYDRA_WITH_CUDA
  if (device.is_cuda()) {
    // On the trial's GPU: a thread that has not touched CUDA would otherwise register the
    // memory through (and create a context on) GPU 0.
    const c10::DeviceIndex index = device.index();
    return {[index](void* data, size_t bytes) {
              c10::cuda::CUDAGuard on(index);
              if (cudaHostRegister(data, bytes, cudaHostRegisterPortable) == cudaSuccess) {
                return true;
              }
              cudaGetLastError();  // not sticky: the slab stays plain memory
              return false;
            },
            [index](void* data) {
              c10::cuda::CUDAGuard on(index);
              cudaHostUnregister(data);
            }};
  }
#else
  (void)device;
#endif
  return {};
}

Status CapGpuMemory(const std::vector<DeviceSpec>& devices) {
#ifdef HYDRA_WITH_CUDA
  for (const auto& d : devices) {
    if (d.kind != DeviceKind::kCuda || d.memory_bytes <= 0) continue;
    try {
      const auto index = static_cast<c10::DeviceIndex>(d.index);
      torch::empty({1}, torch::TensorOptions(TorchDevice(d)));  // initializes the allocator
      size_t free_bytes = 0, total_bytes = 0;
      c10::cuda::CUDAGuard on(index);
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess || total_bytes == 0) {
        cudaGetLastError();
        return FailedPreconditionError("cannot read the memory of " + d.name);
      }
      const double fraction =
          std::min(1.0, static_cast<double>(d.memory_bytes) / static_cast<double>(total_bytes));
      c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
      // The fraction is checked only where the allocator asks CUDA for more memory: a block
      // already cached above the cap would still be handed out (the fifth GPU run: 2 GiB under
      // a 1 GiB cap, cached by an earlier test). Cached memory goes back first.
      c10::cuda::device_synchronize();
      c10::cuda::CUDACachingAllocator::emptyCache();
    } catch (const c10::Error& e) {
      return FailedPreconditionError("capping the memory of " + d.name + ": " +
                                     e.what_without_backtrace());
    }
  }
#else
  (void)devices;
#endif
  return OkStatus();
}

namespace {

/// How HostTensorPool says the system refused it memory.
constexpr char kHostPoolRefused[] = "the system refused host memory for a device's copies";

/// Host memory ran out: the CPU allocator's failure (LibTorch 1.13 throws it as a plain
/// c10::Error) or HostTensorPool's, whatever device the trial computes on.
bool IsHostOutOfMemory(const std::string& m) {
  return m.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
         m.find("DefaultCPUAllocator: not enough memory") != std::string::npos ||
         m.find(kHostPoolRefused) != std::string::npos;
}

}  // namespace

Status TorchErrorStatus(const c10::Error& e, const std::string& what, const torch::Device& device) {
  const std::string message = e.what_without_backtrace();
  const bool out_of_memory = dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr;
  if (IsHostOutOfMemory(message) || (out_of_memory && !device.is_cuda())) {
    return ResourceExhaustedError(
        what + " ran out of host memory: " + message +
        ". Other trials or processes hold the machine's memory; hydra-agent --host-memory (or "
        "hydra run --host-memory) bounds what trials may hold together");
  }
  if (!out_of_memory) return InternalError(what + ": " + message);
  DeviceSpec gpu;
  gpu.kind = DeviceKind::kCuda;
  gpu.index = device.index();
  std::string held;
  if (auto bytes = CachingAllocatorBytes(gpu)) {
    held = " (LibTorch's caching allocator holds " + FormatBytes(bytes->allocated) +
           " in tensors, " + FormatBytes(bytes->reserved) + " reserved)";
  }
  return ResourceExhaustedError(
      what + " ran out of memory on " + device.str() + held + ": " + message +
      ". A smaller spec.resources.deviceMemoryBudget cuts the trial into more, smaller shards; "
      "other processes on the GPU may hold memory its budget counted on");
}

std::optional<std::string> DeviceFailure(const DeviceSpec& device) {
#ifdef HYDRA_WITH_CUDA
  if (device.kind != DeviceKind::kCuda) return std::nullopt;
  int before = -1;
  if (cudaGetDevice(&before) != cudaSuccess) before = -1;
  // Twice: the first answer may be an error of one earlier call, which it clears; an error
  // that stays comes back. Never a synchronisation of another GPU than `device`.
  cudaError_t e = cudaSuccess;
  for (int attempt = 0; attempt < 2; ++attempt) {
    e = cudaSetDevice(device.index);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) break;
    (void)cudaGetLastError();
  }
  if (before >= 0) (void)cudaSetDevice(before);
  if (e == cudaSuccess) return std::nullopt;
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
#else
  (void)device;
  return std::nullopt;
#endif
}

std::optional<DeviceAllocatorBytes> CachingAllocatorBytes(const DeviceSpec& device) {
#ifdef HYDRA_WITH_CUDA
  if (device.kind != DeviceKind::kCuda) return std::nullopt;
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device.index));
    // Index 0: StatType::AGGREGATE, all pools (its namespace moved between torch releases).
    return DeviceAllocatorBytes{stats.allocated_bytes[0].current, stats.reserved_bytes[0].current};
  } catch (const c10::Error&) {
    return std::nullopt;  // the allocator was never set up on this GPU
  }
#else
  (void)device;
  return std::nullopt;
#endif
}

void SynchronizeDevice(const torch::Device& device) {
#ifdef HYDRA_WITH_CUDA
  if (!device.is_cuda()) return;
  // device_synchronize waits for the calling thread's current device only.
  c10::cuda::CUDAGuard on(device.index());
  c10::cuda::device_synchronize();
#else
  (void)device;
#endif
}

void SynchronizeAfterFailure(const torch::Device& device) noexcept {
  try {
    SynchronizeDevice(device);
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): the first failure counts
  }
}

void ReleaseCachedDeviceMemory(const torch::Device& device) {
#ifdef HYDRA_WITH_CUDA
  if (!device.is_cuda()) return;
  SynchronizeDevice(device);
  c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)device;
#endif
}

#ifdef HYDRA_WITH_CUDA
namespace {

using Event = at::cuda::CUDAEvent;

struct Streams {
  c10::cuda::CUDAStream compute, in, out;
};

Streams& Of(const std::shared_ptr<void>& p) { return *static_cast<Streams*>(p.get()); }

std::shared_ptr<void> Record(const c10::cuda::CUDAStream& stream) {
  auto e = std::make_shared<Event>();
  e->record(stream);
  return e;
}

}  // namespace
#endif

bool StreamMark::Reached() const {
#ifdef HYDRA_WITH_CUDA
  if (event_) return static_cast<Event*>(event_.get())->query();
#endif
  return true;
}

void StreamMark::Synchronize() const {
#ifdef HYDRA_WITH_CUDA
  if (event_) static_cast<Event*>(event_.get())->synchronize();
#endif
}

namespace {

/// The compute, prefetch and write-back streams on a GPU; null on a CPU.
std::shared_ptr<void> StreamsOn(torch::Device device) {
#ifdef HYDRA_WITH_CUDA
  if (device.is_cuda()) {
    const auto i = device.index();
    return std::make_shared<Streams>(Streams{c10::cuda::getStreamFromPool(false, i),
                                             c10::cuda::getStreamFromPool(false, i),
                                             c10::cuda::getStreamFromPool(false, i)});
  }
#endif
  (void)device;
  return nullptr;
}

}  // namespace

DeviceStreams::DeviceStreams(torch::Device device) : device_(device), cuda_(StreamsOn(device)) {}

DeviceStreams::~DeviceStreams() = default;

void DeviceStreams::MoveTo(torch::Device device) {
#ifdef HYDRA_WITH_CUDA
  if (cuda_) {
    Of(cuda_).compute.synchronize();
    Of(cuda_).in.synchronize();
    Of(cuda_).out.synchronize();
  }
#endif
  if (device == device_) return;
  if (cuda_) used_[device_.index()] = std::move(cuda_);
  auto before = used_.find(device.index());
  cuda_ = device.is_cuda() && before != used_.end() ? before->second : StreamsOn(device);
  device_ = device;
}

DeviceStreams::ComputeScope::ComputeScope(DeviceStreams& streams) {
#ifdef HYDRA_WITH_CUDA
  if (streams.cuda_) {
    guard_ = std::make_shared<c10::cuda::CUDAStreamGuard>(Of(streams.cuda_).compute);
  }
#else
  (void)streams;
#endif
}

DeviceStreams::ComputeScope::~ComputeScope() = default;

StreamMark DeviceStreams::MarkCompute() {
  StreamMark m;
#ifdef HYDRA_WITH_CUDA
  if (cuda_) m.event_ = Record(Of(cuda_).compute);
#endif
  return m;
}

void DeviceStreams::ComputeWaits(const StreamMark& mark) {
#ifdef HYDRA_WITH_CUDA
  if (cuda_ && mark.event_) static_cast<Event*>(mark.event_.get())->block(Of(cuda_).compute);
#else
  (void)mark;
#endif
}

StreamMark DeviceStreams::CopyIn(const std::vector<torch::Tensor>& dst,
                                 const std::vector<torch::Tensor>& src, const StreamMark& after,
                                 const StreamMark& dst_free) {
  return Copy(Direction::kIn, dst, src, after, dst_free);
}

StreamMark DeviceStreams::CopyOut(const std::vector<torch::Tensor>& dst,
                                  const std::vector<torch::Tensor>& src, const StreamMark& after) {
  return Copy(Direction::kOut, dst, src, after, MarkCompute());
}

StreamMark DeviceStreams::Copy(Direction direction, const std::vector<torch::Tensor>& dst,
                               const std::vector<torch::Tensor>& src, const StreamMark& after,
                               const StreamMark& compute) {
  torch::NoGradGuard no_grad;
  StreamMark m;
#ifdef HYDRA_WITH_CUDA
  if (cuda_) {
    Streams& s = Of(cuda_);
    const c10::cuda::CUDAStream& stream = direction == Direction::kIn ? s.in : s.out;
    for (const StreamMark* wait : {&compute, &after}) {
      if (wait->event_) static_cast<Event*>(wait->event_.get())->block(stream);
    }
    c10::cuda::CUDAStreamGuard guard(stream);
    for (size_t i = 0; i < dst.size(); ++i) {
      dst[i].copy_(src[i], /*non_blocking=*/true);
      // The device side is used by this stream: the allocator must not reuse it before.
      const torch::Tensor& on_device = direction == Direction::kIn ? dst[i] : src[i];
      on_device.record_stream(stream);
    }
    m.event_ = Record(stream);
    return m;
  }
#else
  (void)direction, (void)after, (void)compute;
#endif
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  return m;
}

torch::Tensor HostTensorFor(const torch::Device& device, at::IntArrayRef shape,
                            torch::ScalarType dtype) {
  return torch::zeros(shape, torch::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda()));
}

HostTensorPool::HostTensorPool(const torch::Device& device, size_t limit_bytes)
    : pool_(limit_bytes, PinningFor(device)) {}

std::vector<torch::Tensor> HostTensorPool::Get(const std::vector<std::vector<int64_t>>& shapes,
                                               const std::vector<torch::ScalarType>& types) {
  if (shapes.empty()) return {};
  constexpr size_t kAlign = 64;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    offsets.push_back(total);
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    const size_t bytes = static_cast<size_t>(n) * c10::elementSize(types[i]);
    total += (bytes + kAlign - 1) / kAlign * kAlign;
  }
  std::shared_ptr<AlignedSlab> slab = pool_.Get(std::max(total, kAlign));
  TORCH_CHECK(slab != nullptr, kHostPoolRefused, " (", total, " bytes)");
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    out.push_back(torch::from_blob(
        slab->data() + offsets[i], shapes[i], [slab](void*) {},
        torch::TensorOptions().dtype(types[i])));
  }
  return out;
}

torch::Tensor HostTensorPool::GetOne(at::IntArrayRef shape, torch::ScalarType type) {
  const std::vector<std::vector<int64_t>> shapes = {shape.vec()};
  return Get(shapes, std::vector<torch::ScalarType>{type}).front();
}

}  // namespace hydra::executor
