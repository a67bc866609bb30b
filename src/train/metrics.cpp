#include "triad/train/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "triad/core/error.h"

namespace triad::train {

std::string rank_timing_summary(const std::vector<StepMetrics::RankTiming>& timing, int ranks) {
  std::string line = fmt::format("ms/step over {} ranks, min/mean/max (slowest): ", ranks);
  for (size_t i = 0; i < timing.size(); ++i) {
    const StepMetrics::RankTiming& t = timing[i];
    line += fmt::format("{}{} {:.1f}/{:.1f}/{:.1f} (rank {})", i == 0 ? "" : " | ", t.category,
                        t.min_ms, t.mean_ms, t.max_ms, t.slowest_rank);
  }
  return line;
}

std::vector<StepMetrics::Straggler> find_stragglers(const std::vector<double>& compute_ms,
                                                    const std::vector<int>& stage_of_rank,
                                                    double factor) {
  if (compute_ms.size() != stage_of_rank.size()) {
    throw ValueError("find_stragglers: " + std::to_string(compute_ms.size()) +
                     " ranks' times but " + std::to_string(stage_of_rank.size()) + " stages");
  }
  std::map<int, std::vector<double>> by_stage;
  for (size_t r = 0; r < compute_ms.size(); ++r)
    by_stage[stage_of_rank[r]].push_back(compute_ms[r]);
  std::map<int, double> median;
  for (auto& [stage, times] : by_stage) {
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    median[stage] = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  }
  std::vector<StepMetrics::Straggler> out;
  for (size_t r = 0; r < compute_ms.size(); ++r) {
    const int stage = stage_of_rank[r];
    const int peers = static_cast<int>(by_stage[stage].size());
    const double m = median[stage];
    if (peers > 1 && m > 0 && compute_ms[r] >= factor * m)
      out.push_back({static_cast<int>(r), stage, compute_ms[r], m, peers});
  }
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_at) : path_(path) {
  std::string kept;
  if (resumed_at >= 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      // A line that does not parse (a write cut short) ends the history.
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer()) break;
      if (j["step"].get<int64_t>() > resumed_at) break;
      kept += line + "\n";
    }
  }
  if (resumed_at >= 0) {
    // The kept history replaces the file whole (written beside it, then
    // renamed), so a crash here leaves the old file or the new, never half.
    const std::string staged = path + ".tmp";
    {
      std::ofstream s(staged, std::ios::trunc);
      s << kept;
      s.flush();
      if (!s) throw IoError("cannot write metrics file '" + staged + "'");
    }
    std::error_code ec;
    std::filesystem::rename(staged, path, ec);
    if (ec) throw IoError("cannot replace metrics file '" + path + "': " + ec.message());
  }
  out_.open(path, resumed_at >= 0 ? std::ios::app : std::ios::trunc);
  if (!out_) throw IoError("cannot open metrics file '" + path + "' for writing");
}

