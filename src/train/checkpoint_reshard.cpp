#include "triad/train/checkpoint_reshard.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "triad/autograd/grad_mode.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/json_integer.h"
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
// Every per-parameter kind a rank file may hold (Muon's momentum has no
// ZeRO-1 form; train.ema_decay's averages are whole on every rank).
const char* const kKinds[] = {"param/", "adam_m/", "adam_v/", "master/", "muon_momentum/", "ema/"};

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
    if (!q.spec.units.empty()) params[name]["units"] = q.spec.units;
  }
  j["params"] = params;
  nlohmann::json segs = nlohmann::json::array();
  for (const auto& s : p.zero_segments) {
    // (A fourth entry for Muon's pieces only: earlier placements read the same.)
    segs.push_back(s.muon ? nlohmann::json{s.name, s.param_offset, s.length, true}
                          : nlohmann::json{s.name, s.param_offset, s.length});
  }
  j["zero_segments"] = segs;
  return j.dump();
}

RankPlacement placement_from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    RankPlacement p;
    auto rank = [&](const char* key) {  // (ranks and sizes an int holds)
      const int64_t v = io::json_int(j.at(key), key);
      if (v < 0 || v > INT32_MAX) throw ValueError(std::string(key) + " " + std::to_string(v));
      return static_cast<int>(v);
    };
    p.tp_rank = rank("tp_rank");
    p.tp_size = rank("tp_size");
    p.pp_rank = rank("pp_rank");
    p.dp_rank = rank("dp_rank");
    if (p.tp_size < 1 || p.tp_rank < 0 || p.tp_rank >= p.tp_size) {
      throw ValueError("tp rank " + std::to_string(p.tp_rank) + " of " + std::to_string(p.tp_size));
    }
    for (const auto& [name, q] : j.at("params").items()) {
      RankPlacement::Param param;
      param.spec.split = q.at("split").get<bool>();
      const std::string at = "parameter '" + name + "': ";
      param.spec.dim = io::json_int(q.at("dim"), at + "dim");
      const int64_t groups = io::json_int(q.at("groups"), at + "groups");
      param.spec.groups = static_cast<int>(std::clamp<int64_t>(groups, -1, INT32_MAX));
      param.spec.padded = io::json_int(q.at("padded"), at + "padded");
      param.full_shape = io::json_ints(q.at("shape"), at + "shape");
      for (int64_t d : param.full_shape)
        if (d < 0) throw ValueError(at + "shape " + shape_str(param.full_shape));
      if (q.contains("blocks")) param.spec.blocks = io::json_ints(q.at("blocks"), at + "blocks");
      if (q.contains("units")) param.spec.units = io::json_ints(q.at("units"), at + "units");
      const int64_t rank = static_cast<int64_t>(param.full_shape.size());
      int64_t block_sum = 0;
      bool sum_fits = true;  // (no block is empty, and the sum counts)
      for (int64_t b : param.spec.blocks)
        sum_fits = sum_fits && b > 0 && !__builtin_add_overflow(block_sum, b, &block_sum);
      const bool blocks_fit =
          param.spec.blocks.empty() ||
          (sum_fits && (static_cast<int>(param.spec.blocks.size()) == param.spec.groups &&
                        param.spec.split && param.spec.dim >= 0 && param.spec.dim < rank &&
                        block_sum == param.full_shape[param.spec.dim]));
      if (param.spec.groups < 1 || !blocks_fit ||
          (param.spec.split && (param.spec.dim < 0 || param.spec.dim >= rank))) {
        throw ValueError("parameter '" + name + "': split dim " + std::to_string(param.spec.dim) +
                         " in groups of " + std::to_string(param.spec.groups) +
                         " does not fit its shape " + shape_str(param.full_shape));
      }
      if (param.spec.split) {
        try {
          param.spec.check_cut(
              param.spec.padded ? param.spec.padded : param.full_shape[param.spec.dim], p.tp_size,
              param.full_shape);
        } catch (const ShapeError& e) {
          throw ValueError("parameter '" + name + "': " + e.what());
        }
      }
      p.params.emplace(name, std::move(param));
    }
    for (const auto& s : j.at("zero_segments")) {
      p.zero_segments.push_back({s.at(0).get<std::string>(),
                                 io::json_int(s.at(1), "an optimizer piece's offset"),
                                 io::json_int(s.at(2), "an optimizer piece's length"),
                                 s.size() > 3 && s.at(3).get<bool>()});
      const auto& z = p.zero_segments.back();
      int64_t end = 0;
      if (z.param_offset < 0 || z.length < 0 ||
          __builtin_add_overflow(z.param_offset, z.length, &end)) {
        throw ValueError("the optimizer piece of '" + z.name + "' at " +
                         std::to_string(z.param_offset) + ", +" + std::to_string(z.length) +
                         " is no range of elements");
      }
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("not a valid placement: ") + e.what());
  }
}

