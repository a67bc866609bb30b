#pragma once

#include <cstdint>

#include "triad/nn/module.h"

namespace triad::nn {

// A lookup table of num_embeddings rows of dimension dim.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, DType dtype = DType::F32);
  Tensor forward(const Tensor& ids) const;
  Tensor& weight() { return weight_; }

 private:
  Tensor weight_;
};

}  // namespace triad::nn
