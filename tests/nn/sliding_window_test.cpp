// Sliding-window attention (model.sliding_window, Mistral's): each query
// sees itself and the window - 1 keys before it, within its document. The
// first keys, attention against the explicitly masked softmax, and the
// model.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/gpt_config_checks.h"
#include "triad/autograd/engine.h"
#include "triad/nn/documents.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

TEST(SlidingWindow, FirstKeysAreTheLaterOfTheDocumentsAndTheWindows) {
  EXPECT_EQ(to_double_vector(sliding_window_starts(1, 8, 3)),
            (std::vector<double>{0, 0, 0, 1, 2, 3, 4, 5}));
  const Tensor docs = from_vector(std::vector<int64_t>{0, 0, 0, 0, 4, 4, 4, 4}, {1, 8}, DType::I32);
  EXPECT_EQ(to_double_vector(sliding_window_starts(1, 8, 3, docs)),
            (std::vector<double>{0, 0, 0, 1, 4, 4, 4, 5}));
  EXPECT_EQ(to_double_vector(sliding_window_starts(1, 4, 1)), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_THROW(sliding_window_starts(1, 8, 0), ValueError);
  EXPECT_THROW(
      sliding_window_starts(1, 8, 3, from_vector(std::vector<int64_t>{0, 0}, {1, 2}, DType::I32)),
      ShapeError);
}

// Dense attention for one (row, head): softmax(q k^T / sqrt(D) + mask) v
// with -inf outside [first[t], t], built from differentiable ops.
Tensor masked_attention(const Tensor& qkv, int64_t H, const std::vector<double>& first) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / H;
  std::vector<double> mask(static_cast<size_t>(B * T * T), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < T; ++j) {
        if (j > t || j < static_cast<int64_t>(first[static_cast<size_t>(b * T + t)]))
          mask[static_cast<size_t>((b * T + t) * T + j)] = -std::numeric_limits<double>::infinity();
      }
    }
  }
  const Tensor m = reshape(from_vector(mask, {B, T, T}, qkv.dtype()), {B, 1, T, T});
  auto heads = [&](int64_t which) {
    return contiguous(permute(reshape(narrow(qkv, 2, which * C, C), {B, T, H, D}), {0, 2, 1, 3}));
  };
  Tensor scores = add(matmul(scale(heads(0), 1.0 / std::sqrt(static_cast<double>(D))),
                             contiguous(transpose(heads(1), 2, 3))),
                      m);
  Tensor y = matmul(softmax(scores), heads(2));  // (B, H, T, D)
  return reshape(contiguous(permute(y, {0, 2, 1, 3})), {B, T, C});
}

// The fused kernel over a window (and a window inside packed documents)
// equals the dense masked softmax, values and gradients; T = 70 spans two
// of the CPU kernel's 64-row blocks, the second starting past the first's
// keys.
TEST(SlidingWindow, AttentionEqualsTheExplicitlyMaskedSoftmax) {
  const int64_t B = 2, T = 70, H = 2, C = 8;
  const Tensor docs = nn::document_layout(
                          [&] {
                            std::vector<int64_t> ids(B * T, 3);
                            for (int64_t end : {29, 40}) ids[static_cast<size_t>(T + end)] = 0;
                            return from_vector(ids, {B, T});
                          }(),
                          0)
                          .starts;
  for (const int64_t window : {9, 1, 64}) {
    for (const bool documents : {false, true}) {
      SCOPED_TRACE("window " + std::to_string(window) + (documents ? ", documents" : ""));
      const Tensor starts = sliding_window_starts(B, T, window, documents ? docs : Tensor());
      Tensor qkv = randn({B, T, 3 * C}, 8, 1, 1.0, DType::F64);
      qkv.set_requires_grad(true);
      const Tensor w = randn({B, T, C}, 8, 2, 1.0, DType::F64);
      const Tensor fused = causal_attention(qkv, H, starts);
      const Tensor dense = masked_attention(qkv, H, to_double_vector(starts));
      const std::vector<double> a = to_double_vector(fused), b = to_double_vector(dense);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << i;
      autograd::backward({sum(mul(fused, w))});
      const std::vector<double> g = to_double_vector(qkv.grad());
      qkv.set_grad(Tensor());
      autograd::backward({sum(mul(dense, w))});
      const std::vector<double> want = to_double_vector(qkv.grad());
      for (size_t i = 0; i < g.size(); ++i)
        ASSERT_NEAR(g[i], want[i], 1e-11 * (1 + std::abs(want[i]))) << i;
    }
  }
}

GptConfig windowed(int64_t window) {
  GptConfig c{.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 23, .seq_len = 16};
  c.position_embedding = PositionEmbedding::Rotary;
  c.sliding_window = window;
  return c;
}

