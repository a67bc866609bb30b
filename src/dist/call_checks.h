#pragma once

// What every process-group backend says about its calls: the description
// that errors and timeouts carry, and validate mode's header comparison.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "triad/dist/process_group.h"

namespace triad::dist::detail {

// "process group 'tp' (rank 1 of 2<where>): all_reduce of f32 [8, 4] with
// world ranks [2, 3]" (or with `peers` when given).
std::string describe_call(const ProcessGroup& group, const std::string& where,
                          const std::string& op, const Tensor& t, const std::string& peers);

// Validate mode: the header a rank contributes for a call (op, dtype,
// element count, an op-specific extra such as the reduce op or the root).
constexpr int kHeaderWords = 4;
std::array<int64_t, kHeaderWords> call_header(const char* op, const Tensor& t, int64_t extra);
// Compares every rank's header (all, rank-major) and throws MismatchError
// listing them when they disagree.
void check_call_headers(const ProcessGroup& group, const char* op, const std::vector<int64_t>& all);

// The local checks of all_gather (equal pieces: output holds size() times
// input) and all_gather_uneven (counts: one element count per rank, this
// rank's equal to input's, output holding their sum): same dtype, sizes as
// described, or an error naming them. Neither needs the other ranks.
// check_all_gather returns true when the gather is in place: input is
// output's own piece (this rank's, the same memory); an input sharing
// output's memory anywhere else is a ValueError.
bool check_all_gather(const ProcessGroup& group, const Tensor& input, const Tensor& output);
void check_all_gather_uneven(const ProcessGroup& group, const Tensor& input, const Tensor& output,
                             const std::vector<int64_t>& counts);
// Whether a reduce_scatter is in place: output is input's own piece, its
// elements from `offset` (this rank's rows), in the same memory. An output
// sharing input's memory anywhere else is a ValueError naming the piece
// expected.
bool reduce_scatter_in_place(const ProcessGroup& group, const Tensor& input, const Tensor& output,
                             int64_t offset);
// Validate mode's extra header word for all_gather_uneven: a digest of the
// counts, so that ranks passing different counts disagree.
int64_t counts_digest(const std::vector<int64_t>& counts);

}  // namespace triad::dist::detail
