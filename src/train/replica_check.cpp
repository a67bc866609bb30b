#include "triad/train/replica_check.h"

#include <cstdio>
#include <map>

#include "triad/core/checksum.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"

namespace triad::train {
namespace {

std::string hex(uint64_t v) {
  char text[19];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

}  // namespace

std::vector<uint64_t> tensor_checksums(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<uint64_t> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor host = contiguous(to_device(t.detach(), Device::cpu()));
    out.push_back(words64_checksum(host.raw_data(), host.nbytes()));
  }
  return out;
}

std::vector<std::string> differing_replicas(const std::vector<ReplicaSet>& sets) {
  std::vector<std::string> found;
  for (const ReplicaSet& set : sets) {
    if (!set.group || set.group->size() < 2 || set.tensors.empty()) continue;
    const std::vector<uint64_t> mine = tensor_checksums(set.tensors);
    const auto k = static_cast<int64_t>(mine.size());
    const int n = set.group->size();
    // (int64 carries the 64 bits unchanged: the gather moves bytes.)
    Tensor local = from_vector(std::vector<int64_t>(mine.begin(), mine.end()), {k}, DType::I64);
    Tensor all = empty({k * n}, DType::I64);
    set.group->all_gather(local, all)->wait();
    const auto* gathered = all.data<int64_t>();
    for (int64_t j = 0; j < k; ++j) {
      std::map<uint64_t, std::vector<int>> holders;  // checksum -> world ranks
      for (int r = 0; r < n; ++r)
        holders[static_cast<uint64_t>(gathered[r * k + j])].push_back(set.group->members()[r]);
      if (holders.size() == 1) continue;
      std::string line =
          set.tensors[static_cast<size_t>(j)].first + " (" + set.kind + " replicas):";
      bool first = true;
      for (const auto& [sum, ranks] : holders) {
        line += first ? " " : ", ";
        first = false;
        line += ranks.size() == 1 ? "rank " : "ranks ";
        for (size_t i = 0; i < ranks.size(); ++i) {
          if (i > 0) line += ' ';
          line += std::to_string(ranks[i]);
        }
        line += ranks.size() == 1 ? " holds " : " hold ";
        line += hex(sum);
      }
      found.push_back(line);
    }
  }
  return found;
}

}  // namespace triad::train