// A window as long as the rows changes nothing (no first keys are made); a
// shorter one changes the logits of the positions past it only.
TEST(SlidingWindow, GptSeesOnlyTheWindow) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 2 * 16; ++i) tokens.push_back((i * 5 + 2) % 23);
  const Tensor ids = from_vector(tokens, {2, 16});
  const ForwardContext eval{false, 0, 0};
  const Gpt full(windowed(0), 3), same(windowed(16), 3), narrow_window(windowed(4), 3);
  EXPECT_FALSE(with_documents(windowed(16), ids, eval, Device::cpu()).doc_starts.defined());
  EXPECT_TRUE(with_documents(windowed(4), ids, eval, Device::cpu()).doc_starts.defined());
  const std::vector<double> a = to_double_vector(full.forward(ids, eval));
  EXPECT_EQ(to_double_vector(same.forward(ids, eval)), a);
  const std::vector<double> b = to_double_vector(narrow_window.forward(ids, eval));
  const int64_t V = 23;
  for (int64_t row = 0; row < 2; ++row) {
    for (int64_t t = 0; t < 16; ++t) {
      double diff = 0;
      for (int64_t v = 0; v < V; ++v) {
        const size_t i = static_cast<size_t>((row * 16 + t) * V + v);
        diff = std::max(diff, std::abs(a[i] - b[i]));
      }
      if (t < 4) {
        EXPECT_LT(diff, 1e-12) << "position " << t << " is inside the window";
      } else {
        EXPECT_GT(diff, 1e-6) << "position " << t << " sees fewer keys";
      }
    }
  }
}

// model.full_attention_layers: the exempt layers see every earlier key.
// Every layer exempt is no window at all; none exempt is the window on
// every layer; one exempt is neither, and the layer's own attention reads
// the documents' starts alone (with packed documents too).
TEST(SlidingWindow, ExemptLayersSeeEveryKey) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 2 * 16; ++i) tokens.push_back((i * 5 + 2) % 23);
  const Tensor ids = from_vector(tokens, {2, 16});
  const ForwardContext eval{false, 0, 0};
  auto exempt = [](std::vector<int64_t> layers) {
    GptConfig c = windowed(4);
    c.full_attention_layers = std::move(layers);
    return c;
  };
  EXPECT_EQ(exempt({1}).window_of(0), 4);
  EXPECT_EQ(exempt({1}).window_of(1), 0);
  auto logits = [&](const GptConfig& c) { return to_double_vector(Gpt(c, 3).forward(ids, eval)); };
  const std::vector<double> none = logits(windowed(0)), all = logits(windowed(4));
  EXPECT_EQ(logits(exempt({0, 1})), none);
  EXPECT_EQ(logits(exempt({})), all);
  const std::vector<double> mixed = logits(exempt({1})), other = logits(exempt({0}));
  auto far = [](const std::vector<double>& a, const std::vector<double>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
    return d;
  };
  EXPECT_GT(far(mixed, none), 1e-6);
  EXPECT_GT(far(mixed, all), 1e-6);
  EXPECT_GT(far(mixed, other), 1e-6);
  // The context: the windowed first keys for the windowed layers, the
  // documents' alone (none here: from 0) for the exempt one.
  const ForwardContext ctx = with_documents(exempt({1}), ids, eval, Device::cpu());
  ASSERT_TRUE(ctx.full_starts.has_value());
  EXPECT_FALSE(ctx.full_starts->defined());
  EXPECT_TRUE(ctx.attention_starts(true).defined());
  EXPECT_FALSE(ctx.attention_starts(false).defined());
  EXPECT_FALSE(with_documents(windowed(4), ids, eval, Device::cpu()).full_starts.has_value());
  // With packed documents the exempt layer still stops at its document.
  GptConfig docs = exempt({1});
  docs.eod_token = 7;
  docs.reset_attention_mask = true;
  Tensor with_ends = ids;
  for (int64_t i : {5, 20}) with_ends.data<int64_t>()[i] = 7;
  const ForwardContext dctx = with_documents(docs, with_ends, eval, Device::cpu());
  ASSERT_TRUE(dctx.full_starts.has_value() && dctx.full_starts->defined());
  EXPECT_EQ(to_double_vector(*dctx.full_starts)[8], 6.0);  // row 0's second document
  EXPECT_EQ(to_double_vector(dctx.doc_starts)[15], 12.0);  // the window, later than 6
  // The first keys are the window alone without documents (what cuDNN's
  // windowed graph may stand in for), and not with them: the windowed
  // layers' heads carry the window only then, the exempt layer's never.
  EXPECT_EQ(ctx.starts_window, 4);
  EXPECT_EQ(ctx.attention_heads(AttentionHeads{2}, 4).window, 4);
  EXPECT_EQ(ctx.attention_heads(AttentionHeads{2}, 0).window, 0);
  EXPECT_EQ(dctx.starts_window, 0);
  EXPECT_EQ(dctx.attention_heads(AttentionHeads{2}, 4).window, 0);
  EXPECT_EQ(with_documents(windowed(16), ids, eval, Device::cpu()).starts_window, 0);
}

