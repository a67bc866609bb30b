#pragma once

#include <cstddef>
#include <memory>

#include "triad/core/allocator.h"

namespace triad {

// A block of device memory owned by reference-counted tensors and views.
class Storage {
 public:
  Storage(size_t nbytes, Allocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return allocator_->device(); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Allocator* allocator_;
};

}  // namespace triad
