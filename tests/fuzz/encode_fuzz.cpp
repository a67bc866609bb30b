// Any text (malformed UTF-8 included) through the tokenizers every corpus
// goes through: a byte-level BPE tokenizer.json (pre-tokenisation pattern,
// NFC, added tokens) and a SentencePiece model, encoded and decoded. The
// byte-level tokenizers lose nothing but what NFC changes: a text without
// their added tokens' markers decodes to its NFC form, byte for byte.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/sentencepiece.h"
#include "triad/data/tokenizer.h"

TRIAD_FUZZ_TARGET(encode) {
  static const auto bpe = triad::data::load_hf_tokenizer(TRIAD_FUZZ_FIXTURES "/tokenizer.json");
  static const auto chat =
      triad::data::load_hf_tokenizer(TRIAD_FUZZ_FIXTURES "/chat_model/tokenizer.json");
  static const auto sp =
      triad::data::load_sentencepiece(TRIAD_FUZZ_FIXTURES "/sentencepiece_bpe.model");
  const std::string text = triad::fuzz::as_text(data, size);
  const bool plain = text.find("<|") == std::string::npos;
  for (const triad::data::Tokenizer* t : {static_cast<const triad::data::Tokenizer*>(bpe.get()),
                                          static_cast<const triad::data::Tokenizer*>(chat.get())}) {
    const std::string back = t->decode(t->encode(text));
    if (plain)
      triad::fuzz::require(back == triad::data::nfc(text), "decode(encode(text)) is NFC(text)");
  }
  (void)sp->decode(sp->encode(text));
}