// A sliding window promised by the heads (AttentionHeads::with_window) is
// checked against the first keys where they are on the host: the window's
// own pass, a document's start in them, or another window, do not.
TEST(SlidingWindow, TheHeadsWindowPromiseIsChecked) {
  const Tensor qkv = randn({2, 8, 3 * 8}, 5, 1, 1.0);
  const AttentionHeads heads = AttentionHeads{2}.with_window(3);
  const Tensor starts = sliding_window_starts(2, 8, 3);
  EXPECT_EQ(to_double_vector(causal_attention(qkv, heads, starts)),
            to_double_vector(causal_attention(qkv, 2, starts)));
  // (Row 1's second document starts at its query 5.)
  const Tensor docs = from_vector(
      std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 5, 5}, {2, 8}, DType::I32);
  const Tensor with_doc = sliding_window_starts(2, 8, 3, docs);
  try {
    (void)causal_attention(qkv, heads, with_doc);
    ADD_FAILURE() << "a document's start passed for the window";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("doc_starts[1, 5] is 5, not 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(causal_attention(qkv, AttentionHeads{2}.with_window(4), starts), ValueError);
  EXPECT_THROW(causal_attention(qkv, AttentionHeads{2}.with_window(-1), starts), ValueError);
}

TEST(SlidingWindow, ConfigIsChecked) {
  GptConfig c = windowed(-1);
  try {
    c.validate();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.sliding_window (-1) must be >= 0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(windowed(4).needs_attention_starts());
  EXPECT_FALSE(windowed(0).needs_attention_starts());
  GptConfig exempt = windowed(0);
  exempt.full_attention_layers = {1};
  triad::testing::expect_invalid(exempt,
                                 "model.full_attention_layers exempts layers from a window, but "
                                 "model.sliding_window is 0");
  exempt.sliding_window = 4;
  exempt.full_attention_layers = {2};
  triad::testing::expect_invalid(
      exempt,
      "model.full_attention_layers: 2 at position 0; expected increasing layer "
      "indices in [0, 2)");
  exempt.full_attention_layers = {1, 0};
  triad::testing::expect_invalid(exempt, "model.full_attention_layers: 0 at position 1");
  exempt.full_attention_layers = {0, 1};
  EXPECT_NO_THROW(exempt.validate());
}

// model.nope_layers: a layer without rope is the layer whose rotation
// turns by nothing, which its own forward pass (and the cache's) skips:
// the same logits as a base so large every angle is 0 there, and not those
// of the layer turning. Checked: increasing indices of layers, rope only.
TEST(NopeLayers, ALayerWithoutRopeTurnsNothing) {
  GptConfig c = windowed(0);
  c.position_embedding = PositionEmbedding::Rotary;
  EXPECT_TRUE(c.rotary_at(0) && c.rotary_at(1));
  GptConfig nope = c;
  nope.nope_layers = {1};
  EXPECT_TRUE(nope.rotary_at(0));
  EXPECT_FALSE(nope.rotary_at(1));
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 2 * 16; ++i) tokens.push_back((i * 5 + 2) % 23);
  const Tensor ids = from_vector(tokens, {2, 16});
  const ForwardContext eval{false, 0, 0};
  const Gpt without(nope, 3), with(c, 3);
  const std::vector<double> got = to_double_vector(without.forward(ids, eval));
  const std::vector<double> turning = to_double_vector(with.forward(ids, eval));
  double far = 0;
  for (size_t i = 0; i < got.size(); ++i) far = std::max(far, std::abs(got[i] - turning[i]));
  EXPECT_GT(far, 1e-6);
  // Every layer without rope is learned positions with a zero table: the
  // order seen through the causal mask alone.
  GptConfig all = c;
  all.nope_layers = {0, 1};
  GptConfig learned = c;
  learned.position_embedding = PositionEmbedding::Learned;
  Gpt table(learned, 3);
  StateDict state = Gpt(all, 3).state_dict();
  state["wpe.weight"] = zeros({learned.seq_len, learned.d_model});
  table.load_state_dict(state);
  EXPECT_EQ(to_double_vector(Gpt(all, 3).forward(ids, eval)),
            to_double_vector(table.forward(ids, eval)));
  GptConfig bad = nope;
  bad.nope_layers = {2};
  triad::testing::expect_invalid(
      bad, "model.nope_layers: 2 at position 0; expected increasing layer indices in [0, 2)");
  bad.nope_layers = {1, 1};
  triad::testing::expect_invalid(bad, "model.nope_layers: 1 at position 1");
  bad = learned;
  bad.nope_layers = {0};
  triad::testing::expect_invalid(bad,
                                 "model.nope_layers leaves layers without rope, but "
                                 "model.position_embedding is learned");
}

}  // namespace
}  // namespace triad::nn
