// A training config (YAML) parsed and validated. What parses is written
// back (to_yaml, what a checkpoint keeps and a resume compares) to a text
// that parses to the same config, which a resume finds unchanged; and the
// text with no overrides applied (with_overrides, what a run directory
// keeps) is the same config too.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/train/config.h"

TRIAD_FUZZ_TARGET(train_config) {
  using triad::fuzz::require;
  namespace train = triad::train;
  const std::string text = triad::fuzz::as_text(data, size);
  const std::string written = train::to_yaml(train::parse_config(text, {}, "<fuzz>"));
  const std::string again = train::to_yaml(train::parse_config(written, {}, "<written>"));
  require(again == written, "to_yaml's text parses to the same config");
  require(train::config_changes(written, again).empty(), "a resume finds nothing changed");
  require(
      train::to_yaml(train::parse_config(train::with_overrides(text, {}), {}, "<kept>")) == written,
      "the text kept with no overrides is the same config");
}
