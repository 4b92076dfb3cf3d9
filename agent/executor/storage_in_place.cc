#include "agent/executor/storage_in_place.h"

#include <c10/core/StorageImpl.h>

namespace hydra::executor {

void FreeStorageInPlace(const torch::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), "freeing the storage of a non-contiguous tensor in place");
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
  s->set_nbytes(size_t{0});
}

bool StorageFreedInPlace(const torch::Tensor& t) {
  return t.defined() && t.numel() > 0 && t.storage().nbytes() == 0;
}

void RefillStorage(const torch::Tensor& t) {
  TORCH_CHECK(StorageFreedInPlace(t), "refilling a storage that was not freed in place");
  const auto bytes = static_cast<size_t>((t.storage_offset() + t.numel()) * t.element_size());
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

}  // namespace hydra::executor
