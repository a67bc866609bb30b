#include "triad/nn/documents.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "triad/autograd/engine.h"
#include "triad/data/token_dataset.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::nn {
namespace {

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : to_double_vector(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " [" << i << "]";
  }
}

TEST(Documents, TheLayoutStartsADocumentAfterEachEndToken) {
  // Row 0: documents [0, 2), [2, 4), [4, 5), [5, 6) (eod 1 ends each);
  // row 1 has no end token: one document.
  const Tensor ids = from_vector(std::vector<int64_t>{5, 1, 7, 1, 1, 3, 2, 2, 2, 2, 2, 2}, {2, 6});
  const DocumentLayout d = document_layout(ids, 1);
  EXPECT_EQ(d.starts.dtype(), DType::I32);
  EXPECT_EQ(d.positions.dtype(), DType::I64);
  EXPECT_EQ(ints(d.starts), (std::vector<int64_t>{0, 0, 2, 2, 4, 5, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(ints(d.positions), (std::vector<int64_t>{0, 1, 0, 1, 0, 0, 0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(document_layout(from_vector(std::vector<int64_t>{1, 2}, {2}), 1), ShapeError);
}

// The attention of a packed row equals each document's attention run alone,
// forward and backward (f64, so the two differ only by summation order).
TEST(Documents, AttentionOverAPackedRowEqualsEachDocumentAlone) {
  const int64_t T = 70, C = 8, NH = 2;
  // Row 0: documents [0, 20), [20, 64), [64, 65), [65, 70); row 1: one.
  std::vector<int64_t> ids(2 * T, 3);
  for (int64_t end : {19, 63, 64}) ids[end] = 0;
  const DocumentLayout d = document_layout(from_vector(ids, {2, T}), 0);
  Tensor qkv = randn({2, T, 3 * C}, 4, 1, 1.0, DType::F64);
  const Tensor weights = randn({2, T, C}, 4, 2, 1.0, DType::F64);
  qkv.set_requires_grad(true);
  Tensor out = causal_attention(qkv, NH, d.starts);
  autograd::backward({sum(mul(out, weights))});
  const std::vector<double> packed_out = to_double_vector(out);
  const std::vector<double> packed_grad = to_double_vector(qkv.grad());
  struct Doc {
    int64_t row, start, length;
  };
  for (const Doc& doc :
       {Doc{0, 0, 20}, Doc{0, 20, 44}, Doc{0, 64, 1}, Doc{0, 65, 5}, Doc{1, 0, T}}) {
    Tensor part = contiguous(narrow(narrow(qkv.detach(), 0, doc.row, 1), 1, doc.start, doc.length));
    part.set_requires_grad(true);
    Tensor alone = causal_attention(part, NH);
    autograd::backward(
        {sum(mul(alone, narrow(narrow(weights, 0, doc.row, 1), 1, doc.start, doc.length)))});
    const std::vector<double> o = to_double_vector(alone), g = to_double_vector(part.grad());
    std::vector<double> want_o, want_g;
    for (int64_t t = doc.start; t < doc.start + doc.length; ++t) {
      const int64_t row = doc.row * T + t;
      want_o.insert(want_o.end(), packed_out.begin() + row * C, packed_out.begin() + (row + 1) * C);
      want_g.insert(want_g.end(), packed_grad.begin() + row * 3 * C,
                    packed_grad.begin() + (row + 1) * 3 * C);
    }
    const std::string where =
        "document at " + std::to_string(doc.row) + ":" + std::to_string(doc.start);
    expect_near_all(o, want_o, 1e-12, where + " output");
    expect_near_all(g, want_g, 1e-12, where + " dqkv");
  }
}

TEST(Documents, DocumentStartsAreChecked) {
  const Tensor qkv = randn({1, 4, 6}, 1, 1);
  // A first key past the query, and one before the previous query's.
  for (const auto& [starts, want] :
       {std::pair{std::vector<int64_t>{0, 0, 3, 3},
                  "doc_starts[0, 2] is 3; expected a first key "
                  "in [0, 2]"},
        std::pair{std::vector<int64_t>{0, 1, 0, 0},
                  "doc_starts[0, 2] is 0; expected a first key "
                  "in [1, 2]"},
        std::pair{std::vector<int64_t>{1, 1, 1, 1}, "doc_starts[0, 0] is 1; expected 0"}}) {
    try {
      causal_attention(qkv, 1, from_vector(starts, {1, 4}, DType::I32));
      FAIL() << "expected ValueError: " << want;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  // Any non-decreasing first keys up to each query (a sliding window's) pass.
  EXPECT_NO_THROW(
      causal_attention(qkv, 1, from_vector(std::vector<int64_t>{0, 0, 1, 2}, {1, 4}, DType::I32)));
  EXPECT_THROW(
      causal_attention(qkv, 1, from_vector(std::vector<int64_t>{0, 0, 0}, {1, 3}, DType::I32)),
      ShapeError);
  EXPECT_THROW(causal_attention(qkv, 1, from_vector(std::vector<int64_t>{0, 0, 0, 0}, {1, 4})),
               ShapeError);  // i64
}

GptConfig packed_config(bool mask, bool positions) {
  GptConfig c{.n_layer = 2, .n_head = 2, .d_model = 16, .vocab_size = 23, .seq_len = 16};
  c.eod_token = 0;
  c.reset_attention_mask = mask;
  c.reset_position_ids = positions;
  return c;
}

// Megatron-LM's two switches together make each document of a row exactly
// the sequence it would be alone: same logits, token for token; with
// learned positions and with rotary embeddings (which turn queries and keys
// by the positions within the document).
class PackedGpt : public ::testing::TestWithParam<PositionEmbedding> {};

TEST_P(PackedGpt, APackedRowEqualsItsDocumentsRunAlone) {
  // Documents [0, 5), [5, 12), [12, 16); the first two end with eod 0.
  const std::vector<int64_t> row = {4, 9, 2, 7, 0, 3, 3, 8, 1, 5, 6, 0, 2, 9, 4, 4};
  const Tensor ids = from_vector(row, {1, 16});
  struct Doc {
    int64_t start, length;
  };
  const std::vector<Doc> docs = {{0, 5}, {5, 7}, {12, 4}};
  auto alone_logits = [&](const Gpt& m, const Doc& doc) {
    return to_double_vector(m.forward(narrow(ids, 1, doc.start, doc.length)));
  };
  auto packed_slice = [&](const std::vector<double>& packed, const Doc& doc) {
    const int64_t V = 23;
    return std::vector<double>(packed.begin() + doc.start * V,
                               packed.begin() + (doc.start + doc.length) * V);
  };
  auto config = [&](bool mask, bool positions) {
    GptConfig c = packed_config(mask, positions);
    c.position_embedding = GetParam();
    c.rope_theta = 30.0;
    return c;
  };
  const Gpt both(config(true, true), 7);
  const std::vector<double> packed = to_double_vector(both.forward(ids));
  for (const Doc& doc : docs) {
    expect_near_all(packed_slice(packed, doc), alone_logits(both, doc), 1e-5,
                    "document at " + std::to_string(doc.start));
  }
  // Each switch alone changes something, and only the first document is
  // unaffected by either (its positions and its window are the same). But
  // rotary scores depend only on distances, so under them the mask alone
  // already makes each document its own sequence.
  const Gpt plain(config(false, false), 7), mask(config(true, false), 7),
      positions(config(false, true), 7);
  for (const Gpt* m : {&plain, &mask, &positions}) {
    const std::vector<double> l = to_double_vector(m->forward(ids));
    expect_near_all(packed_slice(l, docs[0]), alone_logits(*m, docs[0]), 1e-5, "first document");
    const std::vector<double> second = packed_slice(l, docs[1]), want = alone_logits(*m, docs[1]);
    if (m == &mask && GetParam() == PositionEmbedding::Rotary) {
      expect_near_all(second, want, 1e-5, "second document, rotary, mask alone");
      continue;
    }
    double diff = 0;
    for (size_t i = 0; i < second.size(); ++i) diff = std::max(diff, std::abs(second[i] - want[i]));
    EXPECT_GT(diff, 1e-3) << "a single switch should not isolate the second document";
  }
  // Training goes through the same path: the loss of the packed row is the
  // token-weighted mean of the documents' losses.
  const Tensor targets =
      from_vector(std::vector<int64_t>{9, 2, 7, 0, 3, 3, 8, 1, 5, 6, 0, 2, 9, 4, 4, 1}, {1, 16});
  double weighted = 0;
  for (const Doc& doc : docs) {
    weighted += item(both.loss(narrow(ids, 1, doc.start, doc.length),
                               narrow(targets, 1, doc.start, doc.length))) *
                static_cast<double>(doc.length);
  }
  EXPECT_NEAR(item(both.loss(ids, targets)), weighted / 16.0, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Documents, PackedGpt,
                         ::testing::Values(PositionEmbedding::Learned, PositionEmbedding::Rotary),
                         [](const auto& info) {
                           return std::string(position_embedding_string(info.param));
                         });

TEST(Documents, AConfigWithoutAnEndTokenIsRefused) {
  GptConfig c = packed_config(true, false);
  c.eod_token = -1;
  try {
    c.validate();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.eod_token (-1) must be a token id in [0, 23)"),
              std::string::npos)
        << e.what();
  }
  c.eod_token = 23;
  EXPECT_THROW(c.validate(), ConfigError);
  c.reset_attention_mask = false;
  EXPECT_NO_THROW(c.validate());  // an end token alone changes nothing
}

TEST(Documents, TheLossMaskDropsTheTokenAfterEachEnd) {
  const data::Batch b{from_vector(std::vector<int64_t>{3, 1, 4, 1, 5}, {1, 5}),
                      from_vector(std::vector<int64_t>{1, 4, 1, 5, 9}, {1, 5})};
  const data::Batch m = data::mask_loss_after_eod(b, 1);
  EXPECT_EQ(ints(m.targets), (std::vector<int64_t>{1, -100, 1, -100, 9}));
  EXPECT_EQ(ints(b.targets), (std::vector<int64_t>{1, 4, 1, 5, 9}));  // untouched
  EXPECT_EQ(ints(m.inputs), ints(b.inputs));
  EXPECT_THROW(data::mask_loss_after_eod({b.inputs, narrow(b.targets, 1, 0, 4)}, 1), ValueError);
}

}  // namespace
}  // namespace triad::nn
