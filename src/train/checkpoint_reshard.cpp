#include "triad/train/checkpoint_reshard.h"

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <tuple>

#include "triad/autograd/grad_mode.h"
#include "triad/ops.h"

namespace triad::train {
namespace {

// The optimizer-state kinds of a rank file: per-parameter tensors without
// ZeRO-1 ("adam_m/<name>"), flat pieces with it ("zero/m").
struct Kind {
  const char* full;  // key prefix in FullState
  const char* zero;  // the flat tensor of a ZeRO-1 rank file
};
constexpr Kind kStateKinds[] = {
    {"adam_m/", "zero/m"}, {"adam_v/", "zero/v"}, {"master/", "zero/master"}};

}  // namespace

std::string placement_to_json(const RankPlacement& p) {
  nlohmann::json j;
  j["tp_rank"] = p.tp_rank;
  j["tp_size"] = p.tp_size;
  j["pp_rank"] = p.pp_rank;
  j["dp_rank"] = p.dp_rank;
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [name, q] : p.params) {
    params[name] = {{"split", q.spec.split},
                    {"dim", q.spec.dim},
                    {"groups", q.spec.groups},
                    {"padded", q.spec.padded},
                    {"shape", q.full_shape}};
    if (!q.spec.blocks.empty()) params[name]["blocks"] = q.spec.blocks;
  }
  j["params"] = params;
  nlohmann::json segs = nlohmann::json::array();
  for (const auto& s : p.zero_segments) segs.push_back({s.name, s.param_offset, s.length});
  j["zero_segments"] = segs;
  return j.dump();
}

RankPlacement placement_from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    RankPlacement p;
    p.tp_rank = j.at("tp_rank").get<int>();
    p.tp_size = j.at("tp_size").get<int>();
    p.pp_rank = j.at("pp_rank").get<int>();
    p.dp_rank = j.at("dp_rank").get<int>();
    if (p.tp_size < 1 || p.tp_rank < 0 || p.tp_rank >= p.tp_size) {
      throw ValueError("tp rank " + std::to_string(p.tp_rank) + " of " + std::to_string(p.tp_size));
    }
    for (const auto& [name, q] : j.at("params").items()) {
      RankPlacement::Param param;
      param.spec.split = q.at("split").get<bool>();
      param.spec.dim = q.at("dim").get<int64_t>();
      param.spec.groups = q.at("groups").get<int>();
      param.spec.padded = q.at("padded").get<int64_t>();
      param.full_shape = q.at("shape").get<Shape>();
      if (q.contains("blocks")) param.spec.blocks = q.at("blocks").get<std::vector<int64_t>>();
      const int64_t rank = static_cast<int64_t>(param.full_shape.size());
      int64_t block_sum = 0;
      for (int64_t b : param.spec.blocks) block_sum += b > 0 ? b : -1;
      const bool blocks_fit = param.spec.blocks.empty() ||
                              (static_cast<int>(param.spec.blocks.size()) == param.spec.groups &&
                               param.spec.split && param.spec.dim >= 0 && param.spec.dim < rank &&
                               block_sum == param.full_shape[param.spec.dim]);
      if (param.spec.groups < 1 || !blocks_fit ||
          (param.spec.split && (param.spec.dim < 0 || param.spec.dim >= rank))) {
        throw ValueError("parameter '" + name + "': split dim " + std::to_string(param.spec.dim) +
                         " in groups of " + std::to_string(param.spec.groups) +
                         " does not fit its shape " + shape_str(param.full_shape));
      }
      p.params.emplace(name, std::move(param));
    }
    for (const auto& s : j.at("zero_segments")) {
      p.zero_segments.push_back(
          {s.at(0).get<std::string>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>()});
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("not a valid placement: ") + e.what());
  }
}

