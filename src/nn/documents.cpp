#include "triad/nn/documents.h"

#include <algorithm>
#include <string>
#include <vector>

#include "triad/backend/backend.h"
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
  // (On the host: the CPU backend's loop, which a device's kernel matches.)
  const Tensor host = contiguous(to_device(ids, Device::cpu()));
  DocumentLayout d{empty(host.shape(), DType::I32), empty(host.shape(), DType::I64)};
  backend_for(host).document_starts(host, eod_token, 0, d.starts, &d.positions);
  return d;
}

Tensor document_starts_of(const Tensor& ids, int64_t eod_token) {
  if (ids.device().is_cpu()) return document_layout(ids, eod_token).starts;
  if (ids.dim() != 2) {
    throw ShapeError("document_starts_of: token ids must be (B, T), got " + shape_str(ids.shape()));
  }
  const Tensor c = contiguous(ids);  // (Backend::document_starts names a bad dtype)
  Tensor starts = empty(c.shape(), DType::I32, c.device());
  backend_for(c).document_starts(c, eod_token, 0, starts, nullptr);
  return starts;
}

Tensor sliding_window_starts(int64_t B, int64_t T, int64_t window, const Tensor& doc_starts) {
  if (window < 1) {
    throw ValueError("sliding_window_starts: window (" + std::to_string(window) + ") must be >= 1");
  }
  const Tensor d =
      doc_starts.defined() ? contiguous(to_device(doc_starts, Device::cpu())) : Tensor();
  if (d.defined() && (d.dtype() != DType::I32 || d.shape() != Shape{B, T})) {
    throw ShapeError("sliding_window_starts: doc_starts must be i32 (" + std::to_string(B) + ", " +
                     std::to_string(T) + "), got " + dtype_name(d.dtype()) + " " +
                     shape_str(d.shape()));
  }
  std::vector<int64_t> starts(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      const int64_t doc = d.defined() ? d.data<int32_t>()[i] : 0;
      starts[i] = std::max(doc, t - window + 1);
    }
  }
  return from_vector(starts, {B, T}, DType::I32);
}

namespace {

// ctx with d's document starts (`mask`) and positions (`positions`) for
// (B, T) rows, and cfg's sliding window over them (`window`).
ForwardContext apply_layout(const GptConfig& cfg, int64_t B, int64_t T, const DocumentLayout& d,
                            bool mask, bool positions, bool window, ForwardContext ctx,
                            const Device& device) {
  if (mask || window) {
    Tensor starts = mask ? d.starts : Tensor();
    if (window) {
      // Layers exempt from the window see their documents alone.
      if (!cfg.full_attention_layers.empty())
        ctx.full_starts = !starts.defined() || device.is_cpu() ? starts : to_device(starts, device);
      // (The window alone, where no documents reset the mask.)
      if (!mask) ctx.starts_window = cfg.sliding_window;
      starts = sliding_window_starts(B, T, cfg.sliding_window, starts);
    }
    ctx.doc_starts = device.is_cpu() ? starts : to_device(starts, device);
  }
  if (positions) {
    // The position table takes host ids; rotary embeddings read them where
    // the attention runs (uploaded once per forward, not once per layer).
    ctx.positions = cfg.rotary() && !device.is_cpu() ? to_device(d.positions, device) : d.positions;
  }
  return ctx;
}

// apply_layout's fields formed where the ids are (a device): the backend's
// document_starts, never a read of the ids on the host (inside a CUDA
// graph's capture there is none). The same values as the host's.
ForwardContext layout_on_device(const GptConfig& cfg, const Tensor& ids, bool mask, bool positions,
                                bool window, ForwardContext ctx, const Device& device) {
  if (ids.dim() != 2) {
    throw ShapeError("with_documents: token ids must be (B, T), got " + shape_str(ids.shape()));
  }
  const Tensor c = contiguous(ids);  // (Backend::document_starts names a bad dtype)
  Backend& be = backend_for(c);
  const int64_t B = c.size(0), T = c.size(1);
  const auto there = [&device](const Tensor& t) { return to_device(t, device); };
  Tensor docs;  // each token's document's start, i32
  if (mask || positions) {
    docs = empty({B, T}, DType::I32, c.device());
    Tensor pos = positions ? empty({B, T}, DType::I64, c.device()) : Tensor();
    be.document_starts(c, cfg.eod_token, 0, docs, positions ? &pos : nullptr);
    if (positions) ctx.positions = there(pos);
  }
  if (mask || window) {
    Tensor starts = mask ? docs : Tensor();
    if (window) {
      if (!cfg.full_attention_layers.empty())
        ctx.full_starts = starts.defined() ? there(starts) : starts;
      if (!mask) ctx.starts_window = cfg.sliding_window;
      // (Without document resets an end no id equals: ids are >= 0.)
      starts = empty({B, T}, DType::I32, c.device());
      be.document_starts(c, mask ? cfg.eod_token : -1, cfg.sliding_window, starts, nullptr);
    }
    ctx.doc_starts = there(starts);
  }
  return ctx;
}

}  // namespace

ForwardContext with_documents(const GptConfig& cfg, const Tensor& ids, ForwardContext ctx,
                              const Device& device) {
  const bool mask = cfg.reset_attention_mask && !ctx.doc_starts.defined();
  const bool positions = cfg.reset_position_ids && !ctx.positions.defined();
  // A window shorter than the rows limits every query's keys, documents or not.
  const bool window = cfg.sliding_window > 0 && ids.dim() == 2 &&
                      ids.size(1) > cfg.sliding_window && !ctx.doc_starts.defined();
  if (!mask && !positions && !window) return ctx;
  if (!ids.device().is_cpu()) {
    return layout_on_device(cfg, ids, mask, positions, window, std::move(ctx), device);
  }
  DocumentLayout d;
  if (mask || positions) d = document_layout(ids, cfg.eod_token);
  return apply_layout(cfg, ids.size(0), ids.size(1), d, mask, positions, window, std::move(ctx),
                      device);
}

ForwardContext with_left_padding(const GptConfig& cfg, const std::vector<int64_t>& row_start,
                                 int64_t T, ForwardContext ctx, const Device& device) {
  const auto B = static_cast<int64_t>(row_start.size());
  std::vector<int64_t> starts(static_cast<size_t>(B * T)), positions(starts.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t text = row_start[b];
    if (text < 0 || text > T) {
      throw ValueError("with_left_padding: row " + std::to_string(b) + " starts at " +
                       std::to_string(text) + ", not in [0, " + std::to_string(T) + "]");
    }
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      starts[i] = t < text ? 0 : text;
      positions[i] = std::max<int64_t>(0, t - text);
    }
  }
  const DocumentLayout d{from_vector(starts, {B, T}, DType::I32),
                         from_vector(positions, {B, T}, DType::I64)};
  return apply_layout(cfg, B, T, d, true, true, cfg.sliding_window > 0 && T > cfg.sliding_window,
                      std::move(ctx), device);
}

ForwardContext with_one_document(const GptConfig& cfg, const Tensor& ids, ForwardContext ctx,
                                 const Device& device) {
  GptConfig one = cfg;
  one.reset_attention_mask = one.reset_position_ids = false;
  return with_documents(one, ids, std::move(ctx), device);
}

}  // namespace triad::nn
