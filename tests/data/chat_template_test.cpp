#include "triad/data/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/core/error.h"
#include "triad/data/tokenizer.h"

namespace triad::data {
namespace {

using triad::testing::expect_error;

// The built-in chat templates write each model family's chat format (as
// its published template lays it out), pieces scored where the assistant
// speaks.
TEST(ChatTemplates, WriteTheModelsFormatAndScoreTheAssistantOnly) {
  auto text = [](const SegmentedDocument& doc, bool scored) {
    std::string s;
    for (const auto& p : doc) {
      if (p.scored == scored) s += p.text;
    }
    return s;
  };
  auto all = [](const SegmentedDocument& doc) {
    std::string s;
    for (const auto& p : doc) s += p.text;
    return s;
  };
  const std::vector<ChatMessage> chat{{"system", "Be brief."},
                                      {"user", " Hi? "},
                                      {"assistant", " Hello. "},
                                      {"user", "Bye"},
                                      {"assistant", "Bye."}};
  const auto chatml = render_chat(ChatTemplate::ChatML, chat);
  EXPECT_EQ(all(chatml),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi? <|im_end|>\n"
            "<|im_start|>assistant\n Hello. <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\nBye.<|im_end|>\n");
  EXPECT_EQ(text(chatml, true), " Hello. <|im_end|>Bye.<|im_end|>");
  // Markers are special pieces; the text between them is not.
  for (const auto& p : chatml) {
    EXPECT_EQ(p.special, p.text == "<|im_start|>" || p.text == "<|im_end|>") << p.text;
  }
  const auto llama = render_chat(ChatTemplate::Llama3, chat);
  EXPECT_EQ(all(llama),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nBye.<|eot_id|>");
  EXPECT_EQ(text(llama, true), "Hello.<|eot_id|>Bye.<|eot_id|>");
  const auto gemma = render_chat(ChatTemplate::Gemma, chat);
  EXPECT_EQ(all(gemma),
            "<bos><start_of_turn>user\nBe brief.\n\nHi?<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
            "<start_of_turn>model\nBye.<end_of_turn>\n");
  EXPECT_EQ(text(gemma, true), "Hello.<end_of_turn>Bye.<end_of_turn>");
  // What generation is given: the conversation, then the assistant's header.
  const std::vector<ChatMessage> ask{{"user", "Hi"}};
  EXPECT_EQ(all(render_chat_prompt(ChatTemplate::ChatML, ask)),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(all(render_chat_prompt(ChatTemplate::Llama3, ask)),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(all(render_chat_prompt(ChatTemplate::Gemma, ask)),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(text(render_chat_prompt(ChatTemplate::Gemma, ask), true), "");
  EXPECT_STREQ(chat_end_of_turn(ChatTemplate::ChatML), "<|im_end|>");
  EXPECT_STREQ(chat_end_of_turn(ChatTemplate::Llama3), "<|eot_id|>");
  EXPECT_STREQ(chat_end_of_turn(ChatTemplate::Gemma), "<end_of_turn>");
  // The byte tokenizer holds none of the markers as special tokens.
  const auto bytes = make_tokenizer("", "", "");
  expect_error(
      [&] { require_chat_markers(*bytes, ChatTemplate::Llama3, "--chat-template llama3:"); },
      {"--chat-template llama3: '<|begin_of_text|>' is not a special token"});
  expect_error(
      [&] {
        render_chat(ChatTemplate::ChatML, {{"user", "a"}, {"tool", "b"}});
      },
      {"message 1 has role 'tool' (expected system, user or assistant)"});
  expect_error(
      [&] {
        render_chat(ChatTemplate::Gemma, {{"user", "a"}, {"system", "b"}});
      },
      {"message 1: gemma has no system turn"});
  expect_error([&] { chat_template_from_string("alpaca"); },
               {"chat template 'alpaca' is not one Triad has (chatml, llama3, gemma)"});
  EXPECT_EQ(chat_template_from_string("llama3"), ChatTemplate::Llama3);
  // Conversations from JSON lines: a list of messages under the key.
  std::istringstream in(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
      "\"content\": \"y\", \"weight\": 1}]}\n{\"messages\": [{\"role\": \"user\"}]}\n");
  DocumentReader reader(in, DocumentSplit::JsonLines, "messages", {"", ChatTemplate::ChatML});
  std::vector<SegmentedDocument> docs;
  EXPECT_TRUE(reader.next(docs, 1));
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(text(docs[0], true), "y<|im_end|>");
  expect_error([&] { reader.next(docs, 1); },
               {"JSON line 2: message 0 is not an object with a string \"role\" and a string "
                "\"content\""});
  std::istringstream flat("{\"messages\": \"hi\"}\n");
  DocumentReader r2(flat, DocumentSplit::JsonLines, "messages", {"", ChatTemplate::Llama3});
  expect_error([&] { r2.next(docs, 1); }, {"JSON line 1 has no list of messages \"messages\""});
}

// --chat-template auto: the built-in template a model's own is, by the
// markers its Jinja text writes, from tokenizer_config.json (a string, or
// the "default" of a list) or chat_template.jinja beside it.
TEST(ChatTemplates, AutoFindsTheModelsOwnTemplate) {
  EXPECT_EQ(chat_template_of_jinja("{{ '<|im_start|>' + m.role }}"), ChatTemplate::ChatML);
  EXPECT_EQ(chat_template_of_jinja("<|start_header_id|>{{ role }}<|end_header_id|>"),
            ChatTemplate::Llama3);
  EXPECT_EQ(chat_template_of_jinja("<start_of_turn>model"), ChatTemplate::Gemma);
  expect_error([] { chat_template_of_jinja("[INST] {{ content }} [/INST]"); },
               {"writes none of the built-in templates' markers"});
  expect_error([] { chat_template_of_jinja("<|im_start|><start_of_turn>"); },
               {"the markers of more than one built-in template"});
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name)) << text;
  };
  // A model directory, or a tokenizer file in it.
  write("tokenizer_config.json", R"({"chat_template": "<start_of_turn>user"})");
  write("tokenizer.json", "{}");
  EXPECT_EQ(chat_template_of_model(dir.path().string()), ChatTemplate::Gemma);
  EXPECT_EQ(resolve_chat_template("auto", dir.file("tokenizer.json")), ChatTemplate::Gemma);
  EXPECT_EQ(resolve_chat_template("llama3", ""), ChatTemplate::Llama3);
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "<|im_start|>"},
                              {"name": "default", "template": "<|start_header_id|>"}]})");
  EXPECT_EQ(chat_template_of_model(dir.path().string()), ChatTemplate::Llama3);
  // An entry whose name is no string is no "default" (was the JSON
  // library's type_error escaping).
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": 3, "template": "<|im_start|>"},
                              {"name": "default", "template": "<start_of_turn>"}]})");
  EXPECT_EQ(chat_template_of_model(dir.path().string()), ChatTemplate::Gemma);
  write("tokenizer_config.json", R"({"chat_template": [{"name": ["default"], "template": "x"}]})");
  expect_error([&] { chat_template_of_model(dir.path().string()); },
               {"has an empty or unreadable chat_template"});
  // No chat_template in the config: chat_template.jinja.
  write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  expect_error([&] { chat_template_of_model(dir.path().string()); },
               {"holds a chat_template nor", "chat_template.jinja' exists"});
  write("chat_template.jinja", "{% for m in messages %}<|im_start|>{% endfor %}");
  EXPECT_EQ(chat_template_of_model(dir.path().string()), ChatTemplate::ChatML);
  write("chat_template.jinja", "[INST]");
  expect_error([&] { chat_template_of_model(dir.path().string()); },
               {"chat_template.jinja': the model's chat template writes none"});
  expect_error([] { chat_template_of_model(""); }, {"give --tokenizer"});
}

