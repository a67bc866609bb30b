// A model's tokenizer_config.json as --chat-template reads it: its
// chat_template (a string, or a list of named ones), its token variables
// (strings or added-token objects), the built-in template it is taken for
// (`auto`), and the program run on a conversation every way the tools run it.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/chat_template.h"

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
  const auto chat = triad::data::ModelChatTemplate::load(
      dir, {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>"});
  (void)chat.variable("eos_token");
  try {
    (void)chat.render(messages);
  } catch (const triad::Error&) {
  }
  try {
    (void)chat.render_each_turn(messages);
  } catch (const triad::Error&) {
  }
  (void)chat.render_prompt(messages);
}
