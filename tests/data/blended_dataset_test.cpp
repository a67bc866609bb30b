#include "triad/data/blended_dataset.h"

#include <gtest/gtest.h>

#include <cmath>

#include "support/temp_dir.h"
#include "triad/data/token_shard.h"
#include "triad/ops.h"

namespace triad::data {
namespace {

using triad::testing::TempDir;

// A shard whose tokens are base, base + 1, ...: every token names its source.
std::string shard(const TempDir& dir, const std::string& name, uint16_t base, int n) {
  std::vector<uint16_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<uint16_t>(base + i));
  write_token_shard(dir.file(name), t);
  return dir.file(name);
}

TEST(BlendedDataset, OneComponentReadsAsTheDatasetAlone) {
  TempDir dir;
  const std::string a = shard(dir, "a.bin", 0, 401);
  for (bool shuffled : {false, true}) {
    TokenDataset alone({a}, 4, 1000);
    BlendedDataset blend({{{a}, 2.5, "a"}}, 4, 1000);
    if (shuffled) {
      alone.shuffle(9);
      blend.shuffle(9);
    }
    for (int64_t k = 0; k < 30; ++k) {  // past the end: wraps (and reshuffles)
      EXPECT_EQ(to_double_vector(blend.batch(k, 6, 0, 6).inputs),
                to_double_vector(alone.batch(k, 6, 0, 6).inputs))
          << "step " << k << (shuffled ? " shuffled" : "");
    }
  }
}

TEST(BlendedDataset, ComponentsAreDrawnAtTheirSharesEachReadInOrder) {
  TempDir dir;
  const std::vector<BlendedDataset::Component> parts{{{shard(dir, "a.bin", 0, 2001)}, 5, "a"},
                                                     {{shard(dir, "b.bin", 3000, 1001)}, 3, "b"},
                                                     {{shard(dir, "c.bin", 6000, 801)}, 2, "c"}};
  BlendedDataset blend(parts, 4, 10000);
  EXPECT_DOUBLE_EQ(blend.share(0), 0.5);
  EXPECT_DOUBLE_EQ(blend.share(1), 0.3);
  EXPECT_DOUBLE_EQ(blend.share(2), 0.2);
  std::vector<int64_t> taken(3, 0);
  const int64_t n = 3 * BlendedDataset::kPeriod + 100;
  for (int64_t g = 0; g < n; ++g) {
    const auto [c, i] = blend.locate(g);
    ASSERT_LT(c, 3u);
    EXPECT_EQ(i, taken[c]) << "component " << c << " is read front to back";
    ++taken[c];
    for (size_t d = 0; d < 3; ++d) {
      ASSERT_LE(std::abs(static_cast<double>(taken[d]) - blend.share(d) * (g + 1)), 1.0)
          << "after " << g + 1 << " sequences, component " << d;
    }
  }
  // Batches hold each component's own sequences, the same whatever the split.
  for (int64_t k = 0; k < 40; ++k) {
    Batch whole = blend.batch(k, 8, 0, 8);
    auto w = to_double_vector(whole.inputs);
    auto lo = to_double_vector(blend.batch(k, 8, 0, 5).inputs);
    auto hi = to_double_vector(blend.batch(k, 8, 5, 3).inputs);
    lo.insert(lo.end(), hi.begin(), hi.end());
    EXPECT_EQ(lo, w);
    for (int64_t j = 0; j < 8; ++j) {
      const auto [c, i] = blend.locate(k * 8 + j);
      const double base = c == 0 ? 0 : c == 1 ? 3000 : 6000;
      const int64_t q = i % blend.component(c).num_sequences();
      EXPECT_EQ(w[j * 4], base + 4 * q) << "step " << k << " sequence " << j;
    }
  }
}

TEST(BlendedDataset, WeightsThatCannotBeDrawnAreNamed) {
  TempDir dir;
  const std::string a = shard(dir, "a.bin", 0, 101), b = shard(dir, "b.bin", 0, 101);
  auto expect_error = [&](double wb, const std::string& fragment) {
    try {
      BlendedDataset blend({{{a}, 1.0, "a"}, {{b}, wb, "b"}}, 4, 1000);
      FAIL() << "expected ValueError with '" << fragment << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_error(0.0, "the weight of 'b' (0.000000) must be positive");
  expect_error(-1.0, "the weight of 'b' (-1.000000) must be positive");
  expect_error(1e-5, "the weight of 'b' (0.000010, a share of 0.000010) is too small");
  EXPECT_THROW(BlendedDataset({}, 4, 1000), ValueError);
  // A part whose data fails is named (one part alone keeps the message as
  // the dataset gives it).
  write_token_shard(dir.file("short.bin"), {1, 2, 3});
  try {
    BlendedDataset blend({{{a}, 1.0, "a"}, {{dir.file("short.bin")}, 1.0, "short"}}, 4, 1000);
    FAIL() << "a part of 3 tokens holds no sequence of 5";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("part 'short': token data has 3 tokens"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::data