// --chat-template model: the model's own Jinja program. Programs that
// write the built-in templates' formats give exactly the built-in
// templates' pieces — the same text, the same special tokens, the same
// parts scored — found turn by turn.
std::vector<std::string> markers() {
  return {"<|im_start|>",      "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
          "<|end_header_id|>", "<|eot_id|>", "<|endoftext|>"};
}

const char* kChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";
const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}";

nlohmann::ordered_json as_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

void expect_same(const SegmentedDocument& got, const SegmentedDocument& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].text, want[i].text) << i;
    EXPECT_EQ(got[i].scored, want[i].scored) << i << " " << got[i].text;
    EXPECT_EQ(got[i].special, want[i].special) << i << " " << got[i].text;
  }
}

TEST(ModelChatTemplate, WritesWhatTheBuiltInTemplatesWriteForTheirPrograms) {
  const std::vector<ChatMessage> chat{{"system", "Be brief."},
                                      {"user", " Hi? "},
                                      {"assistant", " Hello.\n "},
                                      {"user", "Bye"},
                                      {"assistant", "Bye."}};
  const ModelChatTemplate chatml(kChatMl, nlohmann::ordered_json::object(), markers());
  expect_same(chatml.render(as_json(chat)), render_chat(ChatTemplate::ChatML, chat));
  expect_same(chatml.render_prompt(as_json({chat[0], chat[1]})),
              render_chat_prompt(ChatTemplate::ChatML, {chat[0], chat[1]}));
  const ModelChatTemplate llama(kLlama3Template, {{"bos_token", "<|begin_of_text|>"}}, markers());
  expect_same(llama.render(as_json(chat)), render_chat(ChatTemplate::Llama3, chat));
  expect_same(llama.render_prompt(as_json({chat[1]})),
              render_chat_prompt(ChatTemplate::Llama3, {chat[1]}));
}

