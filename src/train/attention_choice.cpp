#include "triad/train/attention_choice.h"

#include <nlohmann/json.hpp>

#include "triad/core/error.h"
#include "triad/io/json_integer.h"
#include "triad/ops/creation.h"

namespace triad::train {

bool agree_attention_choice(bool has, cuda::AttentionChoice& choice, dist::ProcessGroup* world) {
  if (!world || world->size() == 1) return has;
  // (ranks deciding, Triad's time, cuDNN's time), summed.
  Tensor sums = from_vector(
      std::vector<double>{has ? 1.0 : 0.0, has ? choice.own_ms : 0.0, has ? choice.cudnn_ms : 0.0},
      {3}, DType::F64);
  world->all_reduce(sums, dist::ReduceOp::Sum)->wait();
  const std::vector<double> s = to_double_vector(sums);
  if (!has) return false;
  choice.own_ms = s[1];
  choice.cudnn_ms = s[2];
  choice.cudnn = s[0] == world->size() && s[2] < s[1];
  return true;
}

nlohmann::json attention_choices_to_json(const std::vector<cuda::AttentionChoice>& choices) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : choices) {
    nlohmann::json e = {{"dtype", dtype_name(c.dtype)},
                        {"deterministic", c.deterministic},
                        {"batch", c.batch},
                        {"seq_len", c.seq_len},
                        {"d_model", c.d_model},
                        {"n_head", c.n_head},
                        {"kernel", c.cudnn ? "cudnn" : "triad"},
                        {"triad_ms", c.own_ms},
                        {"cudnn_ms", c.cudnn_ms}};
    // (Key/value heads only when grouped, a window only when there is one:
    // earlier checkpoints read the same.)
    if (c.kv_heads > 0 && c.kv_heads != c.n_head) e["kv_heads"] = c.kv_heads;
    if (c.window > 0) e["window"] = c.window;
    if (c.forward_only) e["forward_only"] = true;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<cuda::AttentionChoice> attention_choices_from_json(const nlohmann::json& j) {
  std::vector<cuda::AttentionChoice> out;
  if (!j.is_array()) throw IoError("attention choices: expected a JSON array, got " + j.dump());
  for (const auto& e : j) {
    try {
      cuda::AttentionChoice c;
      c.dtype = dtype_from_name(e.at("dtype").get<std::string>());
      c.deterministic = e.at("deterministic").get<bool>();
      c.batch = io::json_int<IoError>(e.at("batch"), "batch");
      c.seq_len = io::json_int<IoError>(e.at("seq_len"), "seq_len");
      c.d_model = io::json_int<IoError>(e.at("d_model"), "d_model");
      c.n_head = io::json_int<IoError>(e.at("n_head"), "n_head");
      if (e.contains("kv_heads")) {
        c.kv_heads = io::json_int<IoError>(e.at("kv_heads"), "kv_heads");
        if (c.kv_heads < 1)
          throw IoError("kv_heads " + std::to_string(c.kv_heads) + " must be at least 1");
      }
      if (e.contains("window")) {
        c.window = io::json_int<IoError>(e.at("window"), "window");
        if (c.window < 1)
          throw IoError("window " + std::to_string(c.window) + " must be at least 1");
      }
      c.forward_only = e.value("forward_only", false);
      const std::string kernel = e.at("kernel").get<std::string>();
      if (kernel != "cudnn" && kernel != "triad") {
        throw IoError("kernel '" + kernel + "' is neither 'triad' nor 'cudnn'");
      }
      c.cudnn = kernel == "cudnn";
      c.own_ms = e.value("triad_ms", 0.0);
      c.cudnn_ms = e.value("cudnn_ms", 0.0);
      out.push_back(c);
    } catch (const std::exception& ex) {
      throw IoError("attention choice " + e.dump() + ": " + ex.what());
    }
  }
  return out;
}

}  // namespace triad::train
