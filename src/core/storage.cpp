#include "triad/core/storage.h"

namespace triad {

Storage::Storage(size_t nbytes, Allocator& allocator) : nbytes_(nbytes), allocator_(&allocator) {
  data_ = allocator.allocate(nbytes);
}

Storage::~Storage() {
  allocator_->deallocate(data_, nbytes_);
}

}  // namespace triad
