#include "agent/executor/tensor_buffers.h"

#include <cstring>
#include <map>

namespace hydra::executor {
namespace {

std::string DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kLong: return "int64";
    case torch::kInt: return "int32";
    default: return c10::toString(t);
  }
}

}  // namespace

NamedBuffer TensorToBuffer(const std::string& name, const torch::Tensor& tensor) {
  auto t = tensor.detach().to(torch::kCPU).contiguous();
  NamedBuffer b;
  b.name = name;
  b.dtype = DtypeName(t.scalar_type());
  b.shape = t.sizes().vec();
  const size_t n = t.numel() * t.element_size();
  b.data.resize(n);
  if (n > 0) std::memcpy(b.data.data(), t.data_ptr(), n);
  return b;
}

Status CopyBuffersInto(const std::vector<NamedBuffer>& buffers,
                       const std::vector<std::pair<std::string, torch::Tensor>>& targets,
                       bool allow_extra) {
  std::map<std::string, const NamedBuffer*> by_name;
  for (const auto& b : buffers) by_name[b.name] = &b;
  if (by_name.size() != buffers.size()) return InvalidArgumentError("state has duplicate names");
  // Validate everything before touching any tensor.
  for (const auto& [name, t] : targets) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return InvalidArgumentError("state lacks tensor '" + name + "'");
    const NamedBuffer& b = *it->second;
    if (b.dtype != DtypeName(t.scalar_type()) || b.shape != t.sizes().vec()) {
      return InvalidArgumentError("state tensor '" + name + "' is " + b.dtype + ShapeText(b.shape) +
                                  ", expected " + DtypeName(t.scalar_type()) +
                                  ShapeText(t.sizes().vec()));
    }
    if (b.data.size() != static_cast<size_t>(t.numel() * t.element_size())) {
      return InvalidArgumentError("state tensor '" + name + "' has " +
                                  std::to_string(b.data.size()) + " bytes, expected " +
                                  std::to_string(t.numel() * t.element_size()));
    }
  }
  if (!allow_extra && targets.size() != buffers.size()) {
    for (const auto& b : buffers) {
      bool known = false;
      for (const auto& [name, t] : targets) known = known || name == b.name;
      if (!known) return InvalidArgumentError("state has unexpected tensor '" + b.name + "'");
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : targets) {
    const NamedBuffer& b = *by_name[name];
    auto src = torch::from_blob(const_cast<char*>(b.data.data()), t.sizes(), t.scalar_type());
    t.copy_(src);
  }
  return OkStatus();
}

}  // namespace hydra::executor
