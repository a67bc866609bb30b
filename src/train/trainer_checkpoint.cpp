// The trainer's checkpoints and weights: writing a checkpoint (in the
// background or not), resuming from one (under the same layout or
// resharded to another), starting from given weights, and writing the
// final model (LoRA merged in, a PEFT adapter beside it).

#include "triad/train/trainer.h"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <optional>
#include <set>

#include "triad/autograd/grad_mode.h"
#include "triad/core/nvtx.h"
#include "triad/io/checkpoint.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/json_integer.h"
#include "triad/io/peft_adapter.h"
#include "triad/ops/creation.h"
#include "triad/ops/elementwise.h"
#include "triad/ops/shape_ops.h"
#include "triad/train/attention_choice.h"
#include "triad/train/checkpoint_reshard.h"

namespace triad::train {
namespace {

// `text` on the group's root, the same text on every rank after (host
// tensors: over MPI under any device).
std::string broadcast_text(const dist::ProcessGroupPtr& group, const std::string& text) {
  Tensor length = from_vector(std::vector<int64_t>{static_cast<int64_t>(text.size())}, {1});
  group->broadcast(length, 0)->wait();
  const auto n = static_cast<size_t>(to_double_vector(length)[0]);
  Tensor words = zeros({static_cast<int64_t>((n + 7) / 8)}, DType::I64);
  if (group->rank() == 0) std::memcpy(words.data<int64_t>(), text.data(), n);
  group->broadcast(words, 0)->wait();
  return std::string(reinterpret_cast<const char*>(words.data<int64_t>()), n);
}

// Writes a model whose LoRA adapters are merged into their weights (W +
// scale B A) under the model's own names. Tensors come in any order (a
// tensor-parallel model's registration order has each weight before its
// adapters, a pipeline's sorted names have them after); a weight, and
// whatever comes after it, waits until its two adapters have come.
class MergingWriter {
 public:
  MergingWriter(io::Gpt2Writer& writer, std::set<std::string> adapted, double scale)
      : writer_(writer), adapted_(std::move(adapted)), scale_(scale) {}

  // Every adapter written, by name (the PEFT adapter's tensors).
  const nn::StateDict& adapters() const { return seen_; }

  void write(const std::string& name, const Tensor& t) {
    if (nn::is_lora_adapter(name)) {
      adapters_[name] = t.detach();
      seen_[name] = t.detach();
    } else {
      waiting_.emplace_back(name, t.detach());
    }
    while (!waiting_.empty()) {
      const auto& [next, w] = waiting_.front();
      if (adapted_.count(next)) {
        const std::string stem = next.substr(0, next.size() - std::string("weight").size());
        auto a = adapters_.find(stem + "lora_a"), b = adapters_.find(stem + "lora_b");
        if (a == adapters_.end() || b == adapters_.end()) return;
        writer_.write(next, nn::merge_lora(w, a->second, b->second, scale_));
        adapters_.erase(a);
        adapters_.erase(b);
      } else {
        writer_.write(next, w);
      }
      waiting_.pop_front();
    }
  }

