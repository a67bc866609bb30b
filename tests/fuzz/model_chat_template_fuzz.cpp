// A model's tokenizer_config.json as --chat-template reads it: its
// chat_template (a string, or a list of named ones), its token variables
// (strings or added-token objects), the built-in template it is taken for
// (`auto`), and the program run on a conversation every way the tools run it.
// What it writes must be cut as a tokenizer cuts it: each special piece one
// special token, no special token in the text between them (nor one cut in
// two), text pieces joined unless scored differently, and the prompt a
// generation is asked with scored nowhere.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/chat_template.h"

namespace {

void check_pieces(const triad::data::SegmentedDocument& doc,
                  const std::vector<std::string>& special, bool may_score) {
  using triad::fuzz::require;
  std::string whole;
  std::vector<bool> plain;  // whether each byte of `whole` is in a text piece
  for (size_t i = 0; i < doc.size(); ++i) {
    const auto& p = doc[i];
    require(!p.text.empty(), "no piece is empty");
    require(may_score || !p.scored, "a generation prompt scores nothing");
    if (p.special) {
      require(std::find(special.begin(), special.end(), p.text) != special.end(),
              "a special piece is one special token");
    } else if (i > 0 && !doc[i - 1].special) {
      require(doc[i - 1].scored != p.scored, "adjacent text pieces scored alike are joined");
    }
    whole += p.text;
    plain.insert(plain.end(), p.text.size(), !p.special);
  }
  for (size_t at = 0; at < whole.size(); ++at) {
    if (!plain[at]) continue;
    for (const std::string& s : special) {
      require(whole.compare(at, s.size(), s) != 0, "no special token starts in a text piece");
    }
  }
}

}  // namespace

TRIAD_FUZZ_TARGET(model_chat_template) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \u00e9 there"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "And?"},
    {"role": "assistant", "content": "Bye.", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}
  ])");
  const std::string dir = triad::fuzz::scratch_dir() + "/model";
  std::filesystem::create_directories(dir);
  triad::fuzz::write_input("model/tokenizer_config.json", data, size);
  try {
    (void)triad::data::chat_template_of_model(dir);
  } catch (const triad::Error&) {
  }
  const std::vector<std::string> special{"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>",
                                         "</s>"};
  const auto chat = triad::data::ModelChatTemplate::load(dir, special);
  (void)chat.variable("eos_token");
  try {
    check_pieces(chat.render(messages), special, true);
  } catch (const triad::Error&) {
  }
  try {
    for (const auto& doc : chat.render_each_turn(messages)) check_pieces(doc, special, true);
  } catch (const triad::Error&) {
  }
  check_pieces(chat.render_prompt(messages), special, false);
}
