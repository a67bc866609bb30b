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

}  // namespace triad::dist::detail