// What only the program knows is written too: a default system message,
// and fields of a message beyond its role and content.
TEST(ModelChatTemplate, RunsWhatTheProgramSays) {
  const ModelChatTemplate t(
      "{% if messages[0].role != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n"
      "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
      "{% for c in m.tool_calls %}<tool_call>{{ c | tojson }}</tool_call>{% endfor %}"
      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      nlohmann::ordered_json::object(), markers());
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": "", "tool_calls": [{"name": "w", "arguments": {"c": "P"}}]}])");
  std::string read, scored;
  for (const auto& p : t.render(messages)) (p.scored ? scored : read) += p.text;
  EXPECT_EQ(read,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWeather?"
            "<|im_end|>\n<|im_start|>assistant\n\n");
  EXPECT_EQ(scored, R"(<tool_call>{"name": "w", "arguments": {"c": "P"}}</tool_call><|im_end|>)");
}

// ChatML whose assistant turns are {% generation %} blocks.
const char* kMarkedChatMl =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
    "{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}"
    "<|im_end|>{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}";

// {% generation %} blocks (transformers' assistant mask) say what is
// scored; a program that writes a turn differently once others follow
// cannot be scored turn by turn.
TEST(ModelChatTemplate, GenerationBlocksOrTurnByTurn) {
  const ModelChatTemplate marked(kMarkedChatMl, nlohmann::ordered_json::object(), markers());
  const auto messages =
      as_json({{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}});
  std::string scored;
  for (const auto& p : marked.render(messages)) {
    if (p.scored) scored += p.text + "|";
  }
  EXPECT_EQ(scored, "b|<|im_end|>|d|<|im_end|>|");
  const ModelChatTemplate unstable(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and "
      "loop.last %}<think></think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      nlohmann::ordered_json::object(), markers());
  std::string last;  // one turn is fine
  for (const auto& p : unstable.render(as_json({{"user", "a"}, {"assistant", "b"}}))) {
    if (p.scored) last += p.text;
  }
  EXPECT_EQ(last, "<think></think>b<|im_end|>");
  expect_error([&] { unstable.render(messages); },
               {"message 1 (assistant)", "differently once later messages follow"});
  expect_error([&] { unstable.render(nlohmann::ordered_json::parse(R"([{"content": "x"}])")); },
               {"message 0 is not an object with a string \"role\""});
}

// A {% generation %} block that starts or ends inside a special token
// scores the token whole, never cutting it into text (transformers' mask
// takes every token a span touches), and blocks that nest or overlap score
// their union.
TEST(ModelChatTemplate, GenerationBlocksScoreWholeSpecialTokens) {
  const ModelChatTemplate cutting(
      "<|im_start|>user\nq<|im{% generation %}_end|>a{% endgeneration %}"
      "{% generation %}{% generation %}b{% endgeneration %}c<|im_{% endgeneration %}end|>d",
      nlohmann::ordered_json::object(), markers());
  std::string pieces;
  for (const auto& p : cutting.render(as_json({{"user", "q"}}))) {
    pieces += std::string(p.scored ? "+" : "-") + (p.special ? "[" + p.text + "]" : p.text) + " ";
  }
  EXPECT_EQ(pieces, "-[<|im_start|>] -user\nq +[<|im_end|>] +abc +[<|im_end|>] -d ");
}

// A document per answer: the conversation up to it as the program writes
// one that ends there, that answer alone scored. A program that writes
// earlier turns differently (thinking kept for the latest answer only, as
// Qwen3's) trains each answer as the model writes it when it is the latest.
TEST(ModelChatTemplate, EachTurnIsADocumentOfTheConversationUpToIt) {
  const ModelChatTemplate thinking(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and "
      "loop.last %}<think>{{ m.thought }}</think>{% endif %}{{ m.content }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      nlohmann::ordered_json::object(), markers());
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "thought": "x"},
          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "thought": "y"},
          {"role": "user", "content": "e"}])");
  const std::vector<SegmentedDocument> docs = thinking.render_each_turn(messages);
  ASSERT_EQ(docs.size(), 2u);
  std::vector<std::string> read(2), scored(2);
  for (size_t d = 0; d < 2; ++d)
    for (const auto& p : docs[d]) (p.scored ? scored[d] : read[d]) += p.text;
  EXPECT_EQ(read[0], "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n\n");
  EXPECT_EQ(scored[0], "<think>x</think>b<|im_end|>");
  EXPECT_EQ(read[1],
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
            "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n\n");
  EXPECT_EQ(scored[1], "<think>y</think>d<|im_end|>");
  // Generation blocks: the last answer's only.
  const ModelChatTemplate marked(kMarkedChatMl, nlohmann::ordered_json::object(), markers());
  const auto last = marked.render_each_turn(messages).back();
  std::string marked_scored;
  for (const auto& p : last)
    if (p.scored) marked_scored += p.text + "|";
  EXPECT_EQ(marked_scored, "d|<|im_end|>|");
  EXPECT_TRUE(marked.render_each_turn(as_json({{"user", "a"}})).empty());
  // The reader: one document per answer, and the option needs the model's
  // template.
  std::istringstream in("{\"messages\": " + messages.dump() + "}\n");
  DocumentLabels labels;
  labels.model_chat = std::make_shared<const ModelChatTemplate>(thinking);
  labels.each_turn = true;
  DocumentReader reader(in, DocumentSplit::JsonLines, "messages", labels);
  std::vector<SegmentedDocument> batch;
  reader.next(batch, 1 << 20);
  EXPECT_EQ(batch.size(), 2u);
  std::istringstream none("");
  DocumentLabels alone;
  alone.each_turn = true;
  expect_error([&] { DocumentReader(none, DocumentSplit::JsonLines, "messages", alone); },
               {"--chat-turns each", "--chat-template model"});
}

