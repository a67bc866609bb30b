#include "triad/nn/documents.h"

#include <vector>

#include "triad/core/error.h"
#include "triad/nn/gpt.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"

namespace triad::nn {

DocumentLayout document_layout(const Tensor& ids, int64_t eod_token) {
  if (ids.dim() != 2) {
    throw ShapeError("document_layout: token ids must be (B, T), got " + shape_str(ids.shape()));
  }
  if (ids.dtype() != DType::I32 && ids.dtype() != DType::I64) {
    throw ValueError(std::string("document_layout: token ids must be i32 or i64, got ") +
                     dtype_name(ids.dtype()));
  }
  const int64_t B = ids.size(0), T = ids.size(1);
  const Tensor host = cast(to_device(ids, Device::cpu()), DType::I64);
  const Tensor hc = contiguous(host);
  const int64_t* p = hc.data<int64_t>();
  std::vector<int64_t> starts(static_cast<size_t>(B * T));
  std::vector<int64_t> positions(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      starts[i] = start;
      positions[i] = t - start;
      if (p[i] == eod_token) start = t + 1;  // the next token starts a document
    }
  }
  return {from_vector(starts, {B, T}, DType::I32), from_vector(positions, {B, T}, DType::I64)};
}

ForwardContext with_documents(const GptConfig& cfg, const Tensor& ids, ForwardContext ctx,
                              const Device& device) {
  const bool mask = cfg.reset_attention_mask && !ctx.doc_starts.defined();
  const bool positions = cfg.reset_position_ids && !ctx.positions.defined();
  if (!mask && !positions) return ctx;
  DocumentLayout d = document_layout(ids, cfg.eod_token);
  if (mask) ctx.doc_starts = device.is_cpu() ? d.starts : to_device(d.starts, device);
  if (positions) {
    // The position table takes host ids; rotary embeddings read them where
    // the attention runs (uploaded once per forward, not once per layer).
    ctx.positions = cfg.rotary() && !device.is_cpu() ? to_device(d.positions, device) : d.positions;
  }
  return ctx;
}

}  // namespace triad::nn
