#pragma once

// --chat-template, as triad-generate and triad-eval read it: a built-in
// template by name (chatml, llama3, gemma), `auto` (the built-in one the
// --tokenizer model's own template is), or `model` (that Jinja program run
// as transformers runs it). Resolved against the tokenizer: the markers a
// built-in template writes must be its special tokens, the template writes
// its own beginning (so --bos-token is refused beside it), and the token
// ending the assistant's turn is the template's end of turn (model: the
// model's eos_token, -1 when it names none a tokenizer holds).

#include <spdlog/spdlog.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer_options.h"
#include "triad/core/error.h"
#include "triad/data/chat_template.h"
#include "triad/data/tokenizer.h"

namespace triad::examples {

class ChatPrompts {
 public:
  ChatPrompts() = default;  // no template: plain prompts
  // `name` empty: none.
  ChatPrompts(const std::string& name, const TokenizerOptions& tokens, const data::Tokenizer& tok) {
    if (name.empty()) return;
    if (name == "model") {
      model_ = data::ModelChatTemplate::load(tokens.tokenizer_path(), tok.special_tokens());
      name_ = "model";
      // The model's end token (tokenizer_config.json's eos_token): what an
      // instruction-tuned model's answer ends with.
      const std::string eos = model_->variable("eos_token");
      end_of_turn_ = eos.empty() ? -1 : tok.special_token(eos);
      if (end_of_turn_ < 0 && !eos.empty()) {
        spdlog::warn(
            "--chat-template model: the model's eos_token '{}' is not a special token of "
            "the tokenizer (a generation_config.json beside it, or --stop-token, can name the "
            "end)",
            eos);
      }
    } else {
      builtin_ = data::resolve_chat_template(name, tokens.tokenizer_path());
      name_ = data::chat_template_name(*builtin_);
      data::require_chat_markers(tok, *builtin_, "--chat-template " + name_ + ":");
      end_of_turn_ = tok.special_token(data::chat_end_of_turn(*builtin_));
    }
    if (tokens.has_bos()) {
      throw ValueError(
          "--bos-token with --chat-template: the template writes its own "
          "beginning (or none)");
    }
  }

  bool active() const { return builtin_.has_value() || model_.has_value(); }
  bool is_model() const { return model_.has_value(); }
  // The built-in template's name, or "model".
  const std::string& name() const { return name_; }
  // The token that ends the assistant's turn, or -1.
  int64_t end_of_turn() const { return end_of_turn_; }

  // The conversation so far and the header opening the assistant's turn
  // (add_generation_prompt), nothing scored.
  data::SegmentedDocument render(const std::vector<data::ChatMessage>& messages) const {
    if (builtin_) return data::render_chat_prompt(*builtin_, messages);
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
    return model_->render_prompt(list);
  }
  // A rendered prompt's tokens: its markers by id, the text between them
  // encoded.
  static std::vector<int32_t> encode(const data::Tokenizer& tok,
                                     const data::SegmentedDocument& prompt) {
    const auto doc = data::tokenize_segmented(tok, {prompt}, -1, false);
    return std::vector<int32_t>(doc.tokens.front().begin(), doc.tokens.front().end());
  }
  // A rendered prompt's text, the markers written out.
  static std::string text(const data::SegmentedDocument& prompt) {
    std::string out;
    for (const data::TextSegment& s : prompt) out += s.text;
    return out;
  }

 private:
  std::optional<data::ChatTemplate> builtin_;
  std::optional<data::ModelChatTemplate> model_;
  std::string name_;
  int64_t end_of_turn_ = -1;
};

}  // namespace triad::examples