namespace {

// The placement a rank file's header records; errors name the checkpoint
// (`where`) and the rank.
RankPlacement placement_in(const io::RankHeader& header, const std::string& where, int rank) {
  auto it = header.metadata.find("placement");
  if (it == header.metadata.end()) {
    throw IoError(where +
                  " records no parameter placement (it predates layout-free resume): resume it "
                  "with the layout it was written with");
  }
  try {
    return placement_from_json(it->second);
  } catch (const ValueError& e) {
    throw IoError(where + ", rank " + std::to_string(rank) + ": " + e.what());
  }
}

}  // namespace

void for_each_full_state(
    const io::CheckpointInfo& info, const std::set<std::string>& names,
    const std::function<void(const std::string& name, std::map<std::string, Tensor>& full)>& take,
    std::map<std::string, std::string>* metadata) {
  for_each_full_state(info, std::vector<std::string>(names.begin(), names.end()), take,
                      {.metadata = metadata});
}

void for_each_full_state(
    const io::CheckpointInfo& info, const std::vector<std::string>& order,
    const std::function<void(const std::string& name, std::map<std::string, Tensor>& full)>& take,
    const FullStateOptions& options) {
  autograd::NoGradGuard no_grad;
  const std::string where = "checkpoint '" + info.step_dir + "'";
  const std::set<std::string> names(order.begin(), order.end());
  if (names.size() != order.size())
    throw ValueError("for_each_full_state: a parameter is named twice");
  auto wanted = [&](const std::string& kind) {
    return options.kinds.empty() || options.kinds.count(kind) > 0;
  };
  std::map<std::string, std::string>* metadata = options.metadata;
  std::map<std::string, RankPlacement::Param> placement;  // of each wanted name
  int tp_size = 0;
  // Where each shard (key "param/<name>" ..., tensor-parallel rank) comes
  // from, learnt from the files' headers alone: a tensor of one file (of
  // the first pipeline stage seen to hold it, as the tied embedding's two
  // holders agree; among that stage's data-parallel replicas, which all
  // agree, the one `options.replica` picks, so that resuming ranks spread
  // their reads over the replicas' files) ...
  struct Holder {
    int rank, pp_rank;
  };
  std::map<std::string, std::map<int, std::vector<Holder>>> direct;  // key -> tp rank -> files
  // ... or ZeRO-1 pieces of the flat tensors of the data-parallel ranks,
  // per (key, tp rank, pp rank), usable once they cover the shard.
  struct Piece {
    int rank;
    const char* flat;
    int64_t at, param_offset, length;
  };
  struct Pieces {
    std::vector<Piece> list;
    int64_t filled = 0;
  };
  std::map<std::tuple<std::string, int, int>, Pieces> pieces;
  for (const auto& [rank, checksum] : info.checksums) {
    (void)checksum;
    io::RankHeader read;
    const io::RankHeader* given = &read;
    if (options.headers) {
      auto g = options.headers->find(rank);
      if (g == options.headers->end()) {
        throw IoError(where + ": no header was given for rank " + std::to_string(rank));
      }
      given = &g->second;
    } else {
      read = io::read_rank_header(info, rank);
    }
    const io::RankHeader& header = *given;
    if (rank == 0 && metadata) *metadata = header.metadata;
    const RankPlacement pl = placement_in(header, where, rank);
    if (tp_size != 0 && pl.tp_size != tp_size) {
      throw IoError(where + ": rank " + std::to_string(rank) + " has tp " +
                    std::to_string(pl.tp_size) + ", others " + std::to_string(tp_size));
    }
    tp_size = pl.tp_size;
    for (const auto& [name, param] : pl.params) {
      if (!names.count(name)) continue;
      placement.emplace(name, param);
      const Shape shard_shape = param.spec.shard_shape(param.full_shape, pl.tp_size);
      for (const std::string kind : kKinds) {
        if (!wanted(kind)) continue;
        auto shape = header.shapes.find(kind + name);
        if (shape == header.shapes.end()) continue;
        if (shape->second != shard_shape) {
          throw IoError(where + ", rank " + std::to_string(rank) + ": '" + kind + name + "' is " +
                        shape_str(shape->second) + ", its placement says " +
                        shape_str(shard_shape));
        }
        direct[kind + name][pl.tp_rank].push_back({rank, pl.pp_rank});
      }
    }
    int64_t at = 0, at_v = 0;  // (zero/v holds AdamW's pieces alone)
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
          const bool second = std::string(kind.zero) == "zero/v";
          if (seg.muon && second) continue;  // (Muon keeps one moment)
          // A Muon matrix's zero/m piece is its momentum.
          const std::string full =
              seg.muon && std::string(kind.zero) == "zero/m" ? "muon_momentum/" : kind.full;
          if (!wanted(full)) continue;
          auto flat = header.shapes.find(kind.zero);
          if (flat == header.shapes.end()) continue;
          const int64_t where_at = second ? at_v : at;
          if (where_at + seg.length > triad::numel(flat->second)) {
            throw IoError(where + ", rank " + std::to_string(rank) + ": '" + kind.zero +
                          "' holds " + std::to_string(triad::numel(flat->second)) +
                          " elements, fewer than its pieces add up to");
          }
          Pieces& buf = pieces[{full + seg.name, pl.tp_rank, pl.pp_rank}];
          buf.list.push_back({rank, kind.zero, where_at, seg.param_offset, seg.length});
          buf.filled += seg.length;
        }
      }
      at += seg.length;
      if (!seg.muon) at_v += seg.length;
    }
  }
  // Each shard's source, every name's checked before any file is read.
  struct Source {
    int rank = -1;                   // a tensor of this file, or
    const Pieces* pieces = nullptr;  // these pieces
  };
  std::map<std::string, std::vector<Source>> sources;  // key -> per tp rank
  std::set<int> needed;
  for (const std::string& name : order) {
    auto p = placement.find(name);
    if (p == placement.end()) throw IoError(where + " holds no parameter '" + name + "'");
    const int64_t numel = triad::numel(p->second.spec.shard_shape(p->second.full_shape, tp_size));
    for (const std::string kind : kKinds) {
      if (!wanted(kind)) continue;
      const std::string key = kind + name;
      std::vector<Source> per_rank(static_cast<size_t>(tp_size));
      int found = 0;
      for (int r = 0; r < tp_size; ++r) {
        Source& src = per_rank[static_cast<size_t>(r)];
        if (auto d = direct.find(key); d != direct.end() && d->second.count(r)) {
          std::vector<int> replicas;  // the first holder's stage
          for (const Holder& h : d->second.at(r)) {
            if (h.pp_rank == d->second.at(r).front().pp_rank) replicas.push_back(h.rank);
          }
          src.rank = replicas[static_cast<size_t>(options.replica) % replicas.size()];
          needed.insert(src.rank);
        } else {
          // The first pipeline holder whose pieces cover the shard.
          for (auto k = pieces.lower_bound({key, r, std::numeric_limits<int>::min()});
               k != pieces.end() && std::get<0>(k->first) == key && std::get<1>(k->first) == r;
               ++k) {
            if (k->second.filled != numel) continue;
            src.pieces = &k->second;
            for (const Piece& piece : k->second.list) needed.insert(piece.rank);
            break;
          }
        }
        found += src.rank >= 0 || src.pieces;
      }
      if (found == 0) continue;  // a kind this checkpoint does not hold
      for (int r = 0; r < tp_size; ++r) {
        const Source& src = per_rank[static_cast<size_t>(r)];
        if (src.rank < 0 && !src.pieces) {
          throw IoError(where + " lacks tensor-parallel rank " + std::to_string(r) +
                        "'s shard of '" + key + "'");
        }
      }
      sources[key] = std::move(per_rank);
    }
  }
  // The files that give something, each verified against its checksum once;
  // data-parallel replicas and other stages' files stay on disk.
  std::map<int, io::RankFile> files;
  for (int rank : needed) files.emplace(rank, io::RankFile(info, rank, options.verify));
  // One parameter's full state at a time.
  for (const std::string& name : order) {
    const RankPlacement::Param& param = placement.at(name);
    const Shape shard_shape = param.spec.shard_shape(param.full_shape, tp_size);
    const int64_t numel = triad::numel(shard_shape);
    std::map<std::string, Tensor> full;
    for (const std::string kind : kKinds) {
      auto s = sources.find(kind + name);
      if (s == sources.end()) continue;
      std::vector<Tensor> ordered;
      for (const Source& src : s->second) {
        Tensor flat;
        if (src.rank >= 0) {
          flat = files.at(src.rank).file().read_elements(kind + name, 0, numel);
        } else {
          for (const Piece& piece : src.pieces->list) {
            const Tensor part =
                files.at(piece.rank).file().read_elements(piece.flat, piece.at, piece.length);
            if (!flat.defined()) flat = zeros({numel}, part.dtype());
            Tensor dst = narrow(flat, 0, piece.param_offset, piece.length);
            copy_(dst, part);
          }
        }
        ordered.push_back(reshape(flat, shard_shape).detach());
      }
      full[kind + name] = param.spec.assemble(ordered, param.full_shape);
    }
    take(name, full);
  }
}

