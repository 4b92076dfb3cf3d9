#pragma once
// Torch-free: AdamW's update over plain float arrays, vectorized for the CPU it runs on.

#include <cstdint>
#include <string>
#include <vector>

namespace hydra::executor {

/// One AdamW update's scalars (torch.optim.AdamW's, with the bias corrections folded in).
struct AdamWScalars {
  float decay_factor = 1;  ///< 1 - lr * weight_decay, or 1 without decay
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float step_size = 0;  ///< lr / (1 - beta1^step)
  float bc2_sqrt = 1;   ///< sqrt(1 - beta2^step)
  float eps = 1e-8f;
};

/// The instruction sets the update is compiled for. Every one computes the same float
/// operations in the same order per element (IEEE multiply, add, divide and square root, no
/// fused multiply-add), so all give the same bits: a checkpoint resumes identically on any
/// x86-64 CPU.
enum class AdamWIsa {
  kScalar,  ///< one element at a time (the reference)
  kSse2,    ///< 4 lanes: every x86-64 CPU
  kAvx2,    ///< 8 lanes
  kAvx512,  ///< 16 lanes (AVX-512F)
};

const char* AdamWIsaName(AdamWIsa isa);

/// The instruction sets this CPU runs, the reference first and the widest last.
std::vector<AdamWIsa> SupportedAdamWIsas();

/// The widest of SupportedAdamWIsas(): what AdamWUpdate uses.
AdamWIsa BestAdamWIsa();

/// Elements [0, n): m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
/// p = p decay_factor - step_size m / (sqrt(v) / bc2_sqrt + eps): torch.optim.AdamW's
/// single-tensor operations in their order, in one pass over the four arrays (DeepSpeed's CPU
/// Adam idea) instead of eight tensor-wide passes and three temporaries. `isa` must be one of
/// SupportedAdamWIsas().
void AdamWUpdate(AdamWIsa isa, float* p, const float* g, float* m, float* v, int64_t n,
                 const AdamWScalars& s);

/// The same with BestAdamWIsa().
void AdamWUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

}  // namespace hydra::executor
