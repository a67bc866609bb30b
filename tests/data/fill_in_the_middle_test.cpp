// Fill-in-the-middle: every rearranged document is one of the two orders
// around its sentinels, holding its own tokens in order with three of its
// suffix's last ones dropped; documents keep their length and end tokens
// their places; the draws depend on the sequence alone; about `rate` of the
// documents change, about `spm_rate` of those suffix first; a masked target
// is refused.
#include "triad/data/fill_in_the_middle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad::data {
namespace {

constexpr int64_t kPre = 100, kMid = 101, kSuf = 102, kEod = 0;

std::vector<int64_t> ids(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : to_double_vector(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

FimOptions options(double rate, double spm_rate) {
  FimOptions o;
  o.rate = rate;
  o.spm_rate = spm_rate;
  o.prefix_token = kPre;
  o.middle_token = kMid;
  o.suffix_token = kSuf;
  o.eod_token = kEod;
  o.seed = 17;
  return o;
}

// Documents of tokens 1..len (distinct within each), ended by kEod.
std::vector<int64_t> documents(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> row;
  for (int64_t len : lengths) {
    for (int64_t t = 1; t <= len; ++t) row.push_back(t);
    row.push_back(kEod);
  }
  return row;
}

enum class Order { Same, Psm, Spm };

// How `got` rearranges the document `doc` (1..n): checked exactly.
Order order_of(const std::vector<int64_t>& got, int64_t n) {
  EXPECT_EQ(static_cast<int64_t>(got.size()), n);
  if (got.front() != kPre) {
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], i + 1);
    return Order::Same;
  }
  const auto at = [&](int64_t token) {
    return static_cast<int64_t>(std::find(got.begin(), got.end(), token) - got.begin());
  };
  const int64_t s = at(kSuf), m = at(kMid);
  EXPECT_LT(s, m);
  if (s == 1) {  // SPM: <pre> <suf> suffix <mid> prefix middle
    const std::vector<int64_t> suffix(got.begin() + 2, got.begin() + m),
        rest(got.begin() + m + 1, got.end());  // prefix + middle: 1..b
    const int64_t b = static_cast<int64_t>(rest.size());
    for (int64_t i = 0; i < b; ++i) EXPECT_EQ(rest[i], i + 1);
    for (size_t i = 0; i < suffix.size(); ++i)
      EXPECT_EQ(suffix[i], b + 1 + static_cast<int64_t>(i));
    EXPECT_EQ(b + static_cast<int64_t>(suffix.size()) + 3, n);  // three of the suffix dropped
    return Order::Spm;
  }
  // PSM: <pre> prefix <suf> suffix <mid> middle
  const std::vector<int64_t> prefix(got.begin() + 1, got.begin() + s),
      suffix(got.begin() + s + 1, got.begin() + m), middle(got.begin() + m + 1, got.end());
  const int64_t a = static_cast<int64_t>(prefix.size()),
                b = a + static_cast<int64_t>(middle.size());
  for (int64_t i = 0; i < a; ++i) EXPECT_EQ(prefix[i], i + 1);
  for (size_t i = 0; i < middle.size(); ++i) EXPECT_EQ(middle[i], a + 1 + static_cast<int64_t>(i));
  for (size_t i = 0; i < suffix.size(); ++i) EXPECT_EQ(suffix[i], b + 1 + static_cast<int64_t>(i));
  EXPECT_EQ(b + static_cast<int64_t>(suffix.size()) + 3, n);
  return Order::Psm;
}

TEST(FillInTheMiddle, DocumentsAreRearrangedInPlaceInEitherOrder) {
  const std::vector<int64_t> lengths{40, 3, 25, 60, 1, 33};
  int same = 0, psm = 0, spm = 0;
  for (int64_t sequence = 0; sequence < 200; ++sequence) {
    std::vector<int64_t> row = documents(lengths);
    const std::vector<int64_t> before = row;
    fill_in_the_middle(row.data(), static_cast<int64_t>(row.size()), sequence, options(0.6, 0.3));
    std::vector<int64_t> again = before;
    fill_in_the_middle(again.data(), static_cast<int64_t>(again.size()), sequence,
                       options(0.6, 0.3));
    ASSERT_EQ(row, again) << "the draws of sequence " << sequence << " changed";
    size_t at = 0;
    for (int64_t len : lengths) {
      const std::vector<int64_t> doc(row.begin() + at, row.begin() + at + len);
      ASSERT_EQ(row[at + len], kEod) << "an end token moved";
      const Order o = order_of(doc, len);
      if (HasFailure()) {
        FAIL() << "sequence " << sequence << ", document of " << len;
      }
      (o == Order::Same ? same : o == Order::Psm ? psm : spm)++;
      if (len <= 3) {
        EXPECT_EQ(o, Order::Same);  // no suffix to give up
      }
      at += len + 1;
    }
  }
  const int total = same + psm + spm;
  // About 0.6 of the documents whose suffix (both cuts uniform in [0, L])
  // is longer than 3 tokens, 0.3 of those SPM.
  double expected = 0;
  for (int64_t len : lengths) {
    const double fits = len > 3 ? static_cast<double>(len - 3) / static_cast<double>(len + 1) : 0;
    expected += 0.6 * fits * fits / static_cast<double>(lengths.size());
  }
  EXPECT_NEAR(static_cast<double>(psm + spm) / total, expected, 0.05);
  EXPECT_NEAR(static_cast<double>(spm) / (psm + spm), 0.3, 0.08);
  // Rate 0: nothing moves; another sequence: other draws.
  std::vector<int64_t> row = documents(lengths), other = documents(lengths);
  fill_in_the_middle(row.data(), static_cast<int64_t>(row.size()), 3, options(0.0, 0.5));
  EXPECT_EQ(row, documents(lengths));
  fill_in_the_middle(row.data(), static_cast<int64_t>(row.size()), 3, options(1.0, 0.5));
  fill_in_the_middle(other.data(), static_cast<int64_t>(other.size()), 4, options(1.0, 0.5));
  EXPECT_NE(row, other);
}

// A batch's rows are its inputs plus the last target: rearranged as the
// row would be, inputs and targets still one token apart; a masked target
// is named.
TEST(FillInTheMiddle, BatchesRearrangeEachRowAsItsSequence) {
  std::vector<int64_t> row = documents({30, 30});  // 62 tokens: T = 61
  const int64_t T = static_cast<int64_t>(row.size()) - 1;
  std::vector<int64_t> inputs, targets;
  for (int b = 0; b < 2; ++b) {
    inputs.insert(inputs.end(), row.begin(), row.end() - 1);
    targets.insert(targets.end(), row.begin() + 1, row.end());
  }
  Batch batch{from_vector(inputs, {2, T}), from_vector(targets, {2, T})};
  const Batch got = fill_in_the_middle(batch, 7, options(1.0, 0.5));
  const std::vector<int64_t> gi = ids(got.inputs), gt = ids(got.targets);
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<int64_t> want = row;
    fill_in_the_middle(want.data(), T + 1, 7 + b, options(1.0, 0.5));
    EXPECT_EQ(std::vector<int64_t>(gi.begin() + b * T, gi.begin() + (b + 1) * T),
              std::vector<int64_t>(want.begin(), want.end() - 1));
    EXPECT_EQ(std::vector<int64_t>(gt.begin() + b * T, gt.begin() + (b + 1) * T),
              std::vector<int64_t>(want.begin() + 1, want.end()));
  }
  EXPECT_NE(gi, inputs);
  targets[5] = -100;
  try {
    fill_in_the_middle(Batch{from_vector(inputs, {2, T}), from_vector(targets, {2, T})}, 7,
                       options(1.0, 0.5));
    FAIL() << "a masked target was rearranged";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 7 has a target without loss (-100) at 5"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::data
