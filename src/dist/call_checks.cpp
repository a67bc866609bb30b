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
  int64_t op_code = 0;
  for (const char* c = op; *c; ++c) op_code = op_code * 131 + *c;
  return {op_code % 1000003, static_cast<int64_t>(t.dtype()), t.numel(), extra};
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

}  // namespace triad::dist::detail
