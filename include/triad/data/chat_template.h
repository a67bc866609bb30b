#pragma once

// Chat conversations as fine-tuning documents. A conversation is a list of
// messages (role system, user or assistant, and their text), the form chat
// datasets come in ({"messages": [{"role": "user", "content": "..."}, ...]}).
// A chat template writes it out as the text a chat model reads, with the
// markers its tokenizer holds as special tokens; fine-tuning then scores
// what the assistant says and nothing else. Hugging Face keeps each
// model's template as a Jinja program in tokenizer_config.json, which
// ModelChatTemplate (below) runs; Triad also has the common ones built in,
// by name, written out as those programs write them, for the messages
// given and nothing more:
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
#include <array>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "triad/data/jinja.h"
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

// A model's own chat template (--chat-template model): its Jinja program
// run as transformers runs it (data/jinja.h), so that a conversation is
// written exactly as the model was tuned to read it — default system
// messages, dated headers, tool calls, any field a message has — with the
// token variables tokenizer_config.json names (bos_token, eos_token,
// unk_token, pad_token). The text is cut at the tokenizer's special tokens,
// each then taken by id. What the assistant says is scored:
//   - where the program marks it ({% generation %} blocks), those parts
//     (transformers' assistant mask);
//   - otherwise, for each assistant message, what the program adds to the
//     conversation before it with an answer's prompt (add_generation_prompt)
//     by writing the message — its text and end-of-turn marker, not the
//     whitespace after. This needs a program that writes every turn the same
//     whichever follow; one that does not (Qwen3's drops the thinking of
//     earlier turns) is a ValueError naming the message.
class ModelChatTemplate {
 public:
  // From the model directory `tokenizer_path` (or a tokenizer file in it):
  // tokenizer_config.json's chat_template (its "default" one where there
  // are several) or chat_template.jinja, and its token variables.
  // `special_tokens`: the tokenizer's (Tokenizer::special_tokens). Errors
  // name the file.
  static ModelChatTemplate load(const std::string& tokenizer_path,
                                std::vector<std::string> special_tokens);
  ModelChatTemplate(const std::string& jinja, nlohmann::ordered_json variables,
                    std::vector<std::string> special_tokens, std::string origin = "");

  // `messages`: a JSON list of objects, each with a string "role".
  // `extra`: more variables for the program, such as the "tools" a
  // conversation may call (transformers' apply_chat_template arguments).
  SegmentedDocument render(
      const nlohmann::ordered_json& messages,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // One document per assistant message: the conversation up to and
  // including it, as the program writes a conversation that ends there,
  // with that message's turn alone scored (as render scores it). For
  // programs that write a turn differently once later messages follow
  // (Qwen3's drops the thinking of answers before the last question):
  // each answer is trained as the model writes it when it is the latest,
  // each earlier one read as the program rewrites it. A conversation
  // without an assistant message gives none.
  std::vector<SegmentedDocument> render_each_turn(
      const nlohmann::ordered_json& messages,
      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // The conversation so far and the opening of the assistant's answer
  // (add_generation_prompt), nothing scored: what triad-generate asks.
  SegmentedDocument render_prompt(const nlohmann::ordered_json& messages) const;
  // A token variable (such as eos_token: the default stop), or "".
  std::string variable(const std::string& name) const;
  const std::string& origin() const { return origin_; }

 private:
  std::string text(const nlohmann::ordered_json& messages, bool generation_prompt,
                   std::vector<std::pair<size_t, size_t>>* generation,
                   const nlohmann::ordered_json& extra) const;
  // Where `text` holds special tokens (begin, end), read left to right,
  // the longest first at each place.
  std::vector<std::pair<size_t, size_t>> special_places(const std::string& text) const;
  void cut(const std::string& text, bool scored, SegmentedDocument& doc) const;
  // `text` cut into pieces, what the byte ranges `scored` touch scored.
  SegmentedDocument pieces(const std::string& text,
                           std::vector<std::pair<size_t, size_t>> scored) const;

  std::shared_ptr<const jinja::Template> program_;
  nlohmann::ordered_json variables_;
  std::vector<std::string> special_;  // longest first
  std::array<bool, 256> starts_{};    // the bytes a special token starts with
  std::string origin_;
};

}  // namespace triad::data
