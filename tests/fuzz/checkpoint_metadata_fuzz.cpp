// The state a checkpoint's rank file carries as metadata, read back as a
// resume reads it: the rank's placement (tensor-parallel cuts, ZeRO
// pieces), the loss-spike window, the fp16 loss scaler and the attention
// kernels chosen. What reads writes back to text that reads the same.
#include <nlohmann/json.hpp>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/optim/loss_scaler.h"
#include "triad/train/attention_choice.h"
#include "triad/train/checkpoint_reshard.h"
#include "triad/train/spike_filter.h"

TRIAD_FUZZ_TARGET(checkpoint_metadata) {
  using triad::fuzz::require;
  const std::string text = triad::fuzz::as_text(data, size);
  try {
    const std::string once =
        triad::train::placement_to_json(triad::train::placement_from_json(text));
    require(triad::train::placement_to_json(triad::train::placement_from_json(once)) == once,
            "a placement writes back and reads the same");
  } catch (const triad::Error&) {
  }
  try {
    triad::train::SpikeFilter window(3.0, 8);
    window.load(text);
    triad::train::SpikeFilter again(3.0, 8);
    again.load(window.state());
    require(again.state() == window.state(), "a spike window writes back and reads the same");
  } catch (const triad::Error&) {
  }
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  try {
    triad::optim::DynamicLossScaler scaler;
    scaler.load_state(j);
    triad::optim::DynamicLossScaler again;
    again.load_state(scaler.state());
    require(again.state() == scaler.state(),
            "a loss scaler's state writes back and reads the same");
  } catch (const triad::Error&) {
  }
  try {
    const auto once =
        triad::train::attention_choices_to_json(triad::train::attention_choices_from_json(j));
    require(triad::train::attention_choices_to_json(
                triad::train::attention_choices_from_json(once)) == once,
            "attention choices write back and read the same");
  } catch (const triad::Error&) {
  }
}
