// Fine-tuning data (JSON lines) read every way triad-tokenize reads it:
// prompt/response pairs, conversations in each built-in chat template and in
// a model's own (one document per conversation, or per assistant turn),
// then tokenized with loss masks. Each document's mask is as long as its
// tokens.
#include <sstream>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/chat_template.h"
#include "triad/data/tokenizer.h"

TRIAD_FUZZ_TARGET(sft_documents) {
  using triad::data::DocumentLabels;
  static const auto tokenizer =
      triad::data::load_hf_tokenizer(TRIAD_FUZZ_FIXTURES "/chat_model/tokenizer.json");
  static const auto model_chat =
      std::make_shared<const triad::data::ModelChatTemplate>(triad::data::ModelChatTemplate::load(
          TRIAD_FUZZ_FIXTURES "/chat_model", tokenizer->special_tokens()));
  static const int64_t eod = tokenizer->encode("<|endoftext|>").at(0);
  struct Reading {
    const char* key;
    DocumentLabels labels;
  };
  std::vector<Reading> readings(6, {"messages", {}});
  readings[0] = {"response", {}};
  readings[0].labels.prompt_key = "prompt";
  readings[1].labels.chat = triad::data::ChatTemplate::ChatML;
  readings[2].labels.chat = triad::data::ChatTemplate::Llama3;
  readings[3].labels.chat = triad::data::ChatTemplate::Gemma;
  readings[4].labels.model_chat = readings[5].labels.model_chat = model_chat;
  readings[5].labels.each_turn = true;
  const std::string text = triad::fuzz::as_text(data, size);
  for (const Reading& r : readings) {
    try {
      std::istringstream in(text);
      triad::data::DocumentReader reader(in, triad::data::DocumentSplit::JsonLines, r.key,
                                         r.labels);
      std::vector<triad::data::SegmentedDocument> documents;
      while (reader.next(documents, 256)) {
      }
      const auto masked = triad::data::tokenize_segmented(*tokenizer, documents, eod, true);
      triad::fuzz::require(
          masked.tokens.size() == documents.size() && masked.keep.size() == documents.size(),
          "every document is tokenized");
      for (size_t i = 0; i < documents.size(); ++i) {
        triad::fuzz::require(masked.tokens[i].size() == masked.keep[i].size(),
                             "a document's mask is as long as its tokens");
      }
    } catch (const triad::Error&) {
    }
  }
}
