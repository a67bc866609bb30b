#include "triad/data/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "ascii_space.h"
#include "triad/core/error.h"
#include "triad/io/text_file.h"

namespace triad::data {
namespace {

// Appends text, joined to the last piece when that is text scored alike.
void put(SegmentedDocument& doc, const std::string& text, bool scored) {
  if (text.empty()) return;
  if (!doc.empty() && !doc.back().special && doc.back().scored == scored) {
    doc.back().text += text;
  } else {
    doc.push_back({text, scored, false});
  }
}

// Appends a marker: one special token.
void mark(SegmentedDocument& doc, const char* marker, bool scored) {
  doc.push_back({marker, scored, true});
}

// A template's markers, each one special token (null: the template has
// none of that kind).
struct Markers {
  const char* begin;       // once, before the first turn
  const char* open;        // opens each turn; no other template writes it
  const char* header_end;  // ends a turn's role header
  const char* end;         // ends each turn
};

Markers markers_of(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
      return {nullptr, "<|im_start|>", nullptr, "<|im_end|>"};
    case ChatTemplate::Llama3:
      return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    case ChatTemplate::Gemma:
      return {"<bos>", "<start_of_turn>", nullptr, "<end_of_turn>"};
  }
  throw ValueError("chat template: unknown template");
}

// The unscored header that opens a turn of `role`.
void open_turn(SegmentedDocument& doc, ChatTemplate t, const std::string& role) {
  const Markers m = markers_of(t);
  mark(doc, m.open, false);
  switch (t) {
    case ChatTemplate::ChatML:
      put(doc, role + "\n", false);
      break;
    case ChatTemplate::Llama3:
      put(doc, role, false);
      mark(doc, m.header_end, false);
      put(doc, "\n\n", false);
      break;
    case ChatTemplate::Gemma:  // Gemma's assistant is the "model"
      put(doc, (role == "assistant" ? std::string("model") : role) + "\n", false);
      break;
  }
}

void check_role(const ChatMessage& m, size_t i) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant") {
    throw ValueError("message " + std::to_string(i) + " has role '" + m.role +
                     "' (expected system, user or assistant)");
  }
}

}  // namespace

ChatTemplate chat_template_from_string(const std::string& name) {
  if (name == "chatml") return ChatTemplate::ChatML;
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "gemma") return ChatTemplate::Gemma;
  throw ValueError("chat template '" + name + "' is not one Triad has (chatml, llama3, gemma)");
}

ChatTemplate chat_template_of_jinja(const std::string& jinja) {
  std::vector<ChatTemplate> found;
  for (const ChatTemplate t : {ChatTemplate::ChatML, ChatTemplate::Llama3, ChatTemplate::Gemma}) {
    if (jinja.find(markers_of(t).open) != std::string::npos) found.push_back(t);
  }
  if (found.size() != 1) {
    throw ValueError(std::string("the model's chat template writes ") +
                     (found.empty() ? "none of the built-in templates' markers"
                                    : "the markers of more than one built-in template") +
                     " (<|im_start|>: chatml, <|start_header_id|>: llama3, <start_of_turn>: "
                     "gemma); name one with --chat-template if its format is one of them");
  }
  return found.front();
}

