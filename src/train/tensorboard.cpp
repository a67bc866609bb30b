#include "triad/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "triad/core/error.h"

namespace triad::train {

namespace {

// The reflected CRC-32C table (polynomial 0x82F63B78).
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol Buffers' wire format, the few pieces an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, uint32_t field, uint32_t wire) {
  varint(out, field << 3 | wire);
}
void fixed(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}
void bytes_field(std::string& out, uint32_t field, std::string_view data) {
  key(out, field, 2);
  varint(out, data.size());
  out.append(data);
}

// Event: wall_time (1, double), step (2, int64), then file_version (3,
// string) or summary (5, Summary).
std::string event(double wall_time, int64_t step) {
  std::string e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof bits);
  key(e, 1, 1);
  fixed(e, bits, 8);
  if (step != 0) {
    key(e, 2, 0);
    varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  const auto& table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError("tensorboard: cannot create the directory '" + dir + "': " + ec.message());
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const double t = now_seconds();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + host +
          "." + std::to_string(getpid()) + ".triad";
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw IoError("tensorboard: cannot open '" + path_ + "' for writing");
  std::string e = event(t, 0);
  bytes_field(e, 3, "brain.Event:2");
  record(e);
  flush();
}

void TensorBoardWriter::record(std::string_view data) {
  std::string header;
  fixed(header, data.size(), 8);
  std::string frame = header;
  fixed(frame, masked_crc32c(header), 4);
  frame.append(data);
  fixed(frame, masked_crc32c(data), 4);
  out_.write(frame.data(), static_cast<std::streamsize>(frame.size()));
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value,
                               double wall_time) {
  // Summary { repeated Value value = 1 }, Value { string tag = 1; float
  // simple_value = 2 }.
  std::string v;
  bytes_field(v, 1, tag);
  const float f = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  key(v, 2, 5);
  fixed(v, bits, 4);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event(wall_time < 0 ? now_seconds() : wall_time, step);
  bytes_field(e, 5, summary);
  record(e);
}

void TensorBoardWriter::text(const std::string& tag, int64_t step, const std::string& value,
                             double wall_time) {
  // Summary.Value { tag = 1; metadata = 9: SummaryMetadata { plugin_data =
  // 1: PluginData { plugin_name = 1: "text" } }; tensor = 8: TensorProto {
  // dtype = 1: DT_STRING (7); tensor_shape = 2: a scalar's (empty);
  // string_val = 8 } }.
  std::string plugin;
  bytes_field(plugin, 1, "text");
  std::string metadata;
  bytes_field(metadata, 1, plugin);
  std::string tensor;
  key(tensor, 1, 0);
  varint(tensor, 7);
  bytes_field(tensor, 2, "");
  bytes_field(tensor, 8, value);
  std::string v;
  bytes_field(v, 1, tag);
  bytes_field(v, 9, metadata);
  bytes_field(v, 8, tensor);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event(wall_time < 0 ? now_seconds() : wall_time, step);
  bytes_field(e, 5, summary);
  record(e);
}

void TensorBoardWriter::restart(int64_t step) {
  // Event.session_log (6) = SessionLog { status (1) = START (1) }.
  std::string log;
  key(log, 1, 0);
  varint(log, 1);
  std::string e = event(now_seconds(), step);
  bytes_field(e, 6, log);
  record(e);
  flush();
}

void TensorBoardWriter::write(const StepMetrics& m) {
  const double t = now_seconds();
  if (m.evaluation_only) {
    // eval.at_start: the evaluations below alone.
  } else if (m.passed_over) {  // train.skip_steps: nothing measured but where the run is
    scalar("train/lr", m.step, m.lr, t);
    scalar("train/consumed_sequences", m.step, static_cast<double>(m.consumed_sequences), t);
    scalar("train/global_batch_size", m.step, static_cast<double>(m.global_batch_size), t);
    scalar("train/skipped", m.step, 1.0, t);
  } else {
    scalar("train/loss", m.step, m.loss, t);
    scalar("train/lr", m.step, m.lr, t);
    if (m.weight_decay >= 0) scalar("train/weight_decay", m.step, m.weight_decay, t);
    scalar("train/grad_norm", m.step, m.grad_norm, t);
    if (m.param_norm >= 0) scalar("train/param_norm", m.step, m.param_norm, t);
    for (const auto& [name, norm] : m.grad_norms) scalar("grad_norm/" + name, m.step, norm, t);
    for (const auto& [name, norm] : m.param_norms) scalar("param_norm/" + name, m.step, norm, t);
    scalar("train/tokens_per_s", m.step, m.tokens_per_s, t);
    scalar("train/step_ms", m.step, m.step_ms, t);
    scalar("train/tflops_per_device", m.step, m.tflops_per_device, t);
    scalar("train/peak_memory_gb", m.step, static_cast<double>(m.peak_memory_bytes) / 1e9, t);
    if (m.reserved_memory_bytes >= 0) {
      scalar("train/reserved_memory_gb", m.step, static_cast<double>(m.reserved_memory_bytes) / 1e9,
             t);
    }
    scalar("train/consumed_sequences", m.step, static_cast<double>(m.consumed_sequences), t);
    scalar("train/global_batch_size", m.step, static_cast<double>(m.global_batch_size), t);
    if (m.mfu > 0) scalar("train/mfu", m.step, m.mfu, t);
    if (m.bubble_fraction >= 0) scalar("train/bubble_fraction", m.step, m.bubble_fraction, t);
    for (const StepMetrics::RankTiming& r : m.rank_timing) {
      scalar("timing/" + r.category + "_min_ms", m.step, r.min_ms, t);
      scalar("timing/" + r.category + "_max_ms", m.step, r.max_ms, t);
    }
    if (const auto& p = m.rank_peak_memory) {
      scalar("memory/rank_peak_min_gb", m.step, static_cast<double>(p->min_bytes) / 1e9, t);
      scalar("memory/rank_peak_max_gb", m.step, static_cast<double>(p->max_bytes) / 1e9, t);
    }
    if (m.moe_balance >= 0) {
      scalar("train/moe_balance", m.step, m.moe_balance, t);
      scalar("train/moe_max_load", m.step, m.moe_max_load, t);
    }
    if (m.moe_dropped >= 0) scalar("train/moe_dropped", m.step, m.moe_dropped, t);
    for (const auto& l : m.moe_layers) {
      scalar("moe/" + l.layer + "/max_load", m.step, l.max_load, t);
      scalar("moe/" + l.layer + "/min_load", m.step, l.min_load, t);
    }
    if (m.moe_z_loss >= 0) scalar("train/moe_z_loss", m.step, m.moe_z_loss, t);
    if (m.z_loss >= 0) scalar("train/z_loss", m.step, m.z_loss, t);
    for (size_t k = 0; k < m.mtp_losses.size(); ++k)
      scalar("train/mtp_loss_" + std::to_string(k + 1), m.step, m.mtp_losses[k], t);
    if (m.loss_scale > 0) scalar("train/loss_scale", m.step, m.loss_scale, t);
    if (m.skipped) scalar("train/skipped", m.step, 1.0, t);
    if (m.spike) scalar("train/spike", m.step, 1.0, t);
  }
  if (m.val_loss) scalar("val/loss", m.step, *m.val_loss, t);
  for (const auto& [name, loss] : m.val_losses) scalar("val/" + name + "/loss", m.step, loss, t);
  if (m.val_ema_loss) scalar("val_ema/loss", m.step, *m.val_ema_loss, t);
  for (const auto& [name, loss] : m.val_ema_losses)
    scalar("val_ema/" + name + "/loss", m.step, loss, t);
  auto choices = [&](const std::string& prefix, const StepMetrics::ChoiceScores& c) {
    scalar(prefix + "acc", m.step, c.acc, t);
    scalar(prefix + "acc_norm", m.step, c.acc_norm, t);
    scalar(prefix + "acc_per_token", m.step, c.acc_per_token, t);
    scalar(prefix + "answer_loss", m.step, c.answer_loss, t);
    if (c.mc2) scalar(prefix + "mc2", m.step, *c.mc2, t);
  };
  if (m.choices) choices("eval/", *m.choices);
  for (const auto& [name, c] : m.choice_sets) choices("eval/" + name + "/", c);
  if (m.choices_ema) choices("eval_ema/", *m.choices_ema);
  for (const auto& [name, c] : m.choice_ema_sets) choices("eval_ema/" + name + "/", c);
  auto lambada = [&](const std::string& prefix, const StepMetrics::LambadaScores& l) {
    scalar(prefix + "acc", m.step, l.acc, t);
    scalar(prefix + "loss", m.step, l.loss, t);
    scalar(prefix + "perplexity", m.step, l.perplexity, t);
  };
  if (m.lambada) lambada("lambada/", *m.lambada);
  for (const auto& [name, l] : m.lambada_sets) lambada("lambada/" + name + "/", l);
  if (m.lambada_ema) lambada("lambada_ema/", *m.lambada_ema);
  for (const auto& [name, l] : m.lambada_ema_sets) lambada("lambada_ema/" + name + "/", l);
  for (size_t i = 0; i < m.samples.size(); ++i) {
    text("samples/" + std::to_string(i + 1), m.step,
         "```\n" + m.samples[i].first + m.samples[i].second + "\n```", t);
  }
  flush();
}

void TensorBoardWriter::flush() {
  out_.flush();
  if (!out_) throw IoError("tensorboard: error writing '" + path_ + "'");
}

}  // namespace triad::train
