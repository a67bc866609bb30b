#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "triad/core/tensor.h"
#include "triad/io/checkpoint.h"
#include "triad/nn/gpt.h"
#include "triad/parallel/tensor/shard.h"

namespace triad::train {

// Where a rank's state sits in the whole model, saved with every checkpoint
// (rank file metadata "placement") so that a run with another layout can
// resume from it: its mesh coordinates, how each of its parameters is cut
// from the full tensor, and (ZeRO-1) which pieces of its parameters its flat
// optimizer state covers, in order.
struct RankPlacement {
  int tp_rank = 0, tp_size = 1, pp_rank = 0, dp_rank = 0;
  struct Param {
    tp::ShardSpec spec;
    Shape full_shape;
  };
  std::map<std::string, Param> params;
  struct Segment {
    std::string name;
    int64_t param_offset = 0;  // first element within the rank's shard of the parameter
    int64_t length = 0;
    // A Muon matrix's piece: its momentum in "zero/m", nothing in "zero/v"
    // (whose pieces are AdamW's alone, in order).
    bool muon = false;
  };
  std::vector<Segment> zero_segments;  // empty without ZeRO-1
};
std::string placement_to_json(const RankPlacement& placement);
// Errors name the problem (a checkpoint's metadata is untrusted input).
RankPlacement placement_from_json(const std::string& text);

// The full (unsharded) tensors of the parameters `names` and of their
// optimizer state, keyed "param/<name>", "adam_m/<name>", "adam_v/<name>",
// "master/<name>" (mixed precision) and "muon_momentum/<name>" (Muon's
// matrices), assembled from every rank file of a
// checkpoint written under any (tp, pp, dp, vpp, ZeRO-1) layout: tensor-
// parallel shards joined (vocabulary padding dropped), any data-parallel
// replica or pipeline holder used, ZeRO-1 pieces gathered across the
// data-parallel ranks. `metadata` is rank 0's (step counts, loss scaler).
// Each rank file is read once, one at a time. Errors name the checkpoint and
// what is missing; a checkpoint without placements (written before Triad
// saved them) can only be resumed with its own layout, and the error says so.
struct FullState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};
FullState gather_full_state(const io::CheckpointInfo& info, const std::set<std::string>& names);
// The same one parameter at a time: `take` gets each name of `names` (in
// order) with its full tensors by key, and a resuming rank cuts its shard
// before the next is assembled, so it never holds the whole state of the
// model, nor of its own stage's full tensors. Every source is found from the
// files' headers, and every name checked, before any file is read; the files
// that give something are verified against their checksums once.
// `metadata`, when given, receives rank 0's.
void for_each_full_state(
    const io::CheckpointInfo& info, const std::set<std::string>& names,
    const std::function<void(const std::string& name, std::map<std::string, Tensor>& full)>& take,
    std::map<std::string, std::string>* metadata = nullptr);
// The same in the order `order` names the parameters (each once), for the
// kinds of state asked for ("param/", "adam_m/", "adam_v/", "master/",
// "muon_momentum/", "ema/"; none named: all): an export reads the weights alone, block by block.
struct FullStateOptions {
  std::set<std::string> kinds{};
  std::map<std::string, std::string>* metadata = nullptr;  // receives rank 0's
  // Every rank file's header (placement, shapes), read already: a trainer
  // resuming under another layout reads them on one rank and broadcasts
  // them (rank_headers_to_json), so thousands of ranks do not each open
  // every file of the checkpoint. Unset: read here.
  const std::map<int, io::RankHeader>* headers = nullptr;
  // false: the files are not checked against their checksums (a reader
  // that has just verified them, as an export's second pass).
  bool verify = true;
  // Which of a stage's data-parallel replicas gives a tensor they all hold
  // (modulo their number): a resuming rank passes its data-parallel rank,
  // so the ranks read (and verify) different files instead of all the
  // first replica's.
  int replica = 0;
};
void for_each_full_state(
    const io::CheckpointInfo& info, const std::vector<std::string>& order,
    const std::function<void(const std::string& name, std::map<std::string, Tensor>& full)>& take,
    const FullStateOptions& options);

// Every rank file's header (io::read_rank_header), and the same as text
// for a broadcast; a text that is not such is an IoError naming what is
// wrong.
std::map<int, io::RankHeader> read_rank_headers(const io::CheckpointInfo& info);
std::string rank_headers_to_json(const std::map<int, io::RankHeader>& headers);
std::map<int, io::RankHeader> rank_headers_from_json(const std::string& text);

// The model's weights as a checkpoint holds them (each parameter's
// "param/" tensors joined, whatever layout wrote them), handed over as
// init.from's reader hands over a file: first the tensors outside the
// blocks, then each block in order, so the host holds one block. The
// checkpoint's parameters must be the configured model's, shape for shape:
// an IoError names the first one missing, extra or of another shape.
struct CheckpointWeightsOptions {
  // The blocks to read (a pipeline rank's), as read_gpt2_weights' `blocks`;
  // the tensors outside the blocks are read too unless `outside` is false.
  // Unset: all.
  const std::set<int64_t>* blocks = nullptr;
  bool outside = true;
  // Every rank file's header (read_rank_headers, as a trainer broadcasts
  // them); unset: read here, once.
  const std::map<int, io::RankHeader>* headers = nullptr;
  bool verify = true;  // as FullStateOptions::verify
  int replica = 0;     // as FullStateOptions::replica
  // The averages of the weights the checkpoint keeps (train.ema_decay's
  // "ema/" tensors, f32) instead of the weights; a parameter without one
  // (frozen, or a LoRA run's base weight) is its own average. A checkpoint
  // with none is an IoError saying so.
  bool ema = false;
};
void read_checkpoint_weights(const io::CheckpointInfo& info, const nn::GptConfig& model,
                             const std::function<void(nn::StateDict&&)>& consume,
                             const CheckpointWeightsOptions& options = {});

// The mean of several checkpoints' weights (Polyak averaging: Llama 3's
// final model averaged its annealing checkpoints), parameter by parameter
// in f64, each returned in its dtype in the first checkpoint, handed over
// part by part as read_checkpoint_weights hands one checkpoint's: the host
// holds one part of each checkpoint and their sum. Each checkpoint may come
// from any layout; every rank file is verified once, first. An empty list
// is a ValueError.
// `ema`: each checkpoint's averaged weights, as CheckpointWeightsOptions::ema.
void read_averaged_checkpoint_weights(const std::vector<io::CheckpointInfo>& infos,
                                      const nn::GptConfig& model,
                                      const std::function<void(nn::StateDict&&)>& consume,
                                      bool ema = false);

}  // namespace triad::train
