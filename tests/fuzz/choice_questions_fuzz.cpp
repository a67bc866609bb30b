// An evaluation file (JSON lines of multiple-choice questions in any of the
// formats triad-eval reads), both HellaSwag prompt styles.
#include <sstream>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/multiple_choice.h"

TRIAD_FUZZ_TARGET(choice_questions) {
  for (auto style : {triad::data::HellaSwagPrompt::Raw, triad::data::HellaSwagPrompt::Harness}) {
    std::istringstream in(triad::fuzz::as_text(data, size));
    (void)triad::data::read_choice_questions(in, "<fuzz>", 0, style);
  }
}
