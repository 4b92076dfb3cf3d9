#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/job.h"

namespace hydra {

/// Analytic size and cost of one layer of a layer-sequence model at a given micro-batch.
/// Used to check budgets, to report the footprint of unsharded trials, and (later) by the
/// partitioner and the simulator. Byte counts follow spec.training.precision (fp32 unless the
/// Trial overload is given a bf16 trial).
struct LayerCost {
  std::string name;        ///< "embed", "block3", "head"
  int64_t parameters = 0;  ///< parameters owned by this layer (tied ones counted once)
  /// Of `parameters`, those another layer also uses (GPT-2's token embedding, tied to the LM
  /// head). When the model is sharded they stay resident on the device for the whole step.
  int64_t tied_parameters = 0;
  int64_t activation_bytes = 0;  ///< bytes autograd keeps for backward, per micro-batch
  /// Of activation_bytes, those that recomputing the attention scores in backward frees (a
  /// GPT-2 block's H x T scores and probabilities per token; 0 for other layers), and the
  /// forward FLOPs that recompute costs (QK^T and PV), per micro-batch.
  int64_t attention_bytes = 0;
  double attention_flops = 0;
  int64_t output_bytes = 0;  ///< bytes of the layer's output, per micro-batch
  double forward_flops = 0;  ///< per micro-batch
  /// Of activation_bytes, those selective recompute frees (a GPT-2 block's LayerNorm and GELU
  /// outputs, which its backward computes again: agent/executor/selective_recompute.h), and
  /// what computing them again costs in FLOPs of the matrix products (kRecomputeFlopsPerValue a
  /// value), per micro-batch; 0 for other layers.
  int64_t recomputable_bytes = 0;
  double recompute_flops = 0;
  /// Bytes the layer's backward allocates beyond what it keeps, per micro-batch, apart from its
  /// attention's (AttentionTransientBytes) and selective recompute's: a GPT-2 block's gradients
  /// of its MLP's 4C hidden, two at once (in bf16 bf16, beside one C wide); the embedding's
  /// dense gradient of its token embedding, which autograd then adds to the tied weights' own;
  /// an image layer's (mlp, resnet) new weight gradients (in bf16 also their bf16 copies) and
  /// its input's and output's gradients (a ResNet layer's convolutions and GroupNorms: twice
  /// each). TorchScript layers: as measured when loaded (ModuleLayer::memory), the forward's
  /// temporaries included.
  int64_t backward_bytes = 0;
  /// An attention layer's gradients of its scores beyond what kKept counts, per micro-batch:
  /// in fp32 one H x T per token more (the scores themselves are not kept, their gradient and
  /// the probabilities' are alive at once); in bf16 none.
  int64_t score_gradient_bytes = 0;
  /// What a GPT-2 block's backward holds at once with selective recompute beyond the values it
  /// keeps, per micro-batch: the LayerNorm and GELU outputs computed again and their working
  /// copies (fp32 32C bytes a token, bf16 24C).
  int64_t selective_backward_bytes = 0;
  /// Its buffers (GPT-2's causal mask, a TorchScript module's), on the device for the trial's
  /// life whatever the plan; a buffer several layers share counted at the first.
  int64_t buffer_bytes = 0;
};

/// The fused LM head and loss (agent/executor/lm_head_loss): rows of the final hidden states
/// whose logits are reduced to their loss (a log-softmax in fp32) at a time, and the most
/// bytes of logits' gradients (in the GEMMs' type) it gathers before turning them into the
/// gradients of the hidden states and of the tied weights (two GEMMs): the forward computes
/// the gradients, so that no [tokens, vocabulary] tensor outlives it.
inline constexpr int64_t kLmHeadChunkRows = 256;
inline constexpr int64_t kLmHeadBlockBytes = int64_t{64} << 20;

/// Elements a row of its logits takes in memory: the vocabulary rounded up to 64 (the weights'
/// copy the products read has as many rows, the padding's 0; its logits are -inf for the
/// log-softmax, its gradients 0). Rows of GPT-2's 50257 logits (odd) are unaligned for cuBLAS,
/// whose bf16 products then fall back to slow kernels (sm75 `align1` CUTLASS kernels on an H200:
/// the head's three products took 21 ms of GPT-2 medium's 82 ms step; about 4 padded).
inline int64_t LmHeadLogitsRow(int64_t vocab) { return (vocab + 63) / 64 * 64; }

/// Rows of one such block: a multiple of kLmHeadChunkRows, at least one chunk.
inline int64_t LmHeadBlockRows(int64_t vocab, int64_t element_bytes) {
  const int64_t chunks =
      kLmHeadBlockBytes / (kLmHeadChunkRows * LmHeadLogitsRow(vocab) * element_bytes);
  return kLmHeadChunkRows * (chunks > 1 ? chunks : 1);
}

/// What an elementwise value computed again in backward (LayerNorm, GELU) costs, in FLOPs of
/// the matrix products: they run at the memory's bandwidth, not the matrix units' rate. A guess
/// from an H200's ratio (50 TFLOP/s fp32 against 4.8 TB/s, some 12 bytes read and written a
/// value), not a measurement.
inline constexpr double kRecomputeFlopsPerValue = 125;

/// What an attention layer keeps from its forward for its backward.
enum class AttentionMemory {
  kKept,        ///< its H x T scores and probabilities (LayerCost::attention_bytes)
  kRecomputed,  ///< q, k and v only; its backward rebuilds the scores (agent/executor/attention.h)
  /// Neither: one fused kernel (LibTorch's scaled_dot_product_attention, flash or
  /// memory-efficient on a GPU) never materialises the scores; its backward needs an fp32
  /// accumulator of the layer's output size.
  kFused,
};
const char* AttentionMemoryName(AttentionMemory a);  ///< "kept", "recomputed", "fused"

/// Bytes layer `l` keeps for its backward, per micro-batch, when its attention does `a` (and
/// with `selective` recompute, its recomputable_bytes less).
int64_t KeptActivationBytes(const LayerCost& l, AttentionMemory a, bool selective = false);
/// Bytes layer `l`'s attention's backward needs only while it runs (the scores it rebuilds and
/// their gradients, or the fused kernel's accumulator), per micro-batch; 0 for layers without
/// attention.
int64_t AttentionTransientBytes(const LayerCost& l, AttentionMemory a);
/// Bytes layer `l`'s backward needs only while it runs, per micro-batch: its attention's or the
/// rest's (LayerCost::backward_bytes), whichever is more, and with `selective` recompute the
/// values it computes again. Measured against the bytes a block's backward allocates on the
/// CPU (device_memory_test), fp32 and bf16, kept and recomputed scores, with and without
/// selective recompute.
int64_t BackwardTransientBytes(const LayerCost& l, AttentionMemory a, bool selective);

/// Per-layer costs of the trial's model, in execution order. For family torchscript they come
/// from ModelSpec::layers (empty until the module was loaded).
std::vector<LayerCost> ModelLayerCosts(const ModelSpec& model, int64_t micro_batch);

/// Per-layer costs of the trial's model: as above, and for the image families (mlp, resnet)
/// from the dataset's imageShape too.
std::vector<LayerCost> ModelLayerCosts(const Trial& trial, int64_t micro_batch);

/// Bytes of optimizer state per parameter: 8 for AdamW (two moments), 4 for SGD with momentum.
int64_t OptimizerBytesPerParameter(const TrainingSpec& training);

/// Memory a trial needs when trained unsharded on one device.
struct TrialFootprint {
  int64_t parameters = 0;
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t activation_bytes = 0;  ///< of one micro-batch, whole model
  int64_t buffer_bytes = 0;      ///< the layers' buffers (LayerCost::buffer_bytes)
  int64_t total_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes + buffer_bytes;
  }
};

/// With `attention` other than kKept the activations leave the attention scores out and count
/// the largest layer's transient instead (what a GPU's fused attention, or recomputing the
/// scores, needs).
TrialFootprint EstimateTrialFootprint(const Trial& trial,
                                      AttentionMemory attention = AttentionMemory::kKept);

/// Largest number of parameters or bytes the cost model accounts for one layer or a whole
/// model: 1 PiB (2^50). Below it the formulas' double arithmetic is exact and every sum and
/// product the partitioner and the budgets form fits int64.
inline constexpr int64_t kMaxAccountedQuantity = int64_t{1} << 50;

/// The first quantity of the trial's model (a layer's parameters, activations or output, or
/// the model's total) over kMaxAccountedQuantity, as an error naming the manifest field to
/// change ("spec.model", or "spec.training.batchSize" for per-micro-batch sizes); nullopt
/// when everything fits. Validation refuses such trials, so the rest of the code may use the
/// int64 sizes without overflow checks.
std::optional<FieldError> CostModelLimitError(const Trial& trial);

}  // namespace hydra
