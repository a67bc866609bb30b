// A Hugging Face config.json read as a model's configuration. A model that
// a Hugging Face class holds is written back as that class's config.json
// (hf_config_json, an export's), which reads back to the same model: it
// writes the same text again.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/io/hf_config.h"
#include "triad/io/hf_export.h"

TRIAD_FUZZ_TARGET(hf_config) {
  const triad::nn::GptConfig c =
      triad::io::gpt_config_from_hf(triad::fuzz::as_text(data, size), "<fuzz>");
  if (!triad::io::hf_holding_class(c)) return;
  const std::string written = triad::io::hf_config_json(c);
  const std::string again =
      triad::io::hf_config_json(triad::io::gpt_config_from_hf(written, "<written>"));
  triad::fuzz::require(again == written, "an exported config.json reads back to the same model");
}
