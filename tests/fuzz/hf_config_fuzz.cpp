// A Hugging Face config.json read as a model's configuration.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/io/hf_config.h"

TRIAD_FUZZ_TARGET(hf_config) {
  (void)triad::io::gpt_config_from_hf(triad::fuzz::as_text(data, size), "<fuzz>");
}
