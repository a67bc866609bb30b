#include "triad/data/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "triad/core/error.h"

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

// Jinja's trim: leading and trailing whitespace off.
std::string trim(const std::string& s) {
  const char* space = " \t\n\r\f\v";
  const size_t first = s.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(space) - first + 1);
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

ChatTemplate chat_template_of_model(const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  if (tokenizer_path.empty()) {
    throw ValueError(
        "--chat-template auto reads the model's tokenizer_config.json: give "
        "--tokenizer (the model directory, or a tokenizer file inside it)");
  }
  const fs::path dir = fs::is_directory(tokenizer_path) ? fs::path(tokenizer_path)
                                                        : fs::path(tokenizer_path).parent_path();
  std::string path = (dir / "tokenizer_config.json").string();
  std::ifstream in(path);
  nlohmann::json config = nlohmann::json::object();
  if (in) {
    try {
      config = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw IoError("'" + path + "' is not JSON: " + e.what());
    }
  }
  const auto it = config.find("chat_template");
  std::string jinja;
  if (it == config.end()) {
    // Newer models keep it in a file of its own.
    const std::string file = (dir / "chat_template.jinja").string();
    std::ifstream t(file);
    if (t) {
      std::ostringstream text;
      text << t.rdbuf();
      jinja = text.str();
      path = file;
    } else {
      throw IoError("--chat-template auto: neither '" + path + "' holds a chat_template nor '" +
                    file + "' exists");
    }
  } else if (it->is_string()) {
    jinja = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {
    // Several named templates: the one named "default".
    for (const auto& t : *it) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
          t["template"].is_string()) {
        jinja = t["template"].get<std::string>();
      }
    }
  }
  if (jinja.empty()) throw IoError("'" + path + "' has an empty or unreadable chat_template");
  try {
    return chat_template_of_jinja(jinja);
  } catch (const ValueError& e) {
    throw ValueError("'" + path + "': " + e.what());
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
    put(doc, t == ChatTemplate::ChatML ? msg.content : system + trim(msg.content), answer);
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

}  // namespace triad::data