// Loading: the program and the token variables beside it; a DocumentReader
// hands each line's messages to it whole.
TEST(ModelChatTemplate, LoadsTheModelsProgramAndTokens) {
  testing::TempDir dir;
  std::ofstream(dir.file("tokenizer_config.json"))
      << R"({"chat_template": "{{ bos_token }}{% if tools %}[{{ tools | map(attribute='name') | join(',') }}]{% endif %}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
             "bos_token": {"content": "<|begin_of_text|>", "special": true}, "eos_token": "<|eot_id|>"})";
  const ModelChatTemplate t = ModelChatTemplate::load(dir.path().string(), markers());
  EXPECT_EQ(t.variable("eos_token"), "<|eot_id|>");
  EXPECT_EQ(t.variable("pad_token"), "");
  std::istringstream in(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
      "\"assistant\", \"content\": \"y\"}]}\n{\"messages\": {}}\n");
  DocumentLabels labels;
  labels.model_chat = std::make_shared<const ModelChatTemplate>(t);
  DocumentReader reader(in, DocumentSplit::JsonLines, "messages", labels);
  std::vector<SegmentedDocument> docs;
  EXPECT_TRUE(reader.next(docs, 1));
  ASSERT_EQ(docs.size(), 1u);
  ASSERT_EQ(docs[0].size(), 5u);
  EXPECT_TRUE(docs[0][0].special);
  EXPECT_EQ(docs[0][3].text, "y");
  EXPECT_TRUE(docs[0][3].scored && docs[0][4].scored && docs[0][4].special);
  expect_error([&] { reader.next(docs, 1); }, {"JSON line 2 has no list of messages"});
  // A line's tools go to the program beside its messages.
  std::istringstream with_tools(
      R"({"tools": [{"name": "calc"}, {"name": "web"}], "messages": [{"role": "user", "content": "x"}]})"
      "\n{\"tools\": 3, \"messages\": []}\n");
  DocumentReader tooled(with_tools, DocumentSplit::JsonLines, "messages", labels);
  docs.clear();
  EXPECT_TRUE(tooled.next(docs, 1));
  ASSERT_EQ(docs.size(), 1u);
  ASSERT_GE(docs[0].size(), 2u);
  EXPECT_EQ(docs[0][1].text, "[calc,web]x");
  expect_error([&] { tooled.next(docs, 1); }, {"JSON line 2: \"tools\" is not a list"});
  std::ofstream(dir.file("tokenizer_config.json")) << R"({"chat_template": "{% if x %}"})";
  expect_error([&] { ModelChatTemplate::load(dir.path().string(), markers()); },
               {"tokenizer_config.json': chat template, line 1", "endif"});
  labels.chat = ChatTemplate::ChatML;
  std::istringstream none("");
  expect_error([&] { DocumentReader(none, DocumentSplit::JsonLines, "messages", labels); },
               {"not both"});
}

}  // namespace
}  // namespace triad::data