 private:
  io::Gpt2Writer& writer_;
  std::set<std::string> adapted_;
  double scale_;
  std::deque<std::pair<std::string, Tensor>> waiting_;
  std::map<std::string, Tensor> adapters_;
  nn::StateDict seen_;
};

// Whether a resume takes the checkpoint's optimizer moments: asked to
// (checkpoint.load_optimizer) and written with them (checkpoint.save_optimizer;
// a checkpoint from before that key always was).
bool takes_optimizer(const CheckpointSection& ck,
                     const std::map<std::string, std::string>& metadata) {
  auto it = metadata.find("optimizer_state");
  return ck.load_optimizer && (it == metadata.end() || it->second != "none");
}

// The resume log line's word on an optimizer started afresh ("" if not).
std::string fresh_optimizer_note(bool takes, const CheckpointSection& ck) {
  if (takes) return "";
  return ck.load_optimizer
             ? "; the optimizer starts afresh (the checkpoint was written without it, "
               "checkpoint.save_optimizer: false)"
             : "; the optimizer starts afresh (checkpoint.load_optimizer: false)";
}

}  // namespace

void Trainer::save_checkpoint(int64_t next_step, std::optional<double> val_loss) {
  const nvtx::Range range("checkpoint");
  if (reducer_) reducer_->wait_gathers();  // (overlap_param_gather)
  const auto& ck = config_.checkpoint;
  const int rank = world_ ? world_->rank() : 0;
  if (pending_checkpoint_) commit_pending_checkpoint(/*wait=*/true);
  std::map<std::string, Tensor> tensors;
  // A write on another thread needs a snapshot: host tensors are copied, not
  // shared with the parameters and moments the next steps update. A write
  // here moves each tensor to the host as it writes it (SafetensorsWriter),
  // so the host never holds a second copy of the rank's whole state.
  auto host = [async = ck.async](const Tensor& t) {
    if (!async) return t.detach();
    Tensor h = to_device(t.detach(), Device::cpu()).detach();
    return t.device().is_cpu() ? clone(h).detach() : h;
  };
  for (auto& [name, p] : parameters()) tensors["param/" + name] = host(p);
  fold_ema();
  for (const auto& [name, average] : ema_) tensors["ema/" + name] = host(average);
  int64_t opt_step = 0;
  const bool moments = ck.save_optimizer;  // (the masters are weights: always)
  if (zero_optimizer_) {
    if (moments) {
      tensors["zero/m"] = host(zero_optimizer_->m());
      tensors["zero/v"] = host(zero_optimizer_->v());
    }
    if (zero_optimizer_->master().defined()) {
      tensors["zero/master"] = host(zero_optimizer_->master());
    }
    opt_step = zero_optimizer_->step_count();
  } else {
    for (auto& st : optimizer_->state()) {
      if (moments) {
        tensors["adam_m/" + st.name] = host(st.m);
        tensors["adam_v/" + st.name] = host(st.v);
      }
      if (st.master.defined()) tensors["master/" + st.name] = host(st.master);
    }
    if (muon_) {
      for (auto& st : muon_->state()) {
        if (moments) tensors["muon_momentum/" + st.matrix.name] = host(st.momentum);
        if (st.master.defined()) tensors["master/" + st.matrix.name] = host(st.master);
      }
    }
    opt_step = optimizer_->step_count();
  }
  std::map<std::string, std::string> meta{
      {"next_step", std::to_string(next_step)},
      {"consumed_sequences", std::to_string(first_sequence(next_step))},
      {"global_batch_size", std::to_string(config_.train.global_batch_size)},
      {"applied_steps", std::to_string(applied_steps_)},
      {"applied_sequences", std::to_string(applied_sequences_)},
      {"consecutive_skips", std::to_string(consecutive_skips_)},
      {"spike_window", spikes_.state()},
      {"early_stop",
       nlohmann::json{{"best", val_best_ ? nlohmann::json(*val_best_) : nlohmann::json()},
                      {"best_step", val_best_step_},
                      {"stale", val_stale_}}
           .dump()},
      {"optimizer_step", std::to_string(opt_step)},
      {"optimizer_state", moments ? "saved" : "none"},
      {"ema", ema_on() ? "kept" : "none"},
      {"data_sequences", std::to_string(dataset_->num_sequences())}};
  if (scaler_) meta["loss_scaler"] = scaler_->state().dump();
  meta["placement"] = placement_to_json(placement());
  if (device_.is_cuda()) {
    // The attention kernels this run settled on: a resumed run takes them
    // instead of timing again, and so repeats this one's arithmetic.
    meta["attention_choices"] = attention_choices_to_json(cuda::attention_choices()).dump();
  }
  const std::string staging = io::checkpoint_staging_dir(ck.dir, next_step);
  if (ck.async) {
    pending_checkpoint_ =
        PendingCheckpoint{next_step,
                          std::async(std::launch::async,
                                     [staging, rank, tensors = std::move(tensors),
                                      meta = std::move(meta), hook = before_checkpoint_write_] {
                                       if (hook) hook();
                                       io::write_rank_state(staging, rank, tensors, meta);
                                     })
                              .share(),
                          val_loss};
    if (is_logging_rank())
      spdlog::info("checkpoint: step {} is being written in the background", next_step);
    return;
  }
  io::write_rank_state(staging, rank, tensors, meta);
  barrier();
  if (rank == 0) {
    const std::optional<int64_t> best =
        io::commit_checkpoint(ck.dir, next_step, world_ ? world_->size() : 1, layout(),
                              to_yaml(config_), ck.keep, ck.keep_every, val_loss, ck.keep_best);
    spdlog::info("checkpoint: {}/step_{}{}", ck.dir, next_step,
                 best ? fmt::format(" (the best so far: step_{})", *best) : "");
  }
  barrier();
}

bool Trainer::pending_checkpoint_written() const {
  return !pending_checkpoint_ ||
         pending_checkpoint_->write.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

std::exception_ptr Trainer::pending_checkpoint_error() const {
  try {
    pending_checkpoint_->write.get();  // a shared future: the error stays for the commit
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void Trainer::commit_pending_checkpoint(bool wait, bool any_failed) {
  if (!pending_checkpoint_) return;
  if (wait) {
    pending_checkpoint_->write.wait();
    // Every rank learns whether any failed before rank 0 commits.
    Tensor failed =
        from_vector(std::vector<double>{pending_checkpoint_error() ? 1.0 : 0.0}, {1}, DType::F64);
    if (world_ && world_->size() > 1) world_->all_reduce(failed, dist::ReduceOp::Max)->wait();
    any_failed = item(failed) > 0;
  }
  const std::exception_ptr error = pending_checkpoint_error();
  const int64_t step = pending_checkpoint_->step;
  const std::optional<double> val_loss = pending_checkpoint_->val_loss;
  pending_checkpoint_.reset();
  if (error) std::rethrow_exception(error);
  if (any_failed) {
    throw IoError("checkpoint step " + std::to_string(step) +
                  ": another rank could not write its state (its log names the reason)");
  }
  const auto& ck = config_.checkpoint;
  if (!world_ || world_->rank() == 0) {
    const std::optional<int64_t> best =
        io::commit_checkpoint(ck.dir, step, world_ ? world_->size() : 1, layout(), to_yaml(config_),
                              ck.keep, ck.keep_every, val_loss, ck.keep_best);
    spdlog::info("checkpoint: {}/step_{}{}", ck.dir, step,
                 best ? fmt::format(" (the best so far: step_{})", *best) : "");
  }
  if (wait) barrier();
}

int64_t Trainer::load_checkpoint() {
  const auto& ck = config_.checkpoint;
  std::optional<io::CheckpointInfo> info;
  if (ck.resume == "auto") {
    info = io::find_latest_checkpoint(ck.dir);
  } else {
    try {  // (a checkpoint named must be there)
      info = io::open_checkpoint(ck.resume_path());
    } catch (const IoError& e) {
      throw IoError("checkpoint.resume '" + ck.resume + "': " + e.what());
    }
  }
  if (!info) return 0;
  if (is_logging_rank() && !info->config.empty()) {
    // What the user changed since: a learning rate, a batch size, a layout.
    const auto changes =
        config_changes(info->config, to_yaml(config_), "checkpoint '" + info->step_dir + "'");
    for (const std::string& c : changes) spdlog::info("changed since the checkpoint: {}", c);
  }
  const auto mine = layout();
  std::optional<io::RankState> st;
  if (info->layout == mine) {
    st = io::read_rank_state(*info, world_ ? world_->rank() : 0);
    if (zero_optimizer_ && !same_zero_pieces(*st)) st.reset();
  }
  if (!st) {
    // Another layout, another precision or ZeRO-1 pieces cut another way:
    // the model's f32 weights and the optimizer's state carry over; how they
    // are cut and rounded is this run's business.
    io::check_checkpoint_layout(*info, {{"model", mine.at("model")}});
    const auto metadata = load_resharded(*info);
    std::string from;
    for (const char* key : {"world", "tp", "pp", "dp", "ep", "cp", "vpp", "zero",
                            "sequence_parallel", "precision", "moments"}) {
      auto it = info->layout.find(key);
      if (it != info->layout.end())
        from += std::string(from.empty() ? "" : ", ") + key + " " + it->second;
    }
    const std::string fresh =
        fresh_optimizer_note(takes_optimizer(config_.checkpoint, metadata), config_.checkpoint);
    if (info->layout == mine) {
      spdlog::info("resumed from {} (step {}), whose ZeRO-1 pieces are cut another way{}",
                   info->step_dir, info->step, fresh);
    } else {
      spdlog::info("resumed from {} (step {}), written with another layout ({}){}", info->step_dir,
                   info->step, from, fresh);
    }
    return restore_counters(*info, metadata);
  }
  auto take = [&](const std::string& key, Tensor& into) {
    auto it = st->tensors.find(key);
    if (it == st->tensors.end())
      throw IoError("checkpoint '" + info->step_dir + "': missing tensor '" + key + "'");
    if (it->second.shape() != into.shape() || it->second.dtype() != into.dtype()) {
      throw IoError("checkpoint '" + info->step_dir + "': tensor '" + key + "' is " +
                    it->second.str() + ", this run has " + into.str());
    }
    copy_(into, it->second);
  };
  for (auto& [name, p] : parameters()) take("param/" + name, p);
  // checkpoint.load_optimizer false, or a checkpoint written without the
  // optimizer: the weights (masters included) alone; the moments stay zero
  // and the step count starts again.
  const bool moments = takes_optimizer(ck, st->metadata);
  const int64_t optimizer_step = moments ? metadata_int(*info, st->metadata, "optimizer_step") : 0;
  if (zero_optimizer_) {
    if (moments) {
      take("zero/m", zero_optimizer_->m());
      take("zero/v", zero_optimizer_->v());
    }
    if (zero_optimizer_->master().defined()) {
      take("zero/master", zero_optimizer_->master());
      zero_optimizer_->sync_params_from_masters();
    }
    zero_optimizer_->set_step_count(optimizer_step);
  } else {
    for (auto& s : optimizer_->state()) {
      if (moments) {
        take("adam_m/" + s.name, s.m);
        take("adam_v/" + s.name, s.v);
      }
      if (s.master.defined()) take("master/" + s.name, s.master);
    }
    optimizer_->sync_params_from_masters();
    optimizer_->set_step_count(optimizer_step);
    if (muon_) {
      for (auto& s : muon_->state()) {
        if (moments) take("muon_momentum/" + s.matrix.name, s.momentum);
        if (s.master.defined()) take("master/" + s.matrix.name, s.master);
      }
      muon_->sync_params_from_masters();
      muon_->set_step_count(optimizer_step);
    }
  }
  int64_t fresh_ema = 0;
  {
    autograd::NoGradGuard no_grad;
    const auto params = trainable_parameters();
    for (size_t i = 0; i < ema_.size(); ++i) {
      if (st->tensors.count("ema/" + ema_[i].first)) {
        take("ema/" + ema_[i].first, ema_[i].second);
      } else {
        copy_(ema_[i].second, cast(params[i].second.detach(), DType::F32));  // (any device)
        ++fresh_ema;
      }
    }
  }
  ema_started(fresh_ema, st->metadata);
  spdlog::info("resumed from {} (step {}){}", info->step_dir, info->step,
               fresh_optimizer_note(moments, ck));
  return restore_counters(*info, st->metadata);
}

bool Trainer::same_zero_pieces(const io::RankState& st) const {
  auto it = st.metadata.find("placement");
  if (it == st.metadata.end()) return false;
  const auto theirs = placement_from_json(it->second).zero_segments;
  const auto ours = placement().zero_segments;
  return std::equal(theirs.begin(), theirs.end(), ours.begin(), ours.end(),
                    [](const RankPlacement::Segment& a, const RankPlacement::Segment& b) {
                      return a.name == b.name && a.param_offset == b.param_offset &&
                             a.length == b.length && a.muon == b.muon;
                    });
}

int64_t Trainer::metadata_int(const io::CheckpointInfo& info,
                              const std::map<std::string, std::string>& metadata,
                              const std::string& key) const {
  auto it = metadata.find(key);
  if (it == metadata.end())
    throw IoError("checkpoint '" + info.step_dir + "': missing metadata '" + key + "'");
  const std::string& text = it->second;
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw IoError("checkpoint '" + info.step_dir + "': metadata '" + key + "' is '" + text +
                  "', expected an integer");
  }
  return value;
}

int64_t Trainer::restore_counters(const io::CheckpointInfo& info,
                                  const std::map<std::string, std::string>& metadata) {
  if (scaler_) {
    auto it = metadata.find("loss_scaler");
    auto precision = info.layout.find("precision");
    const std::string written =
        precision == info.layout.end() ? std::string("unknown") : precision->second;
    if (it != metadata.end()) {
      try {
        scaler_->load_state(nlohmann::json::parse(it->second));
      } catch (const nlohmann::json::exception& e) {
        throw IoError("checkpoint '" + info.step_dir + "': loss_scaler: " + e.what());
      }
    } else if (written == "fp16") {
      throw IoError("checkpoint '" + info.step_dir +
                    "' was written by an fp16 run but holds no loss-scaler state");
    } else {
      // A run switching to fp16 from bf16 or fp32 has no scale to carry
      // over: it starts from train.loss_scale_init, as a new run would.
      spdlog::info("checkpoint written with precision {}: the fp16 loss scale starts at {}",
                   written, scaler_->scale());
    }
  }
  auto choices = metadata.find("attention_choices");
  if (device_.is_cuda() && choices != metadata.end()) {
    try {
      for (const auto& c : attention_choices_from_json(nlohmann::json::parse(choices->second)))
        cuda::set_attention_choice(c);
    } catch (const nlohmann::json::exception& e) {
      throw IoError("checkpoint '" + info.step_dir + "': attention_choices: " + e.what());
    } catch (const IoError& e) {
      throw IoError("checkpoint '" + info.step_dir + "': " + e.what());
    }
  }
  applied_steps_ = metadata_int(info, metadata, "applied_steps");
  consecutive_skips_ = metadata_int(info, metadata, "consecutive_skips");
  // (A checkpoint from before spikes were filtered starts an empty window.)
  if (auto window = metadata.find("spike_window"); window != metadata.end()) {
    try {
      spikes_.load(window->second);
    } catch (const IoError& e) {
      throw IoError("checkpoint '" + info.step_dir + "': " + e.what());
    }
  }
  // (A checkpoint from before early stopping starts counting afresh.)
  if (auto stop = metadata.find("early_stop"); stop != metadata.end()) {
    try {
      const nlohmann::json j = nlohmann::json::parse(stop->second);
      val_best_ =
          j.at("best").is_null() ? std::nullopt : std::optional<double>(j.at("best").get<double>());
      const std::string at = "checkpoint '" + info.step_dir + "': early_stop: ";
      val_best_step_ = io::json_int<IoError>(j.at("best_step"), at + "best_step");
      val_stale_ = io::json_int<IoError>(j.at("stale"), at + "stale");
    } catch (const nlohmann::json::exception& e) {
      throw IoError("checkpoint '" + info.step_dir + "': early_stop: " + e.what());
    }
  }
  const int64_t next = metadata_int(info, metadata, "next_step");
  const int64_t G = config_.train.global_batch_size;
  // (A checkpoint from before they were recorded ran every step at its G.)
  applied_sequences_ = metadata.count("applied_sequences")
                           ? metadata_int(info, metadata, "applied_sequences")
                           : applied_steps_ * G;
  // The data goes on from the sequences consumed, whatever the batch size
  // was (a checkpoint from before they were recorded used this one).
  data_origin_step_ = next;
  data_origin_ = metadata.count("consumed_sequences")
                     ? metadata_int(info, metadata, "consumed_sequences")
                     : next * G;
  if (metadata.count("data_sequences") && is_logging_rank()) {
    // Sequences are counted, not remembered: other data goes on by count.
    const int64_t then = metadata_int(info, metadata, "data_sequences");
    if (then != dataset_->num_sequences()) {
      spdlog::warn(
          "data.train holds {} sequences, the checkpoint's run read {}: the data changed (its "
          "files, data.val_split, data.packing or model.seq_len), and training goes on at global "
          "sequence {} of the data as it is now",
          dataset_->num_sequences(), then, data_origin_);
    }
  }
  if (metadata.count("global_batch_size")) {
    const int64_t written = metadata_int(info, metadata, "global_batch_size");
    if (written != G) {
      spdlog::info(
          "train.global_batch_size {} (the checkpoint's was {}): the data continues after the "
          "{} sequences already trained on",
          G, written, data_origin_);
    }
  }
  return next;
}

std::map<int, io::RankHeader> Trainer::shared_rank_headers(const io::CheckpointInfo& info) const {
  if (!world_ || world_->size() == 1) return {};
  // A header rank 0 cannot read stops every rank with its error.
  std::string text;
  std::exception_ptr error;
  if (world_->rank() == 0) {
    try {
      text = "H" + rank_headers_to_json(read_rank_headers(info));
    } catch (const Error& e) {
      error = std::current_exception();
      text = std::string("E") + e.what();
    }
  }
  text = broadcast_text(world_, text);
  if (error) std::rethrow_exception(error);
  if (text.empty() || text[0] != 'H') {
    throw IoError("rank 0 could not read the headers of checkpoint '" + info.step_dir +
                  "': " + (text.empty() ? std::string("(no reason given)") : text.substr(1)));
  }
  return rank_headers_from_json(text.substr(1));
}

void Trainer::read_init_weights(const std::set<int64_t>* blocks,
                                const std::function<void(nn::StateDict&&)>& consume) const {
  const std::string& from = config_.init_from;
  // The model's own weights: LoRA adapters start from their initial values
  // (B zero: the model the file holds), and a checkpoint's adapters are
  // merged into its weights.
  const nn::GptConfig base = config_.model.without_lora();
  if (!io::is_checkpoint(from)) {
    io::WeightLayout layout = io::weight_layout(base);
    std::optional<io::PeftDeltas> adapter;  // init.adapter, merged as the file is read
    if (!config_.init_adapter.empty()) {
      adapter = io::read_peft_adapter(config_.init_adapter);
      layout.adapter = &*adapter;
    }
    io::read_gpt2_weights(from, nn::gpt_parameter_shapes(base), blocks, consume, layout);
    return;
  }
  if (!config_.init_adapter.empty()) {
    throw ConfigError("init.adapter '" + config_.init_adapter +
                      "' is merged into a weight file's "
                      "tensors, but init.from '" +
                      from + "' is a checkpoint");
  }
  const io::CheckpointInfo info = io::open_checkpoint(from);
  const std::map<int, io::RankHeader> headers = shared_rank_headers(info);
  read_checkpoint_weights(
      info, base, consume,
      {.blocks = blocks, .headers = headers.empty() ? nullptr : &headers, .replica = dp_rank_});
}

std::map<std::string, std::string> Trainer::load_resharded(const io::CheckpointInfo& info) {
  autograd::NoGradGuard no_grad;
  auto params = parameters();
  std::set<std::string> names;
  for (const auto& [name, p] : params) names.insert(name);
  const RankPlacement mine = placement();
  auto put = [&](Tensor& into, const Tensor& from, const std::string& what) {
    // Moments written in f32 or bf16 (train.moment_precision) come to this
    // run's (f32 -> bf16 rounds once, bf16 -> f32 is exact).
    const bool moment = what.rfind("adam_m/", 0) == 0 || what.rfind("adam_v/", 0) == 0 ||
                        what.rfind("muon_momentum/", 0) == 0;
    const auto storable = [](DType d) { return d == DType::F32 || d == DType::BF16; };
    if (moment && from.shape() == into.shape() && from.dtype() != into.dtype() &&
        storable(from.dtype()) && storable(into.dtype())) {
      copy_(into, cast(from, into.dtype()));
      return;
    }
    if (from.shape() != into.shape() || from.dtype() != into.dtype()) {
      throw IoError("checkpoint '" + info.step_dir + "': '" + what + "' comes to " + from.str() +
                    ", this run has " + into.str());
    }
    copy_(into, from);
  };
  // Where each parameter's state lives in this run.
  std::map<std::string, Tensor> param_of(params.begin(), params.end());
  // ZeRO-1: each piece of the parameter here and where it lies in the flat
  // state (m and master; v too unless it is a Muon matrix's).
  struct ZeroPiece {
    dp::ZeroAdamW::Place at;
    dp::GradientReducer::Segment seg;
  };
  std::map<std::string, std::vector<ZeroPiece>> zero_of;
  std::map<std::string, optim::AdamW::State*> state_of;
  if (zero_optimizer_) {
    const auto& segments = reducer_->shard_segments();
    for (size_t k = 0; k < segments.size(); ++k) {
      zero_of[reducer_->params()[segments[k].param].first].push_back(
          {zero_optimizer_->places()[k], segments[k]});
    }
  } else {
    for (auto& s : optimizer_->state()) state_of[s.name] = &s;
  }
  std::map<std::string, optim::Muon::State*> muon_of;
  if (muon_) {
    for (auto& s : muon_->state()) muon_of[s.matrix.name] = &s;
  }
  std::map<std::string, Tensor*> ema_of;  // (train.ema_decay)
  for (auto& [name, average] : ema_) ema_of[name] = &average;
  int64_t fresh_ema = 0;
  std::set<std::string> zero_muon;  // ZeRO-1's Muon matrices
  if (zero_optimizer_) {
    for (size_t i = 0; i < reducer_->params().size(); ++i) {
      if (zero_optimizer_->is_muon(i)) zero_muon.insert(reducer_->params()[i].first);
    }
  }
  // LoRA's adapters change what the weights mean: a checkpoint resumes only
  // with the adapters it was written with (init.from merges them instead).
  {
    const auto theirs = info.layout.find("lora");
    const auto ours = layout();
    const std::string a = theirs == info.layout.end() ? "none" : theirs->second;
    const std::string b = ours.count("lora") ? ours.at("lora") : "none";
    if (a != b) {
      throw IoError("checkpoint '" + info.step_dir + "' was written with LoRA adapters " + a +
                    ", this run has " + b +
                    ": resume with the same model.lora, or start a new run from it with "
                    "init.from (which merges its adapters into the weights)");
    }
  }
  // A parameter the writing run froze (train.freeze) has no optimizer state
  // there; if this run trains it, its moments start at zero.
  int64_t fresh_moments = 0;
  // Every rank file's header, read by rank 0 alone and broadcast: a
  // thousand ranks do not each open a thousand files.
  const std::map<int, io::RankHeader> headers = shared_rank_headers(info);
  // The kinds of state this run takes (checkpoint.load_optimizer false:
  // no moments; train.ema_decay: the averages).
  std::set<std::string> kinds{"param/", "master/"};
  if (config_.checkpoint.load_optimizer) kinds.insert({"adam_m/", "adam_v/", "muon_momentum/"});
  if (ema_on()) kinds.insert("ema/");
  // One parameter's full state at a time, this rank's cut of it placed
  // before the next is assembled.
  std::map<std::string, std::string> metadata;
  for_each_full_state(
      info, std::vector<std::string>(names.begin(), names.end()),
      [&](const std::string& name, std::map<std::string, Tensor>& full) {
        // This rank's cut of a full tensor, on the parameters' device.
        auto cut = [&](const std::string& kind) {
          auto it = full.find(kind + name);
          if (it == full.end()) {
            throw IoError("checkpoint '" + info.step_dir + "' has no '" + kind + name +
                          "' for this run's optimizer");
          }
          const Tensor t = mine.params.at(name).spec.cut(it->second, mine.tp_rank, mine.tp_size);
          return to_device(contiguous(t), device_).detach();
        };
        // The f32 weight: its master where the writing run trained in half
        // precision, else the parameter itself. Under any precision this run
        // starts from these, so bf16 -> fp32 -> fp16 loses nothing the
        // checkpoint held; the half parameters are rounded from them once.
        const Tensor w = [&] {
          const Tensor t = cut(full.count("master/" + name) ? "master/" : "param/");
          return t.dtype() == DType::F32 ? t : cast(t, DType::F32);
        }();
        Tensor& p = param_of.at(name);
        put(p, p.dtype() == DType::F32 ? w : cast(w, p.dtype()), "param/" + name);
        if (auto e = ema_of.find(name); e != ema_of.end()) {
          if (full.count("ema/" + name)) {
            put(*e->second, cut("ema/"), "ema/" + name);
          } else {
            copy_(*e->second, w);  // (no average written: it starts here)
            ++fresh_ema;
          }
        }
        // Muon's matrices keep their momentum, the rest AdamW's moments.
        const bool muon = muon_of.count(name) || zero_muon.count(name);
        const std::string moment = muon ? "muon_momentum/" : "adam_m/";
        if (auto mu = muon_of.find(name); mu != muon_of.end()) {
          optim::Muon::State& s = *mu->second;
          if (s.master.defined()) put(s.master, w, "master/" + name);
          if (full.count(moment + name)) {
            put(s.momentum, cut(moment), moment + name);
          } else {
            ++fresh_moments;  // (frozen when written, or AdamW's)
          }
          return;
        }
        if (!full.count(moment + name)) {
          // Frozen when written (or under another optimizer): only the
          // master weight to place.
          if (zero_optimizer_ && zero_optimizer_->master().defined()) {
            for (const auto& [at, seg] : zero_of[name]) {
              Tensor dst = narrow(zero_optimizer_->master(), 0, at.m_at, seg.length);
              put(dst, narrow(reshape(w, {w.numel()}), 0, seg.param_offset, seg.length),
                  "master/" + name);
            }
          } else if (auto s = state_of.find(name); s != state_of.end()) {
            if (s->second->master.defined()) put(s->second->master, w, "master/" + name);
          }
          if (zero_of.count(name) || state_of.count(name)) ++fresh_moments;
          return;
        }
        if (zero_optimizer_) {
          for (const auto& [at, segment] : zero_of[name]) {
            // This rank's piece of a full-shaped tensor into its flat state.
            // (A named copy: clang before 16 lets no lambda capture a binding.)
            const auto& seg = segment;
            auto place = [&](Tensor& state, int64_t where, const Tensor& src,
                             const std::string& what) {
              Tensor dst = narrow(state, 0, where, seg.length);
              put(dst, narrow(reshape(src, {src.numel()}), 0, seg.param_offset, seg.length), what);
            };
            place(zero_optimizer_->m(), at.m_at, cut(moment), moment + name);
            if (!muon) place(zero_optimizer_->v(), at.v_at, cut("adam_v/"), "adam_v/" + name);
            if (zero_optimizer_->master().defined())
              place(zero_optimizer_->master(), at.m_at, w, "master/" + name);
          }
        } else if (auto s = state_of.find(name); s != state_of.end()) {
          put(s->second->m, cut("adam_m/"), "adam_m/" + name);
          put(s->second->v, cut("adam_v/"), "adam_v/" + name);
          if (s->second->master.defined()) put(s->second->master, w, "master/" + name);
        }
      },
      {.kinds = kinds,
       .metadata = &metadata,
       .headers = headers.empty() ? nullptr : &headers,
       .replica = dp_rank_});
  const bool moments = takes_optimizer(config_.checkpoint, metadata);
  if (fresh_moments > 0 && is_logging_rank() && moments) {
    spdlog::info(
        "resume: {} parameter{} without state for this run's optimizer in the checkpoint (frozen "
        "there, or under another train.optimizer) start{} from zero moments",
        fresh_moments, fresh_moments == 1 ? "" : "s", fresh_moments == 1 ? "s" : "");
  }
  ema_started(fresh_ema, metadata);
  const int64_t optimizer_step =
      moments ? metadata_int(info, metadata, "optimizer_step") : 0;  // (else it starts afresh)
  if (zero_optimizer_) {
    zero_optimizer_->sync_params_from_masters();
    zero_optimizer_->set_step_count(optimizer_step);
  } else {
    optimizer_->sync_params_from_masters();
    optimizer_->set_step_count(optimizer_step);
    if (muon_) {
      muon_->sync_params_from_masters();
      muon_->set_step_count(optimizer_step);
    }
  }
  return metadata;
}

void Trainer::gather_model_each(
    const std::function<void(const std::string&, const Tensor&)>& take) const {
  if (reducer_) reducer_->wait_gathers();
  // The first data-parallel replica gives the model; under expert
  // parallelism its expert-parallel group (the first ep data-parallel
  // ranks), whose experts each holder sends the others.
  const bool gives = mesh_ && mesh_->dp_rank() < config_.parallel.ep;
  if (pp_model_) {
    pp_model_->gather_each(gives, mesh_->tp_rank() == 0 && mesh_->dp_rank() == 0, take);
  } else if (tp_model_) {
    if (gives) {
      // Collective over the TP group (and the expert-parallel group): every
      // rank joins every tensor.
      std::map<std::string, Shape> names = tp_model_->full_shapes();
      names.insert(tp_model_->others_experts().begin(), tp_model_->others_experts().end());
      for (const auto& [name, shape] : names) {
        const Tensor t = tp_model_->full_tensor(name, true);
        if (mesh_->dp_rank() == 0) take(name, t);
      }
    }
  } else {
    for (const auto& [name, p] : parameters()) take(name, p);
  }
}

// Collective: the model's weights as they stand into `weights` (LoRA merged
// in), and with `adapters` a LoRA run's adapters in PEFT's format beside it.
// Returns what was written, for the log line.
Trainer::WrittenWeights Trainer::write_weights(const std::string& weights, bool adapters) const {
  const bool lead = is_logging_rank();
  // Collective: only data-parallel replica 0's tensor-parallel groups join
  // their shards (on the host), and only the writing rank's pipeline (its
  // ranks share their tp and dp rank) sends its stages there. The writing
  // rank writes each tensor as it is joined (or arrives), so no rank holds
  // the whole model on its host either.
  if (reducer_) reducer_->wait_gathers();
  std::vector<std::pair<std::string, io::TensorLayout>> layout;
  // Each tensor in the parameters' dtype, but for the state a model keeps
  // in its own (an MoE layer's expert biases, f32 under any precision),
  // whichever rank or stage holds it.
  if (pp_model_) {
    for (auto& [name, shape] : pp_model_->gather_order())
      layout.push_back({name, {shape, pp_model_->tensor_dtype(name)}});
  } else if (tp_model_) {
    // In name order, the experts other expert-parallel ranks hold included
    // (gather_model_each's order).
    std::map<std::string, Shape> shapes = tp_model_->full_shapes();
    shapes.insert(tp_model_->others_experts().begin(), tp_model_->others_experts().end());
    const DType dtype = config_.train.param_dtype();
    for (const auto& [name, shape] : shapes)
      layout.push_back({name, {shape, nn::is_moe_state(name) ? DType::F32 : dtype}});
  } else {
    for (const auto& [name, p] : parameters()) layout.push_back({name, {p.shape(), p.dtype()}});
  }
  // LoRA: the file holds the model with its adapters merged in, under the
  // model's own names (what triad-generate, triad-export and Hugging Face
  // read); the checkpoints keep the adapters apart.
  const bool merge = config_.model.lora.rank > 0;
  std::set<std::string> adapted;  // the weights with adapters
  for (const auto& [name, l] : layout) {
    if (merge && nn::is_lora_adapter(name)) adapted.insert(nn::lora_adapted_weight(name));
  }
  if (merge) std::erase_if(layout, [](const auto& l) { return nn::is_lora_adapter(l.first); });
  // A write that fails (the file cannot be made, the disk fills) is raised
  // once the other ranks have given their tensors: none waits on the writer.
  std::exception_ptr write_error;
  auto attempt = [&](const std::function<void()>& fn) {
    if (write_error) return;
    try {
      fn();
    } catch (...) {
      write_error = std::current_exception();
    }
  };
  std::unique_ptr<io::Gpt2Writer> writer;
  if (lead) {
    attempt([&] {
      writer = std::make_unique<io::Gpt2Writer>(weights, config_.model.without_lora(), layout);
    });
  }
  std::optional<MergingWriter> merging;
  if (writer && merge) merging.emplace(*writer, adapted, config_.model.lora_scale());
  auto take = [&](const std::string& name, const Tensor& t) {
    if (!writer) return;
    attempt([&] {
      if (merging) {
        merging->write(name, t);
      } else {
        writer->write(name, t);
      }
    });
  };
  gather_model_each(take);
  if (writer) attempt([&] { writer->finish(); });
  // The adapters apart too, in PEFT's format, for serving many on one base.
  const std::string adapter_dir = config_.output_dir + "/adapter";
  const bool peft = adapters && merging && io::peft_adapter_unsupported(config_.model).empty();
  if (peft) {
    attempt([&] {
      io::save_peft_adapter(merging->adapters(), config_.model, adapter_dir, config_.init_from);
    });
  }
  if (write_error) std::rethrow_exception(write_error);
  return {merging.has_value(), peft ? adapter_dir : std::string()};
}

}  // namespace triad::train
