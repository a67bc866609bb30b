#pragma once

// Packed documents. Pretraining data concatenates documents separated by an
// end-of-document token (GPT-2's <|endoftext|>, 50256) and cuts the stream
// into rows of seq_len tokens, so a row usually holds the end of one
// document and the start of the next. By default a token attends to every
// earlier token of its row and takes its position from its place in the
// row. Megatron-LM's reset_attention_mask and reset_position_ids make each
// document of a row its own sequence instead: attention stops at the
// document's start and positions count from it. A document ends with its
// end-of-document token: the token after it starts the next one.
#include <cstdint>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::nn {

struct GptConfig;
struct ForwardContext;

// The documents of a batch of rows of input ids (B, T), i32 or i64, on any
// device (read on the host): for each token, where its document starts in
// its row (i32, (B, T)) and its position in that document (i64, (B, T)),
// both on the host. Without `eod_token` in a row the row is one document:
// starts 0, positions 0..T-1.
struct DocumentLayout {
  Tensor starts;
  Tensor positions;
};
DocumentLayout document_layout(const Tensor& ids, int64_t eod_token);
// The starts alone (i32 (B, T)) where the ids are: document_layout's for
// ids on the host; formed on the ids' device for ids there (the backend's
// document_starts, the same values), never read on the host, which inside
// a CUDA graph's capture cannot be.
Tensor document_starts_of(const Tensor& ids, int64_t eod_token);

// The first key each query of a (B, T) batch sees under a sliding window
// of `window` keys (itself and the window - 1 before it; Mistral's): max(its
// document's start in `doc_starts` (i32 (B, T) on the host; undefined: 0),
// t - window + 1), i32 (B, T) on the host. Non-decreasing along each row,
// as causal_attention's doc_starts must be.
Tensor sliding_window_starts(int64_t B, int64_t T, int64_t window, const Tensor& doc_starts = {});

// ctx for a forward pass over ids under cfg's document settings: with
// reset_attention_mask, ctx.doc_starts (on `device`, where the attention
// runs), limited to the last sliding_window keys when that is set (a
// sliding window alone gives doc_starts too, once T exceeds it; then layers
// exempt from it, model.full_attention_layers, read ctx.full_starts, the
// documents' starts alone); with reset_position_ids,
// ctx.positions (on the host: the position embedding takes host ids; on `device` under rotary
// embeddings, which the attention layers apply). Fields ctx already has are kept, so a caller can
// compute them once per micro-batch for every stage and recomputation. Ids on a device are never
// read on the host: the layout is formed there (Backend::document_starts; a CUDA graph's capture),
// positions included (on `device`).
ForwardContext with_documents(const GptConfig& cfg, const Tensor& ids, ForwardContext ctx,
                              const Device& device);
// The same with each row one document, whatever cfg's document resets (a
// sliding window still applies): text to continue or to score (generation,
// evaluation), read as the model reads a single document.
ForwardContext with_one_document(const GptConfig& cfg, const Tensor& ids, ForwardContext ctx,
                                 const Device& device);
// The same for (row_start.size(), T) rows of left-padded text (a batch of
// prompts, KvCache::row_start): row b's text starts at row_start[b], its
// queries see no key before it (the padding's own queries see the padding
// up to them: their outputs are never read, but stay finite), and its
// tokens sit at positions t - row_start[b] (the padding's at 0).
ForwardContext with_left_padding(const GptConfig& cfg, const std::vector<int64_t>& row_start,
                                 int64_t T, ForwardContext ctx, const Device& device);

}  // namespace triad::nn
