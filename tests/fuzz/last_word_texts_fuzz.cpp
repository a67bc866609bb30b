// A LAMBADA-style file (JSON lines with a "text" each), every text cut
// before its last word and encoded as triad-eval scores it: the context,
// then the continuation (the context's trailing spaces and the word). The
// cut loses nothing: the context is not empty, the target is a space and a
// word with no space in it, and a byte-level tokenizer gives back, from the
// two halves' tokens, the whole text (its NFC form).
#include <sstream>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/last_word.h"
#include "triad/data/multiple_choice.h"
#include "triad/data/tokenizer.h"

TRIAD_FUZZ_TARGET(last_word_texts) {
  using triad::fuzz::require;
  static const auto bpe = triad::data::load_hf_tokenizer(TRIAD_FUZZ_FIXTURES "/tokenizer.json");
  std::istringstream in(triad::fuzz::as_text(data, size));
  const auto texts = triad::data::read_last_word_texts(in, "<fuzz>");
  require(!texts.empty(), "a file that reads holds texts");
  for (const auto& t : texts) {
    require(!t.context.empty(), "a context before the word");
    require(
        t.target.size() >= 2 && t.target[0] == ' ' && t.target.find(' ', 1) == std::string::npos,
        "the target is a space and a word without one");
    const auto [context, word] =
        triad::data::encode_context_and_continuation(*bpe, t.context, t.target);
    require(!word.empty(), "the word has tokens");
    const std::string whole = t.context + t.target;
    if (whole.find("<|") == std::string::npos)
      require(bpe->decode(context) + bpe->decode(word) == triad::data::nfc(whole),
              "the two halves decode to the text");
  }
}
