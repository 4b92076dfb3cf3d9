// Fuzz target: the safetensors header parser (agent/executor/safetensors.h), fed any bytes as
// a whole file. Refusals are INVALID_ARGUMENT; what it accepts tiles the data exactly.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "agent/executor/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using hydra::fuzz::Require;
  namespace ex = hydra::executor;
  const char* bytes = reinterpret_cast<const char*>(data);
  auto h = ex::ParseSafetensors(bytes, size, size, "fuzz");
  if (!h.ok()) {
    Require(h.status().code() == hydra::StatusCode::kInvalidArgument,
            "a malformed file is INVALID_ARGUMENT: " + h.status().ToString());
    Require(h.status().message().rfind("fuzz: ", 0) == 0, "errors name the file");
    return 0;
  }
  Require(h->data_offset >= 8 && h->data_offset <= size, "the data starts inside the file");
  const uint64_t data_bytes = size - h->data_offset;
  uint64_t at = 0;
  std::set<std::string> names;
  for (const auto& t : h->tensors) {
    Require(names.insert(t.name).second, "names are unique");
    Require(t.begin == at, "tensors follow each other with no gap or overlap");
    Require(t.end - t.begin == static_cast<uint64_t>(t.numel()) * ex::SafetensorsDtypeSize(t.dtype),
            "a tensor spans its shape's bytes");
    at = t.end;
  }
  Require(at == data_bytes, "the tensors cover the data");
  return 0;
}
