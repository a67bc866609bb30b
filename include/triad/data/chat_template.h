#pragma once

// Chat conversations as fine-tuning documents. A conversation is a list of
// messages (role system, user or assistant, and their text), the form chat
// datasets come in ({"messages": [{"role": "user", "content": "..."}, ...]}).
// A chat template writes it out as the text a chat model reads, with the
// markers its tokenizer holds as special tokens; fine-tuning then scores
// what the assistant says and nothing else. Hugging Face keeps each
// model's template as a Jinja program in tokenizer_config.json; Triad has
// the common ones built in, by name, written out as those programs write
// them, for the messages given and nothing more:
//   chatml  Qwen2, Qwen2.5, Qwen3 (without thinking blocks) and many more:
//           <|im_start|>ROLE\nCONTENT<|im_end|>\n per message (Qwen2.5's
//           own template adds a default system message when there is
//           none; put it in the data to have it)
//   llama3  LLaMA 3: <|begin_of_text|>, then
//           <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//           per message (content trimmed; 3.1 and later also write a dated
//           system header, which is not written here)
//   gemma   Gemma, Gemma 2, Gemma 3: <bos>, then
//           <start_of_turn>ROLE\nCONTENT<end_of_turn>\n per message, the
//           assistant's role written "model", content trimmed, and a system
//           message's text put before the first user message's (as Gemma
//           3's template does; Gemma has no system turn)
// In each, an assistant message's content and its end-of-turn marker are
// scored (the model learns to answer, and to end its turn); the role
// headers, system and user messages are read only.
#include <string>
#include <vector>

#include "triad/data/tokenizer.h"

namespace triad::data {

enum class ChatTemplate { ChatML, Llama3, Gemma };
// chatml | llama3 | gemma; anything else is a ValueError listing them.
ChatTemplate chat_template_from_string(const std::string& name);
// The built-in template a Hugging Face chat template (its Jinja text) is,
// told by the markers it writes; a ValueError when it writes none of the
// built-in templates' (or those of more than one).
ChatTemplate chat_template_of_jinja(const std::string& jinja);
// The model's own template (`--chat-template auto`): the chat_template of
// the tokenizer_config.json in `tokenizer_path` (a model directory) or
// beside it (a tokenizer file) — or, where that holds none, the
// chat_template.jinja there — as chat_template_of_jinja reads it. Errors
// name the file and what is missing.
ChatTemplate chat_template_of_model(const std::string& tokenizer_path);
// --chat-template's value: a name, or `auto` (chat_template_of_model).
ChatTemplate resolve_chat_template(const std::string& name, const std::string& tokenizer_path);
const char* chat_template_name(ChatTemplate t);
// Every marker the template writes must be one special token of the
// tokenizer (else the model would read it as plain text): a ValueError
// naming the first that is not, after `what`.
void require_chat_markers(const Tokenizer& tokenizer, ChatTemplate t, const std::string& what);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// The conversation in the template: its markers as special pieces, the
// text between them as text pieces (adjacent text scored alike joined). Errors (ValueError): a role
// other than system, user or assistant, naming the message's index; under gemma, a system message
// anywhere but first, or not followed by a user message.
SegmentedDocument render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages);
// What a chat model is given to answer (triad-generate --chat-template):
// the conversation so far, then the header that opens the assistant's
// turn (Hugging Face's add_generation_prompt).
SegmentedDocument render_chat_prompt(ChatTemplate t, const std::vector<ChatMessage>& messages);
// The marker that ends a turn, on which generation stops.
const char* chat_end_of_turn(ChatTemplate t);

}  // namespace triad::data