FullState gather_full_state(const io::CheckpointInfo& info, const std::set<std::string>& names) {
  autograd::NoGradGuard no_grad;
  const std::string where = "checkpoint '" + info.step_dir + "'";
  FullState out;
  std::map<std::string, RankPlacement::Param> placement;  // of each wanted name
  int tp_size = 0;
  // Shards by key and tensor-parallel rank (the first replica seen wins:
  // data-parallel replicas and the tied embedding's two holders agree).
  std::map<std::string, std::map<int, Tensor>> shards;
  // ZeRO-1 pieces land in a shard-shaped buffer per (key, tp rank, pp rank),
  // complete once every element has arrived from the data-parallel ranks.
  struct Pieces {
    Tensor flat;
    int64_t filled = 0;
  };
  std::map<std::tuple<std::string, int, int>, Pieces> pieces;
  for (const auto& [rank, checksum] : info.checksums) {
    (void)checksum;
    // The header first: a file is read (its checksum verified, the tensors
    // wanted copied out) only for what no file before it gave: data-parallel
    // replicas of a shard, and every tensor of other names, stay on disk.
    const io::RankHeader header = io::read_rank_header(info, rank);
    if (rank == 0) out.metadata = header.metadata;
    auto it = header.metadata.find("placement");
    if (it == header.metadata.end()) {
      throw IoError(where +
                    " records no parameter placement (it predates layout-free resume): resume it "
                    "with the layout it was written with");
    }
    RankPlacement pl;
    try {
      pl = placement_from_json(it->second);
    } catch (const ValueError& e) {
      throw IoError(where + ", rank " + std::to_string(rank) + ": " + e.what());
    }
    if (tp_size != 0 && pl.tp_size != tp_size) {
      throw IoError(where + ": rank " + std::to_string(rank) + " has tp " +
                    std::to_string(pl.tp_size) + ", others " + std::to_string(tp_size));
    }
    tp_size = pl.tp_size;
    std::set<std::string> wanted;
    for (const auto& [name, param] : pl.params) {
      if (!names.count(name)) continue;
      placement.emplace(name, param);
      for (const std::string kind : {"param/", "adam_m/", "adam_v/", "master/"}) {
        auto s = shards.find(kind + name);
        if (header.shapes.count(kind + name) && (s == shards.end() || !s->second.count(pl.tp_rank)))
          wanted.insert(kind + name);
      }
    }
    for (const auto& seg : pl.zero_segments) {
      if (!names.count(seg.name)) continue;
      for (const Kind& kind : kStateKinds) {
        if (header.shapes.count(kind.zero)) wanted.insert(kind.zero);
      }
    }
    if (wanted.empty()) continue;
    const io::RankState st = io::read_rank_state(
        info, rank, [&](const std::string& key) { return wanted.count(key) > 0; });
    auto tensor = [&](const std::string& key) -> const Tensor* {
      auto t = st.tensors.find(key);
      return t == st.tensors.end() ? nullptr : &t->second;
    };
    for (const auto& [name, param] : pl.params) {
      if (!names.count(name)) continue;
      placement.emplace(name, param);
      const Shape shard_shape = param.spec.shard_shape(param.full_shape, pl.tp_size);
      for (const std::string kind : {"param/", "adam_m/", "adam_v/", "master/"}) {
        const Tensor* t = tensor(kind + name);
        if (!t) continue;
        if (t->shape() != shard_shape) {
          throw IoError(where + ", rank " + std::to_string(rank) + ": '" + kind + name + "' is " +
                        shape_str(t->shape()) + ", its placement says " + shape_str(shard_shape));
        }
        shards[kind + name].emplace(pl.tp_rank, *t);
      }
    }
    int64_t at = 0;
    for (const auto& seg : pl.zero_segments) {
      auto p = pl.params.find(seg.name);
      if (p == pl.params.end()) {
        throw IoError(where + ", rank " + std::to_string(rank) + ": ZeRO-1 piece of '" + seg.name +
                      "', a parameter the rank does not hold");
      }
      const Shape shard_shape = p->second.spec.shard_shape(p->second.full_shape, pl.tp_size);
      const int64_t numel = triad::numel(shard_shape);
      if (seg.param_offset < 0 || seg.length < 0 || seg.param_offset + seg.length > numel) {
        throw IoError(where + ", rank " + std::to_string(rank) + ": ZeRO-1 piece [" +
                      std::to_string(seg.param_offset) + ", +" + std::to_string(seg.length) +
                      ") lies outside '" + seg.name + "' (" + std::to_string(numel) + " elements)");
      }
      if (names.count(seg.name)) {
        for (const Kind& kind : kStateKinds) {
          const Tensor* flat = tensor(kind.zero);
          if (!flat) continue;
          if (at + seg.length > flat->numel()) {
            throw IoError(where + ", rank " + std::to_string(rank) + ": '" + kind.zero +
                          "' holds " + std::to_string(flat->numel()) +
                          " elements, fewer than its pieces add up to");
          }
          Pieces& buf = pieces[{kind.full + seg.name, pl.tp_rank, pl.pp_rank}];
          if (!buf.flat.defined()) buf.flat = zeros({numel}, flat->dtype());
          Tensor dst = narrow(buf.flat, 0, seg.param_offset, seg.length);
          copy_(dst, narrow(*flat, 0, at, seg.length));
          buf.filled += seg.length;
        }
      }
      at += seg.length;
    }
  }
  for (auto& [key, buf] : pieces) {
    const auto& [name_key, tp_rank, pp_rank] = key;
    (void)pp_rank;
    const std::string name = name_key.substr(name_key.find('/') + 1);
    const auto& param = placement.at(name);
    if (buf.filled == buf.flat.numel()) {
      shards[name_key].emplace(
          tp_rank, reshape(buf.flat, param.spec.shard_shape(param.full_shape, tp_size)).detach());
    }
  }
  for (const std::string& name : names) {
    auto p = placement.find(name);
    if (p == placement.end()) throw IoError(where + " holds no parameter '" + name + "'");
    for (const std::string kind : {"param/", "adam_m/", "adam_v/", "master/"}) {
      auto s = shards.find(kind + name);
      if (s == shards.end()) continue;
      std::vector<Tensor> ordered;
      for (int r = 0; r < tp_size; ++r) {
        auto t = s->second.find(r);
        if (t == s->second.end()) {
          throw IoError(where + " lacks tensor-parallel rank " + std::to_string(r) +
                        "'s shard of '" + kind + name + "'");
        }
        ordered.push_back(t->second);
      }
      out.tensors[kind + name] = p->second.spec.assemble(ordered, p->second.full_shape);
    }
  }
  return out;
}

}  // namespace triad::train
