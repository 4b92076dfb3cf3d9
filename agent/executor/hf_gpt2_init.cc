#include "agent/executor/hf_gpt2_init.h"

#include <map>

#include "agent/executor/gpt2.h"

namespace hydra::executor {
namespace {

torch::ScalarType TorchType(SafetensorsDtype d) {
  switch (d) {
    case SafetensorsDtype::kBF16: return torch::kBFloat16;
    case SafetensorsDtype::kF16: return torch::kHalf;
    default: return torch::kFloat;
  }
}

}  // namespace

Status LoadHfGpt2Layer(const SafetensorsFile& file, const ModelSpec& spec, const LayerSequence& seq,
                       size_t layer) {
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : seq.layers.at(layer)->named_parameters(/*recurse=*/true)) {
    params[seq.names[layer] + "." + p.key()] = p.value();
  }
  torch::NoGradGuard no_grad;
  for (const auto& t : HfGpt2Tensors(spec)) {
    if (t.layer != layer) continue;
    const SafetensorsEntry* e = FindHfGpt2(file, t);
    auto target = params.find(t.ours);
    if (e == nullptr || target == params.end()) {
      return InternalError(file.path() + ": '" + t.hf + "' was checked but cannot be loaded");
    }
    // The mapping is read-only; from_blob only reads it, and `to` copies out of it.
    auto source = torch::from_blob(const_cast<char*>(file.Data(*e)), e->shape,
                                   torch::TensorOptions().dtype(TorchType(e->dtype)));
    if (t.transposed) source = source.t();
    if (t.ours == "embed.wpe") source = source.narrow(0, 0, spec.context_length);
    target->second.copy_(source.to(torch::kFloat));
    file.Release(*e);  // copied: its pages need not stay resident
  }
  return OkStatus();
}

StatusOr<LayerSequence> BuildHfGpt2(
    const ModelSpec& spec,
    const std::function<void(const LayerSequence&, size_t)>& on_layer_built) {
  ASSIGN_OR_RETURN(SafetensorsFile file, OpenHfGpt2(spec));
  Status status;
  // The seed only fills each layer before its tensors overwrite it.
  LayerSequence seq = BuildGpt2(spec, /*seed=*/0, [&](const LayerSequence& s, size_t layer) {
    if (!status.ok()) return;
    status = LoadHfGpt2Layer(file, spec, s, layer);
    if (status.ok() && on_layer_built) on_layer_built(s, layer);
  });
  RETURN_IF_ERROR(status);
  return seq;
}

}  // namespace hydra::executor