void MetricsWriter::write(const StepMetrics& m) {
  nlohmann::json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["lr"] = m.lr;
  if (m.weight_decay >= 0) j["weight_decay"] = m.weight_decay;
  j["grad_norm"] = m.grad_norm;
  if (m.param_norm >= 0) j["param_norm"] = m.param_norm;
  for (const auto& [key, norms] :
       {std::pair{"grad_norms", &m.grad_norms}, std::pair{"param_norms", &m.param_norms}}) {
    if (norms->empty()) continue;
    nlohmann::json groups = nlohmann::json::object();
    for (const auto& [name, norm] : *norms) groups[name] = norm;
    j[key] = groups;
  }
  j["consumed_sequences"] = m.consumed_sequences;
  j["global_batch_size"] = m.global_batch_size;
  j["tokens_per_s"] = m.tokens_per_s;
  j["step_ms"] = m.step_ms;
  if (m.elapsed_s >= 0) j["elapsed_s"] = m.elapsed_s;
  j["tflops_per_device"] = m.tflops_per_device;
  if (m.mfu > 0) j["mfu"] = m.mfu;
  if (m.bubble_fraction >= 0) j["bubble_fraction"] = m.bubble_fraction;
  if (!m.rank_timing.empty()) {
    nlohmann::json by_category = nlohmann::json::object();
    for (const StepMetrics::RankTiming& r : m.rank_timing) {
      by_category[r.category] = {{"min_ms", r.min_ms},
                                 {"mean_ms", r.mean_ms},
                                 {"max_ms", r.max_ms},
                                 {"slowest_rank", r.slowest_rank}};
    }
    j["rank_timing"] = by_category;
  }
  if (m.rank_peak_memory) {
    const StepMetrics::RankMemory& r = *m.rank_peak_memory;
    j["rank_peak_memory"] = {{"min_bytes", r.min_bytes},
                             {"mean_bytes", r.mean_bytes},
                             {"max_bytes", r.max_bytes},
                             {"largest_rank", r.largest_rank}};
  }
  if (!m.stragglers.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const StepMetrics::Straggler& s : m.stragglers) {
      list.push_back({{"rank", s.rank},
                      {"stage", s.stage},
                      {"compute_ms", s.compute_ms},
                      {"median_ms", s.median_ms},
                      {"peers", s.peers}});
    }
    j["stragglers"] = list;
  }
  if (m.moe_balance >= 0) {
    j["moe_balance"] = m.moe_balance;
    j["moe_max_load"] = m.moe_max_load;
  }
  if (m.moe_dropped >= 0) j["moe_dropped"] = m.moe_dropped;
  if (!m.moe_layers.empty()) {
    nlohmann::json layers = nlohmann::json::object();
    for (const auto& l : m.moe_layers)
      layers[l.layer] = {{"max_load", l.max_load}, {"min_load", l.min_load}};
    j["moe_layers"] = layers;
  }
  if (m.moe_z_loss >= 0) j["moe_z_loss"] = m.moe_z_loss;
  if (!m.mtp_losses.empty()) j["mtp_losses"] = m.mtp_losses;
  if (m.z_loss >= 0) j["z_loss"] = m.z_loss;
  if (m.skipped) j["skipped"] = true;
  if (m.spike) j["spike"] = true;
  if (m.loss_scale > 0) j["loss_scale"] = m.loss_scale;
  j["peak_memory_bytes"] = m.peak_memory_bytes;
  if (m.reserved_memory_bytes >= 0) j["reserved_memory_bytes"] = m.reserved_memory_bytes;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  if (!m.val_losses.empty()) {
    nlohmann::json sets = nlohmann::json::object();
    for (const auto& [name, loss] : m.val_losses) sets[name] = loss;
    j["val_losses"] = sets;
  }
  if (m.val_ema_loss) j["val_ema_loss"] = *m.val_ema_loss;
  if (!m.val_ema_losses.empty()) {
    nlohmann::json sets = nlohmann::json::object();
    for (const auto& [name, loss] : m.val_ema_losses) sets[name] = loss;
    j["val_ema_losses"] = sets;
  }
  auto scores = [](const StepMetrics::ChoiceScores& c) {
    nlohmann::json j{{"questions", c.questions},
                     {"acc", c.acc},
                     {"acc_norm", c.acc_norm},
                     {"acc_per_token", c.acc_per_token},
                     {"answer_loss", c.answer_loss}};
    if (c.mc2) j["mc2"] = *c.mc2;
    return j;
  };
  auto lambada = [](const StepMetrics::LambadaScores& l) {
    return nlohmann::json{
        {"texts", l.texts}, {"acc", l.acc}, {"loss", l.loss}, {"perplexity", l.perplexity}};
  };
  // Named sets' scores as one object by name, under `key` (when any).
  auto named = [&](const char* key, const auto& sets, auto as_json) {
    if (sets.empty()) return;
    nlohmann::json by_name = nlohmann::json::object();
    for (const auto& [name, s] : sets) by_name[name] = as_json(s);
    j[key] = by_name;
  };
  if (m.choices) j["choices"] = scores(*m.choices);
  named("choice_sets", m.choice_sets, scores);
  if (m.choices_ema) j["choices_ema"] = scores(*m.choices_ema);
  named("choice_ema_sets", m.choice_ema_sets, scores);
  if (m.lambada) j["lambada"] = lambada(*m.lambada);
  named("lambada_sets", m.lambada_sets, lambada);
  if (m.lambada_ema) j["lambada_ema"] = lambada(*m.lambada_ema);
  named("lambada_ema_sets", m.lambada_ema_sets, lambada);
  if (!m.samples.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [prompt, text] : m.samples)
      list.push_back({{"prompt", prompt}, {"text", text}});
    j["samples"] = list;
  }
  // (A sample cut inside a character shows U+FFFD for its broken bytes.)
  if (m.passed_over || m.evaluation_only) {
    // (train.skip_steps, eval.at_start: nothing trained, so nothing of
    // training was measured.)
    for (const char* key : {"loss", "grad_norm", "tokens_per_s", "step_ms", "tflops_per_device",
                            "peak_memory_bytes", "reserved_memory_bytes"})
      j.erase(key);
    if (m.passed_over) j["passed_over"] = true;
  }
  out_ << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  out_.flush();
  if (!out_) throw IoError("error writing metrics file '" + path_ + "'");
}

}  // namespace triad::train