namespace {

// What a model directory says about chatting: its chat template's Jinja
// text, where it was read, and tokenizer_config.json (empty if none).
struct ModelChatFiles {
  std::string jinja;
  std::string path;
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
};

ModelChatFiles read_model_chat_files(const std::string& tokenizer_path, const std::string& flag) {
  namespace fs = std::filesystem;
  if (tokenizer_path.empty()) {
    throw ValueError(flag +
                     " reads the model's tokenizer_config.json: give "
                     "--tokenizer (the model directory, or a tokenizer file inside it)");
  }
  const fs::path dir = io::is_directory(tokenizer_path) ? fs::path(tokenizer_path)
                                                        : fs::path(tokenizer_path).parent_path();
  ModelChatFiles f;
  f.path = (dir / "tokenizer_config.json").string();
  if (const std::optional<std::string> text = io::read_file(f.path)) {
    try {
      f.config = nlohmann::ordered_json::parse(*text);
    } catch (const nlohmann::json::exception& e) {
      throw IoError("'" + f.path + "' is not JSON: " + e.what());
    }
  } else if (io::path_exists(f.path)) {
    throw IoError("cannot read '" + f.path + "'");
  }
  const auto it = f.config.find("chat_template");
  if (it == f.config.end()) {
    // Newer models keep it in a file of its own.
    const std::string file = (dir / "chat_template.jinja").string();
    if (std::optional<std::string> text = io::read_file(file)) {
      f.jinja = std::move(*text);
      f.path = file;
    } else {
      throw IoError(flag + ": neither '" + f.path + "' holds a chat_template nor '" + file +
                    "' exists");
    }
  } else if (it->is_string()) {
    f.jinja = it->get<std::string>();
  } else if (it->is_array()) {
    // Several named templates: the one named "default".
    for (const auto& t : *it) {
      if (t.is_object() && t.contains("name") && t["name"] == "default" && t.contains("template") &&
          t["template"].is_string()) {
        f.jinja = t["template"].get<std::string>();
      }
    }
  }
  if (f.jinja.empty()) throw IoError("'" + f.path + "' has an empty or unreadable chat_template");
  return f;
}

}  // namespace

ChatTemplate chat_template_of_model(const std::string& tokenizer_path) {
  const ModelChatFiles f = read_model_chat_files(tokenizer_path, "--chat-template auto");
  try {
    return chat_template_of_jinja(f.jinja);
  } catch (const ValueError& e) {
    throw ValueError("'" + f.path + "': " + e.what());
  }
}

ChatTemplate resolve_chat_template(const std::string& name, const std::string& tokenizer_path) {
  return name == "auto" ? chat_template_of_model(tokenizer_path) : chat_template_from_string(name);
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
      return "chatml";
    case ChatTemplate::Llama3:
      return "llama3";
    case ChatTemplate::Gemma:
      return "gemma";
  }
  return "?";
}

void require_chat_markers(const Tokenizer& tokenizer, ChatTemplate t, const std::string& what) {
  const Markers m = markers_of(t);
  for (const char* marker : {m.begin, m.open, m.header_end, m.end}) {
    if (marker) require_special_token(tokenizer, marker, what);
  }
}

SegmentedDocument render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) check_role(messages[i], i);
  const Markers m = markers_of(t);
  SegmentedDocument doc;
  if (m.begin) mark(doc, m.begin, false);
  std::string system;  // gemma: the system text, put before the first user message's
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& msg = messages[i];
    if (t == ChatTemplate::Gemma && msg.role == "system") {
      if (i != 0 || messages.size() < 2 || messages[1].role != "user") {
        throw ValueError("message " + std::to_string(i) +
                         ": gemma has no system turn; a system message must come first and be "
                         "followed by a user message, whose text it is put before");
      }
      system = msg.content + "\n\n";
      continue;
    }
    const bool answer = msg.role == "assistant";
    open_turn(doc, t, msg.role);
    // LLaMA 3's and Gemma's templates trim the content; ChatML keeps it.
    put(doc, t == ChatTemplate::ChatML ? msg.content : system + strip_ascii_spaces(msg.content),
        answer);
    system.clear();
    mark(doc, m.end, answer);
    if (t != ChatTemplate::Llama3) put(doc, "\n", false);
  }
  return doc;
}

SegmentedDocument render_chat_prompt(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  SegmentedDocument doc = render_chat(t, messages);
  open_turn(doc, t, "assistant");
  return doc;
}

const char* chat_end_of_turn(ChatTemplate t) {
  return markers_of(t).end;
}

