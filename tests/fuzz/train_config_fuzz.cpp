// A training config (YAML) parsed and validated.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/train/config.h"

TRIAD_FUZZ_TARGET(train_config) {
  (void)triad::train::parse_config(triad::fuzz::as_text(data, size), {}, "<fuzz>");
}
