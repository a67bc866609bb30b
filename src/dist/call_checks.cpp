#include "call_checks.h"

#include <algorithm>

namespace triad::dist::detail {

std::string describe_call(const ProcessGroup& group, const std::string& where,
                          const std::string& op, const Tensor& t, const std::string& peers) {
  std::string who;
  const auto& members = group.members();
  for (size_t i = 0; i < members.size(); ++i) who += (i ? ", " : "") + std::to_string(members[i]);
  return "process group '" + group.name() + "' (rank " + std::to_string(group.rank()) + " of " +
         std::to_string(group.size()) + where + "): " + op + " of " + dtype_name(t.dtype()) + " " +
         shape_str(t.shape()) + " with " + (peers.empty() ? "world ranks [" + who + "]" : peers);
}

std::array<int64_t, kHeaderWords> call_header(const char* op, const Tensor& t, int64_t extra) {
  uint64_t op_code = 0;  // (unsigned: a long name wraps instead of overflowing)
  for (const char* c = op; *c; ++c) op_code = op_code * 131 + static_cast<unsigned char>(*c);
  return {static_cast<int64_t>(op_code % 1000003), static_cast<int64_t>(t.dtype()), t.numel(),
          extra};
}

void check_call_headers(const ProcessGroup& group, const char* op,
                        const std::vector<int64_t>& all) {
  const int size = group.size();
  bool same = true;
  for (int r = 1; r < size; ++r) {
    same =
        same && std::equal(all.begin(), all.begin() + kHeaderWords, all.begin() + kHeaderWords * r);
  }
  if (same) return;
  std::string detail;
  for (int r = 0; r < size; ++r) {
    const int64_t* h = all.data() + kHeaderWords * r;
    detail += "\n  rank " + std::to_string(r) + " (world " + std::to_string(group.members()[r]) +
              "): op#" + std::to_string(h[0]) + " " + dtype_name(static_cast<DType>(h[1])) +
              " numel " + std::to_string(h[2]) + " (" + std::to_string(h[3]) + ")";
  }
  throw MismatchError("process group '" + group.name() + "': ranks disagree on " + op + ":" +
                      detail);
}

namespace {

void check_gather_dtypes(const ProcessGroup& group, const char* op, const Tensor& input,
                         const Tensor& output) {
  if (input.dtype() != output.dtype()) {
    throw ValueError(std::string(op) + " on '" + group.name() + "': input is " +
                     dtype_name(input.dtype()) + ", output " + dtype_name(output.dtype()));
  }
}

// Whether `piece` is `whole`'s elements [offset, offset + piece's count) in
// the same memory (an in-place collective). A piece that shares whole's
// memory anywhere else is a ValueError; strided views sharing memory are
// left to the groups that take them (which work on contiguous copies).
bool own_piece(const ProcessGroup& group, const char* op, const Tensor& whole, const Tensor& piece,
               int64_t offset, const char* piece_role, const char* whole_role) {
  if (whole.storage() != piece.storage() || piece.numel() == 0 || !whole.is_contiguous() ||
      !piece.is_contiguous())
    return false;
  const auto* w = static_cast<const char*>(whole.raw_data());
  const auto* p = static_cast<const char*>(piece.raw_data());
  const auto esize = static_cast<std::ptrdiff_t>(dtype_size(whole.dtype()));
  if (p == w + offset * esize) return true;
  if (p < w + static_cast<std::ptrdiff_t>(whole.nbytes()) &&
      w < p + static_cast<std::ptrdiff_t>(piece.nbytes())) {
    throw ValueError(std::string(op) + " on '" + group.name() + "': the " + piece_role +
                     " shares the " + whole_role + "'s memory but is not rank " +
                     std::to_string(group.rank()) + "'s piece of it (in place, the " + piece_role +
                     " must be exactly " + whole_role + " elements [" + std::to_string(offset) +
                     ", " + std::to_string(offset + piece.numel()) + "))");
  }
  return false;
}

}  // namespace

bool check_all_gather(const ProcessGroup& group, const Tensor& input, const Tensor& output) {
  check_gather_dtypes(group, "all_gather", input, output);
  if (output.numel() != input.numel() * group.size()) {
    throw ShapeError("all_gather on '" + group.name() + "': the output " +
                     shape_str(output.shape()) + " holds " + std::to_string(output.numel()) +
                     " elements, expected " + std::to_string(group.size()) + " ranks x input " +
                     shape_str(input.shape()) + " = " +
                     std::to_string(input.numel() * group.size()) +
                     " (pieces of different sizes go through all_gather_uneven)");
  }
  return own_piece(group, "all_gather", output, input, group.rank() * input.numel(), "input",
                   "output");
}

bool reduce_scatter_in_place(const ProcessGroup& group, const Tensor& input, const Tensor& output,
                             int64_t offset) {
  return own_piece(group, "reduce_scatter", input, output, offset, "output", "input");
}

void check_all_gather_uneven(const ProcessGroup& group, const Tensor& input, const Tensor& output,
                             const std::vector<int64_t>& counts) {
  check_gather_dtypes(group, "all_gather_uneven", input, output);
  const std::string where = "all_gather_uneven on '" + group.name() + "': ";
  if (static_cast<int>(counts.size()) != group.size()) {
    throw ValueError(where + std::to_string(counts.size()) + " counts for a group of " +
                     std::to_string(group.size()) + " ranks");
  }
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0) {
      throw ValueError(where + "count " + std::to_string(counts[r]) + " for rank " +
                       std::to_string(r) + " is negative");
    }
    total += counts[r];
  }
  if (counts[static_cast<size_t>(group.rank())] != input.numel()) {
    throw ShapeError(where + "rank " + std::to_string(group.rank()) + "'s count is " +
                     std::to_string(counts[static_cast<size_t>(group.rank())]) + " but its input " +
                     shape_str(input.shape()) + " holds " + std::to_string(input.numel()) +
                     " elements");
  }
  if (total != output.numel()) {
    throw ShapeError(where + "the counts add up to " + std::to_string(total) +
                     " elements but the output " + shape_str(output.shape()) + " holds " +
                     std::to_string(output.numel()));
  }
}

int64_t counts_digest(const std::vector<int64_t>& counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the counts
  for (int64_t c : counts) {
    h ^= static_cast<uint64_t>(c);
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

}  // namespace triad::dist::detail