ModelChatTemplate::ModelChatTemplate(const std::string& jinja, nlohmann::ordered_json variables,
                                     std::vector<std::string> special_tokens, std::string origin)
    : program_(std::make_shared<const jinja::Template>(jinja)),
      variables_(std::move(variables)),
      special_(std::move(special_tokens)),
      origin_(std::move(origin)) {
  if (!variables_.is_object()) throw ValueError("a chat template's variables must be an object");
  // Longest first, so that a marker is never cut at a shorter one it starts with.
  std::sort(special_.begin(), special_.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() > b.size() : a < b;
  });
  special_.erase(std::remove(special_.begin(), special_.end(), std::string()), special_.end());
  for (const std::string& s : special_) starts_[static_cast<unsigned char>(s[0])] = true;
}

ModelChatTemplate ModelChatTemplate::load(const std::string& tokenizer_path,
                                          std::vector<std::string> special_tokens) {
  ModelChatFiles f = read_model_chat_files(tokenizer_path, "--chat-template model");
  // The token variables transformers passes: each a string, or an added
  // token's object holding its "content".
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    const auto it = f.config.find(key);
    if (it == f.config.end()) continue;
    if (it->is_string()) {
      vars[key] = *it;
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      vars[key] = (*it)["content"];
    }
  }
  try {
    return ModelChatTemplate(f.jinja, std::move(vars), std::move(special_tokens), f.path);
  } catch (const ValueError& e) {
    throw ValueError("'" + f.path + "': " + e.what());
  }
}

std::string ModelChatTemplate::variable(const std::string& name) const {
  const auto it = variables_.find(name);
  return it != variables_.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string ModelChatTemplate::text(const nlohmann::ordered_json& messages, bool generation_prompt,
                                    std::vector<std::pair<size_t, size_t>>* generation,
                                    const nlohmann::ordered_json& extra) const {
  nlohmann::ordered_json context = variables_;
  for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  context["messages"] = messages;
  context["add_generation_prompt"] = generation_prompt;
  return program_->render(context, generation);
}

std::vector<std::pair<size_t, size_t>> ModelChatTemplate::special_places(
    const std::string& text) const {
  std::vector<std::pair<size_t, size_t>> places;
  for (size_t i = 0; i < text.size();) {
    const std::string* hit = nullptr;
    if (starts_[static_cast<unsigned char>(text[i])]) {
      for (const std::string& s : special_) {
        if (text.compare(i, s.size(), s) == 0) {
          hit = &s;
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    places.emplace_back(i, i + hit->size());
    i += hit->size();
  }
  return places;
}

void ModelChatTemplate::cut(const std::string& text, bool scored, SegmentedDocument& doc) const {
  size_t plain = 0;  // where the text not yet put starts
  for (const auto& [b, e] : special_places(text)) {
    put(doc, text.substr(plain, b - plain), scored);
    doc.push_back({text.substr(b, e - b), scored, true});
    plain = e;
  }
  put(doc, text.substr(plain), scored);
}

namespace {

void check_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) throw ValueError("the messages are not a list");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      throw ValueError("message " + std::to_string(i) + " is not an object with a string \"role\"");
    }
  }
}

nlohmann::ordered_json first(const nlohmann::ordered_json& messages, size_t n) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < n; ++i) out.push_back(messages[i]);
  return out;
}

// Assistant message `i`'s part of `with` (the conversation up to and
// including it) past `before` (the conversation before it and the prompt
// for an answer): what writing the message adds, the whitespace after its
// end marker aside; none when it adds nothing. A program whose prompt is not
// where the conversation with the answer starts is refused.
std::optional<std::pair<size_t, size_t>> answer_span(const std::string& before,
                                                     const std::string& with, size_t i) {
  if (with.compare(0, before.size(), before) != 0) {
    throw ValueError("message " + std::to_string(i) +
                     " (assistant): the model's chat template writes the conversation before it "
                     "differently from the prompt it writes for an answer "
                     "(add_generation_prompt), so its answer cannot be told apart");
  }
  size_t end = with.size();
  while (end > before.size() && is_ascii_space(with[end - 1])) --end;
  if (end == before.size()) return std::nullopt;
  return std::make_pair(before.size(), end);
}

}  // namespace