std::map<int, io::RankHeader> read_rank_headers(const io::CheckpointInfo& info) {
  std::map<int, io::RankHeader> out;
  for (const auto& [rank, checksum] : info.checksums) out[rank] = io::read_rank_header(info, rank);
  return out;
}

std::string rank_headers_to_json(const std::map<int, io::RankHeader>& headers) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [rank, h] : headers) {
    j[std::to_string(rank)] = {{"metadata", h.metadata}, {"shapes", h.shapes}};
  }
  return j.dump();
}

std::map<int, io::RankHeader> rank_headers_from_json(const std::string& text) {
  try {
    std::map<int, io::RankHeader> out;
    const nlohmann::json all = nlohmann::json::parse(text);
    if (!all.is_object()) throw IoError("checkpoint headers: not a JSON object");
    for (const auto& [rank, h] : all.items()) {
      io::RankHeader header;
      header.metadata = h.at("metadata").get<std::map<std::string, std::string>>();
      header.shapes = h.at("shapes").get<std::map<std::string, Shape>>();
      out[std::stoi(rank)] = std::move(header);
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    throw IoError(std::string("checkpoint headers: not a valid list: ") + e.what());
  } catch (const std::logic_error& e) {  // std::stoi
    throw IoError(std::string("checkpoint headers: a rank that is not a number: ") + e.what());
  }
}

void read_checkpoint_weights(const io::CheckpointInfo& info, const nn::GptConfig& model,
                             const std::function<void(nn::StateDict&&)>& consume,
                             const CheckpointWeightsOptions& options) {
  const std::set<int64_t>* blocks = options.blocks;
  const std::map<int, io::RankHeader>* headers = options.headers;
  const std::string where = "checkpoint '" + info.step_dir + "'";
  const std::map<std::string, Shape> expected = nn::gpt_parameter_shapes(model);
  std::map<int, io::RankHeader> read;
  if (!headers) {
    read = read_rank_headers(info);
    headers = &read;
  }
  // The checkpoint's parameters and full shapes, from the headers alone.
  std::map<std::string, Shape> held;
  for (const auto& [rank, checksum] : info.checksums) {
    (void)checksum;
    auto h = headers->find(rank);
    if (h == headers->end()) {
      throw IoError(where + ": no header was given for rank " + std::to_string(rank));
    }
    for (const auto& [name, param] : placement_in(h->second, where, rank).params)
      held.emplace(name, param.full_shape);
  }
  if (options.ema) {
    bool averaged = false;
    for (const auto& [rank, header] : *headers) {
      for (const auto& [key, shape] : header.shapes)
        averaged = averaged || key.rfind("ema/", 0) == 0;
    }
    if (!averaged) {
      throw IoError(where + " holds no averaged weights: it was written without train.ema_decay");
    }
  }
  for (const auto& [name, shape] : expected) {
    auto it = held.find(name);
    if (it == held.end()) {
      throw IoError(where + " holds no parameter '" + name + "', which the configured model has" +
                    (name == "lm_head.weight" ? " (its head is tied to wte? Set "
                                                "model.tie_embeddings: true)"
                                              : ""));
    }
    if (it->second != shape) {
      throw IoError(where + ": '" + name + "' is " + shape_str(it->second) +
                    ", the configured model's " + shape_str(shape));
    }
  }
  // LoRA adapters a checkpoint holds beside their weights: merged into them
  // (W + scale B A), the scale from the checkpoint's layout.
  double lora_scale = 0;
  if (auto l = info.layout.find("lora"); l != info.layout.end()) {
    std::istringstream words(l->second);
    for (std::string w; words >> w;) {
      if (w.rfind("scale=", 0) == 0) lora_scale = std::strtod(w.c_str() + 6, nullptr);
    }
  }
  std::map<std::string, std::vector<std::string>> adapters_of;  // weight -> its lora_a, lora_b
  for (const auto& [name, shape] : held) {
    if (!nn::is_lora_adapter(name) || expected.count(name)) continue;
    if (!(lora_scale > 0)) {
      throw IoError(where + " holds the LoRA adapter '" + name +
                    "' but its layout gives no LoRA scale to merge it with");
    }
    const std::string weight = nn::lora_adapted_weight(name);
    if (!expected.count(weight)) {
      throw IoError(where + " holds the LoRA adapter '" + name + "' of '" + weight +
                    "', which the configured model lacks");
    }
    adapters_of[weight].push_back(name);
  }
  for (const auto& [weight, adapters] : adapters_of) {
    if (adapters.size() != 2) {
      throw IoError(where + " holds one LoRA adapter of '" + weight + "' ('" + adapters[0] +
                    "') without the other");
    }
  }
  for (const auto& [name, shape] : held) {
    if (adapters_of.count(nn::is_lora_adapter(name) ? nn::lora_adapted_weight(name) : "")) continue;
    if (!expected.count(name)) {
      throw IoError(
          where + " holds '" + name + "', which the configured model lacks" +
          (name == "lm_head.weight" ? " (an untied head: set model.tie_embeddings: false)" : ""));
    }
  }
  // init.from's order: the tensors outside the blocks, then block by block.
  std::vector<std::string> order;
  std::vector<int64_t> part_of;
  for (int64_t part = -1; part < model.n_layer; ++part) {
    if (part >= 0 && blocks && !blocks->count(part)) continue;  // another rank's
    if (part < 0 && !options.outside) continue;
    for (const auto& [name, shape] : expected) {
      if (io::block_index(name) != part) continue;
      order.push_back(name);
      part_of.push_back(part);
      if (auto a = adapters_of.find(name); a != adapters_of.end()) {
        for (const std::string& adapter : a->second) {
          order.push_back(adapter);
          part_of.push_back(part);
        }
      }
    }
  }
  nn::StateDict part;
  size_t i = 0;
  for_each_full_state(
      info, order,
      [&](const std::string& name, std::map<std::string, Tensor>& full) {
        auto average = full.find("ema/" + name);
        part.emplace(name, options.ema && average != full.end() ? average->second
                                                                : full.at("param/" + name));
        ++i;
        if (i == order.size() || part_of[i] != part_of[i - 1]) {
          for (const auto& [weight, adapters] : adapters_of) {
            auto w = part.find(weight);
            if (w == part.end()) continue;
            w->second =
                nn::merge_lora(w->second, part.at(adapters[0]), part.at(adapters[1]), lora_scale);
            for (const std::string& adapter : adapters) part.erase(adapter);
          }
          consume(std::move(part));
          part.clear();  // (moved from: empty again)
        }
      },
      {.kinds =
           options.ema ? std::set<std::string>{"param/", "ema/"} : std::set<std::string>{"param/"},
       .headers = headers,
       .verify = options.verify,
       .replica = options.replica});
}

void read_averaged_checkpoint_weights(const std::vector<io::CheckpointInfo>& infos,
                                      const nn::GptConfig& model,
                                      const std::function<void(nn::StateDict&&)>& consume,
                                      bool ema) {
  if (infos.empty()) throw ValueError("read_averaged_checkpoint_weights: no checkpoint to average");
  std::vector<std::map<int, io::RankHeader>> headers;
  for (const io::CheckpointInfo& info : infos) {
    for (const auto& [rank, checksum] : info.checksums) {
      (void)checksum;
      io::RankFile verified(info, rank);  // (checked against its checksum here, once)
    }
    headers.push_back(read_rank_headers(info));
  }
  const double weight = 1.0 / static_cast<double>(infos.size());
  // Part by part (the tensors outside the blocks, then each block), each
  // checkpoint's copy of it summed in f64.
  for (int64_t part = -1; part < model.n_layer; ++part) {
    const std::set<int64_t> blocks = part < 0 ? std::set<int64_t>{} : std::set<int64_t>{part};
    nn::StateDict sum;
    std::map<std::string, DType> dtypes;
    for (size_t k = 0; k < infos.size(); ++k) {
      read_checkpoint_weights(infos[k], model,
                              [&](nn::StateDict&& got) {
                                for (auto& [name, t] : got) {
                                  const Tensor wide = cast(t, DType::F64);
                                  auto it = sum.find(name);
                                  if (it == sum.end()) {
                                    dtypes.emplace(name, t.dtype());
                                    sum.emplace(name, wide);
                                  } else {
                                    it->second = add(it->second, wide);
                                  }
                                }
                              },
                              {.blocks = &blocks,
                               .outside = part < 0,
                               .headers = &headers[k],
                               .verify = false,
                               .ema = ema});
    }
    if (sum.empty()) continue;
    nn::StateDict mean;
    for (auto& [name, t] : sum) mean.emplace(name, cast(scale(t, weight), dtypes.at(name)));
    consume(std::move(mean));
  }
}

FullState gather_full_state(const io::CheckpointInfo& info, const std::set<std::string>& names) {
  FullState out;
  for_each_full_state(
      info, names,
      [&](const std::string&, std::map<std::string, Tensor>& full) { out.tensors.merge(full); },
      &out.metadata);
  return out;
}

}  // namespace triad::train
