// A chat template (a Jinja program from a model's tokenizer_config.json)
// parsed and run on a conversation, as the chat tools run it.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/data/jinja.h"

#include <nlohmann/json.hpp>

TRIAD_FUZZ_TARGET(jinja) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi \u00e9 there"},
      {"role": "assistant", "content": "Hello.", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "content": "42"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true,
    "data": {"b": 2, "a": 1, "c": "three"},
    "people": [{"name": "ann", "age": 31, "admin": false}, {"name": "bo", "age": 25}]
  })");
  const triad::data::jinja::Template program(triad::fuzz::as_text(data, size));
  std::vector<std::pair<size_t, size_t>> generation;
  (void)program.render(context, &generation);
}