SegmentedDocument ModelChatTemplate::pieces(const std::string& text,
                                            std::vector<std::pair<size_t, size_t>> scored) const {
  // As transformers' assistant mask scores every token a span touches: a
  // part that starts or ends inside a special token scores it whole (the
  // text is cut where the whole text's special tokens are, never inside
  // one), and parts that overlap or nest score their union.
  const auto places = special_places(text);
  auto around = [&](size_t at) {  // the special token `at` falls strictly inside, if any
    auto it =
        std::upper_bound(places.begin(), places.end(), at,
                         [](size_t a, const std::pair<size_t, size_t>& p) { return a < p.first; });
    if (it == places.begin()) return places.end();
    --it;
    return it->first < at && at < it->second ? it : places.end();
  };
  for (auto& [b, e] : scored) {
    if (const auto it = around(b); it != places.end()) b = it->first;
    if (const auto it = around(e); it != places.end()) e = it->second;
  }
  std::sort(scored.begin(), scored.end());
  SegmentedDocument doc;
  size_t at = 0;
  for (size_t i = 0; i < scored.size();) {
    const size_t b = scored[i].first;
    size_t e = scored[i].second;
    for (++i; i < scored.size() && scored[i].first <= e; ++i) e = std::max(e, scored[i].second);
    cut(text.substr(at, b - at), false, doc);
    cut(text.substr(b, e - b), true, doc);
    at = e;
  }
  cut(text.substr(at), false, doc);
  return doc;
}

SegmentedDocument ModelChatTemplate::render(const nlohmann::ordered_json& messages,
                                            const nlohmann::ordered_json& extra) const {
  if (!extra.is_object()) throw ValueError("a chat template's extra variables must be an object");
  check_messages(messages);
  std::vector<std::pair<size_t, size_t>> scored;
  const std::string whole = text(messages, false, &scored, extra);
  if (!program_->has_generation()) {
    // Turn by turn: an assistant message's part is what the program adds
    // to the conversation before it, prompt for an answer included, by
    // writing the message (the whitespace after its end marker aside).
    scored.clear();
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i]["role"] != "assistant") continue;
      const std::string before = text(first(messages, i), true, nullptr, extra);
      const std::string with = text(first(messages, i + 1), false, nullptr, extra);
      const auto span = answer_span(before, with, i);
      if (whole.compare(0, with.size(), with) != 0) {
        throw ValueError("message " + std::to_string(i) + " (assistant): " +
                         "the model's chat template writes this turn differently once "
                         "later messages follow (as Qwen3's drops earlier turns' thinking), "
                         "so it cannot be scored turn by turn in one document; use "
                         "--chat-turns each (a document per answer), --chat-template auto "
                         "or a built-in template");
      }
      if (span) scored.push_back(*span);
    }
  }
  return pieces(whole, scored);
}

std::vector<SegmentedDocument> ModelChatTemplate::render_each_turn(
    const nlohmann::ordered_json& messages, const nlohmann::ordered_json& extra) const {
  if (!extra.is_object()) throw ValueError("a chat template's extra variables must be an object");
  check_messages(messages);
  std::vector<SegmentedDocument> docs;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    std::vector<std::pair<size_t, size_t>> spans;
    const std::string with = text(first(messages, i + 1), false, &spans, extra);
    const std::string before = text(first(messages, i), true, nullptr, extra);
    const auto span = answer_span(before, with, i);
    // This answer's part: its {% generation %} blocks, or what writing it
    // adds to the prompt.
    std::vector<std::pair<size_t, size_t>> scored;
    if (program_->has_generation()) {
      for (const auto& [b, e] : spans)
        if (b >= before.size()) scored.emplace_back(b, e);
    } else if (span) {
      scored.push_back(*span);
    }
    docs.push_back(pieces(with, scored));
  }
  return docs;
}

SegmentedDocument ModelChatTemplate::render_prompt(const nlohmann::ordered_json& messages) const {
  check_messages(messages);
  SegmentedDocument doc;
  cut(text(messages, true, nullptr, nlohmann::ordered_json::object()), false, doc);
  return doc;
}

}  // namespace triad::data
