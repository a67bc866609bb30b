// triad-generate: continues a prompt with a trained model.
//   triad-generate --run out/gpt_tiny --prompt "The cat"
//   (out/gpt_tiny/{config.yaml,model.safetensors})
//   triad-generate --config my.yaml --weights model.safetensors --prompt "Hello"
//   triad-generate --checkpoint out/ckpt --prompt "Hello"   (its latest checkpoint)
//       --vocab vocab.json --merges merges.txt --tokens 100 --temperature 0.8 --top-k 40
// Byte-level tokens unless --vocab/--merges give GPT-2's BPE, or --tokenizer a Hugging
// Face tokenizer.json (LLaMA 3's, Qwen's).
//   triad-generate --run out/chat --tokenizer /models/Qwen3-0.6B --chat-template chatml
//       --prompt "What is 2+2?"      (a fine-tuned chat model's answer, up to its end of turn)
//   triad-generate ... --prompts questions.jsonl > answers.jsonl   (one reply per line)
//   triad-generate ... --repetition-penalty 1.2 --min-p 0.05 --stop $'\n\n'   (up to a blank line)
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include <unistd.h>

#include "triad/core/error.h"
#include "triad/data/chat_template.h"
#include "triad/data/text_stream.h"
#include "triad/data/tokenizer.h"
#include "triad/io/hf_config.h"
#include "triad/nn/generate.h"
#include "triad/train/config.h"

#include "chat_options.h"
#include "cli_checks.h"
#include "model_source.h"
#include "tokenizer_options.h"

int main(int argc, char** argv) {
  CLI::App app{"Continue a prompt with a GPT trained by Triad"};
  std::string prompt, device;
  triad::examples::ModelSource source;
  triad::nn::SamplingOptions o;
  o.max_new_tokens = 200;
  o.temperature = 0.8;
  o.top_k = 40;
  o.seed = 1;
  source.add_options(app);
  std::string prompts_file;
  auto* one = app.add_option("--prompt", prompt, "text to continue");
  auto* many =
      app.add_option("--prompts", prompts_file,
                     "JSON lines of {\"prompt\": ... [, \"system\": ...]}: answered "
                     "--batch at a time (prompts of similar length together), one JSON line "
                     "{\"prompt\", \"response\"} each on stdout, in the file's order");
  bool interactive = false;
  auto* chat_mode = app.add_flag(
      "-i,--interactive", interactive,
      "read a user's turn per line of stdin and answer each (with --chat-template, one "
      "conversation: every turn so far is the prompt; \"/reset\" starts a new one)");
  one->excludes(many);
  many->excludes(one);
  chat_mode->excludes(one);
  chat_mode->excludes(many);
  bool no_stream = false;
  app.add_flag("--no-stream", no_stream,
               "with --prompt or -i: write the reply once it is complete (by default it is "
               "written as it is generated)");
  int64_t batch_size = 8;
  app.add_option("--batch", batch_size,
                 "with --prompts: answer this many prompts together (one batched decoding step "
                 "per token; each reply is what the prompt gets alone)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tokens", o.max_new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", o.temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-k", o.top_k, "sample among the k most likely (0: all)")
      ->capture_default_str();
  app.add_option("--top-p", o.top_p, "sample from the smallest set holding this probability")
      ->capture_default_str();
  app.add_option("--min-p", o.min_p,
                 "sample only tokens at least this share as likely as the most likely (0: all)")
      ->capture_default_str();
  app.add_option("--repetition-penalty", o.repetition_penalty,
                 "divide the positive logits (multiply the negative) of tokens in the prompt or "
                 "the output by this (1: none; 1.1-1.3 discourages repeats)")
      ->capture_default_str();
  app.add_option("--frequency-penalty", o.frequency_penalty,
                 "subtract this times its count so far in the output from a token's logit")
      ->capture_default_str();
  app.add_option("--presence-penalty", o.presence_penalty,
                 "subtract this from the logit of every token the output holds")
      ->capture_default_str();
  std::vector<std::string> stops;
  app.add_option("--stop", stops,
                 "stop when the reply's text holds this, and print the text before it "
                 "(repeatable)");
  app.add_option("--seed", o.seed, "sampling seed")
      ->check(triad::examples::unsigned_integer())
      ->capture_default_str();
  std::vector<int64_t> stop_tokens;  // none given: the defaults below
  app.add_option("--stop-token", stop_tokens,
                 "stop when the model produces this token, and do not print it (repeatable; "
                 "default: the config's data.eod_token, the end of a document, with a chat "
                 "template its end of turn, and the eos_token_id of a generation_config.json "
                 "beside --tokenizer; -1: never)");
  app.add_option("--device", device, "cpu, cuda or cuda:N (default: the config's)");
  triad::examples::TokenizerOptions tokens;
  tokens.add_options(app,
                     "a special token put before the prompt, by its text (LLaMA 2's <s>: "
                     "SentencePiece models do not add it themselves)");
  std::string chat_template, system;
  app.add_option("--chat-template", chat_template,
                 "the prompt is a user's message to a chat model (chatml, llama3, gemma, or auto: "
                 "the --tokenizer model's; model: its own Jinja program; as triad-tokenize "
                 "--chat-template): the model writes the assistant's turn, which is printed "
                 "alone, and stops at the template's end of turn (model: at the model's "
                 "eos_token)");
  app.add_option("--system", system, "with --chat-template: a system message before the prompt");
  bool no_cache = false;
  app.add_flag("--no-kv-cache", no_cache,
               "run the model over the whole window for every token (for comparison)");
  bool timing = false;
  app.add_flag("--timing", timing, "report tokens per second on stderr");
  bool own_sampling = false;
  app.add_flag("--ignore-generation-config", own_sampling,
               "sample with the defaults above even where a generation_config.json beside "
               "--tokenizer says how to choose tokens (its eos_token_id still ends the reply)");
  CLI11_PARSE(app, argc, argv);
  o.kv_cache = !no_cache;
  // The text alone on stdout (--prompts' JSON lines are read by programs);
  // what the library logs (the attention kernel it chose, say) and errors
  // on stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("triad-generate"));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  return triad::examples::report_errors([&]() -> int {
    if (one->count() == 0 && many->count() == 0 && !interactive) {
      throw triad::ValueError("give --prompt TEXT, --prompts FILE or --interactive");
    }
    const triad::train::Config config = source.resolve();
    const std::unique_ptr<triad::data::Tokenizer> tok = tokens.make_for(config.model.vocab_size);
    o.vocab_limit = tok->vocab_size();  // never an id the tokenizer cannot print
    for (const int32_t id : tok->missing_ids()) o.suppress_tokens.push_back(id);
    // A chat (either kind of template): the prompt is the template's text
    // and the reply the assistant's turn alone.
    const triad::examples::ChatPrompts chat(chat_template, tokens, *tok);
    const bool chatting = chat.active();
    if (!system.empty() && !chatting) throw triad::ValueError("--system needs --chat-template");
    const int64_t default_stop = chatting ? chat.end_of_turn() : config.model.eod_token;
    for (const auto& s : stops) {
      if (s.empty()) throw triad::ValueError("--stop: a stop string must not be empty");
    }
    // The model's generation_config.json (beside --tokenizer): its end
    // tokens, and how transformers' generate() would choose tokens with it
    // (greedy unless do_sample is true) for every setting no flag gives.
    const triad::io::HfGenerationConfig generation =
        tokens.tokenizer_path().empty()
            ? triad::io::HfGenerationConfig{}
            : triad::io::load_hf_generation_config(tokens.tokenizer_path());
    if (generation.names_sampling() && !own_sampling) {
      const auto s = generation.sampling();
      std::string taken;
      const auto take = [&](const char* flag, auto& to, auto value, const char* key) {
        if (app.count(flag) > 0) return;
        to = value;
        taken += fmt::format("{}{} {}", taken.empty() ? "" : ", ", key, value);
      };
      take("--temperature", o.temperature, s.temperature, "temperature");
      if (o.temperature > 0) {
        take("--top-k", o.top_k, s.top_k, "top_k");
        take("--top-p", o.top_p, s.top_p, "top_p");
        take("--min-p", o.min_p, s.min_p, "min_p");
      }
      take("--repetition-penalty", o.repetition_penalty, s.repetition_penalty,
           "repetition_penalty");
      if (!taken.empty()) {
        spdlog::info(
            "sampling as {} says ({}): {} (flags override; --ignore-generation-config: none of "
            "it)",
            generation.file,
            generation.do_sample.value_or(false) ? "do_sample true" : "greedy: no do_sample true",
            taken);
      }
    }
    const auto in_vocabulary = [&](int64_t id, const std::string& what) {
      if (id < 0 || id >= tok->vocab_size()) {
        throw triad::ValueError(what + " " + std::to_string(id) +
                                " is outside the tokenizer's vocabulary [0, " +
                                std::to_string(tok->vocab_size()) + ")" +
                                (what == "--stop-token" ? " (-1 alone: never stop early)" : ""));
      }
    };
    if (!stop_tokens.empty()) {
      // Given: exactly these, or -1 alone for none.
      if (stop_tokens != std::vector<int64_t>{-1}) {
        for (const int64_t id : stop_tokens) {
          in_vocabulary(id, "--stop-token");
          if (!o.is_stop(id)) o.stop_tokens.push_back(id);
        }
      }
    } else {
      // The end of a document or of a turn, and what the model's
      // generation_config.json ends a text at (transformers' generate()
      // stops at each: LLaMA 3's <|eot_id|> and <|end_of_text|>, Gemma's
      // <end_of_turn> and <eos>).
      if (default_stop >= 0) {
        in_vocabulary(default_stop, chatting ? "the end-of-turn token" : "data.eod_token");
        o.stop_tokens.push_back(default_stop);
      }
      if (!tokens.tokenizer_path().empty()) {
        const std::vector<int64_t>& ids = generation.eos_token_ids;
        for (const int64_t id : ids) {
          in_vocabulary(id, "generation_config.json's eos_token_id");
          if (!o.is_stop(id)) o.stop_tokens.push_back(id);
        }
        if (!ids.empty()) {
          // Each by its text where it is a special token.
          std::string names;
          for (const int64_t id : o.stop_tokens) {
            std::string name = std::to_string(id);
            for (const std::string& text : tok->special_tokens()) {
              if (tok->special_token(text) == id) name = text + " (" + name + ")";
            }
            names += (names.empty() ? "" : ", ") + name;
          }
          spdlog::info("stop tokens: {} (with generation_config.json's eos_token_id)", names);
        }
      }
      if (chat.is_model() && o.stop_tokens.empty()) {
        spdlog::warn(
            "--chat-template model: neither tokenizer_config.json's eos_token nor a "
            "generation_config.json names the model's end token; give --stop-token");
      }
    }
    // A chat's reply is the assistant's turn alone (the prompt is the
    // template's text); a plain continuation is what it adds to the prompt.
    // With --stop, the text before the first stop string.
    auto full_reply_text = [&](const std::vector<int32_t>& ids, const std::vector<int32_t>& out) {
      return chatting ? tok->decode(out) : triad::data::continuation_text(*tok, ids, out);
    };
    auto reply_text = [&](const std::vector<int32_t>& ids, const std::vector<int32_t>& out) {
      std::string text = full_reply_text(ids, out);
      size_t cut = std::string::npos;
      for (const auto& s : stops) cut = std::min(cut, text.find(s));
      return cut == std::string::npos ? text : text.substr(0, cut);
    };
    // A conversation so far as a chat model's prompt (the template's text,
    // opening the assistant's turn), or a plain prompt (the user's text).
    auto encode_messages = [&](const std::vector<triad::data::ChatMessage>& messages) {
      std::vector<int32_t> ids;
      if (tokens.has_bos()) ids.push_back(static_cast<int32_t>(tokens.bos(*tok)));
      if (chatting) {
        for (const int32_t id : chat.encode(*tok, chat.render(messages))) ids.push_back(id);
      } else {
        for (const int32_t id : tok->encode(messages.back().content)) ids.push_back(id);
      }
      return ids;
    };
    // One question's prompt (with its system message).
    auto encode = [&](const std::string& text, const std::string& sys) {
      std::vector<triad::data::ChatMessage> messages;
      if (!sys.empty()) messages.push_back({"system", sys});
      messages.push_back({"user", text});
      return encode_messages(messages);
    };
    // --prompts: every line read, checked and tokenized before the model is
    // loaded (a bad line costs no generation), answered --batch at a time.
    struct Question {
      std::string text, sys;
      std::vector<int32_t> ids;
    };
    std::vector<Question> questions;
    if (many->count() > 0) {
      std::ifstream in(prompts_file);
      if (!in) throw triad::IoError("--prompts: cannot open '" + prompts_file + "'");
      int64_t line_no = 0;
      for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where =
            "--prompts '" + prompts_file + "' line " + std::to_string(line_no);
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          throw triad::ValueError(where + " is not a JSON object");
        }
        if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
          throw triad::ValueError(where + " has no string \"prompt\"");
        }
        std::string sys = system;
        if (j.contains("system")) {
          if (!chatting) throw triad::ValueError(where + ": \"system\" needs --chat-template");
          if (!j["system"].is_string())
            throw triad::ValueError(where + ": \"system\" is not a string");
          sys = j["system"].get<std::string>();
        }
        Question q{j["prompt"].get<std::string>(), sys, {}};
        q.ids = encode(q.text, q.sys);
        if (q.ids.empty()) throw triad::ValueError(where + ": the prompt has no tokens");
        questions.push_back(std::move(q));
      }
    }
    triad::nn::GptConfig model_cfg = config.model;
    model_cfg.dropout = 0;
    // Bad sampling options are named before the weights are read or
    // anything is printed.
    triad::nn::check_sampling(model_cfg, o);
    // Not initialised: the weights (all of them, or an error) are read in.
    triad::nn::Gpt model(model_cfg, config.train.seed, triad::DType::F32,
                         triad::nn::Gpt::Init::None);
    // One block of the file, or of the checkpoint's joined weights, at a time.
    source.read(model_cfg, [&](triad::nn::StateDict&& part) {
      model.load_state_dict(part, /*strict=*/false);
    });
    model.to(triad::device_from_string(device.empty() ? config.device : device));
    // The replies to prompts (their ids), generated together: the new ids
    // of each, less the stop token.
    // With a session (a conversation), one prompt continued over the cache
    // the turns before left.
    // `live`: one prompt's reply written to stdout as it is generated.
    std::string pending_timing;  // a live reply's timing line, for after it
    auto answer = [&](const std::vector<std::vector<int32_t>>& ids,
                      triad::nn::GenerationSession* session = nullptr,
                      triad::data::TextStream* live = nullptr) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::vector<int64_t>> prompts;
      for (const auto& p : ids) prompts.emplace_back(p.begin(), p.end());
      // A reply whose text so far holds a stop string is done (cut below).
      std::function<bool(size_t, const std::vector<int64_t>&)> stop_when;
      if (!stops.empty()) {
        stop_when = [&](size_t i, const std::vector<int64_t>& so_far) {
          const std::string text =
              full_reply_text(ids[i], std::vector<int32_t>(so_far.begin(), so_far.end()));
          for (const auto& s : stops) {
            if (text.find(s) != std::string::npos) return true;
          }
          return false;
        };
      }
      std::vector<std::vector<int64_t>> outs;
      if (session || live) {
        triad::nn::SamplingOptions one = o;
        one.stop_when = [&](const std::vector<int64_t>& so_far) {
          if (live) {
            // The reply's text so far (without the stop token) less what is not final yet.
            std::vector<int32_t> out(so_far.begin(), so_far.end());
            if (!out.empty() && o.is_stop(out.back())) out.pop_back();
            const std::string piece = live->update(full_reply_text(ids.front(), out));
            if (!piece.empty()) {
              std::fwrite(piece.data(), 1, piece.size(), stdout);
              std::fflush(stdout);
            }
          }
          return stop_when && stop_when(0, so_far);
        };
        outs.push_back(session ? triad::nn::generate(model, prompts.front(), one, *session)
                               : triad::nn::generate(model, prompts.front(), one));
      } else {
        outs = triad::nn::generate_batch(model, prompts, o, stop_when);
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      size_t made = 0, read = 0;
      for (size_t i = 0; i < outs.size(); ++i) made += outs[i].size(), read += ids[i].size();
      if (timing) {
        std::string how = o.kv_cache ? "key/value cache" : "no cache";
        if (outs.size() > 1) {
          const auto [shortest, longest] =
              std::minmax_element(ids.begin(), ids.end(),
                                  [](const auto& a, const auto& b) { return a.size() < b.size(); });
          how += ", " + std::to_string(outs.size()) + " prompts together of " +
                 std::to_string(shortest->size()) + "-" + std::to_string(longest->size()) +
                 " tokens";
        }
        if (session && session->reused > 0)
          how += ", " + std::to_string(session->reused) + " prompt tokens from the last turn";
        char line[512];
        std::snprintf(line, sizeof(line), "%zu tokens (%s %zu) in %.3f s: %.1f tokens/s (%s)\n",
                      made, outs.size() == 1 ? "prompt" : "prompts", read, secs,
                      static_cast<double>(made) / secs, how.c_str());
        if (live) {
          pending_timing = line;
        } else {
          std::fputs(line, stderr);
        }
      }
      std::vector<std::vector<int32_t>> replies;
      for (auto out : outs) {
        if (!out.empty() && o.is_stop(out.back())) out.pop_back();  // the end, not text
        replies.emplace_back(out.begin(), out.end());
      }
      return replies;
    };
    // One prompt's reply on stdout after `lead` (a plain prompt's own text),
    // written as it is generated unless --no-stream, then a newline (and the
    // timing line on stderr). Returns the reply's text.
    auto reply_to = [&](const std::vector<int32_t>& ids, const std::string& lead,
                        triad::nn::GenerationSession* session) {
      std::fwrite(lead.data(), 1, lead.size(), stdout);
      std::fflush(stdout);
      triad::data::TextStream live(stops);
      const auto out = answer({ids}, session, no_stream ? nullptr : &live).front();
      const std::string reply = reply_text(ids, out);
      const std::string rest = no_stream ? reply : live.finish(reply);
      std::printf("%s\n", rest.c_str());
      std::fflush(stdout);
      std::fputs(pending_timing.c_str(), stderr);
      pending_timing.clear();
      return reply;
    };
    if (interactive) {
      // A conversation, a user's turn per line of stdin: with a chat
      // template every turn so far is the prompt; without one each line is
      // a prompt of its own. "/reset" starts a new conversation. The
      // key/value cache stays from turn to turn: a turn decodes only what
      // follows the tokens the last prompt and reply left in it.
      const bool terminal = isatty(fileno(stdin)) != 0;
      triad::nn::GenerationSession session;
      std::vector<triad::data::ChatMessage> history;
      if (!system.empty()) history.push_back({"system", system});
      const size_t opening = history.size();
      for (std::string line;;) {
        if (terminal) std::fprintf(stderr, "> ");
        if (!std::getline(std::cin, line)) break;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        if (line == "/reset") {
          history.resize(opening);
          if (terminal) std::fprintf(stderr, "(a new conversation)\n");
          continue;
        }
        history.push_back({"user", line});
        const std::vector<std::vector<int32_t>> ids{encode_messages(history)};
        if (static_cast<int64_t>(ids.front().size()) >= model_cfg.seq_len) {
          spdlog::warn(
              "the conversation is {} tokens, the model's window {}: it reads the last {} "
              "(/reset starts a new one)",
              ids.front().size(), model_cfg.seq_len, model_cfg.seq_len);
        }
        const std::string reply = reply_to(ids.front(), chatting ? "" : line, &session);
        if (chatting) {
          history.push_back({"assistant", reply});
        } else {
          history.pop_back();
        }
      }
      return 0;
    }
    if (many->count() == 0) {
      reply_to(encode(prompt, system), chatting ? "" : prompt, nullptr);
      return 0;
    }
    // --batch prompts at a time, shortest first, so that each batch holds
    // prompts of about one length (a left-padded cache pads each row to the
    // batch's longest prompt); the replies are written in the file's order,
    // each as soon as every line before it has been written.
    std::vector<size_t> order(questions.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return questions[a].ids.size() < questions[b].ids.size();
    });
    std::vector<std::optional<std::string>> lines(questions.size());
    size_t written = 0;
    for (size_t first = 0; first < order.size(); first += static_cast<size_t>(batch_size)) {
      const size_t last = std::min(order.size(), first + static_cast<size_t>(batch_size));
      std::vector<std::vector<int32_t>> ids;
      for (size_t k = first; k < last; ++k) ids.push_back(questions[order[k]].ids);
      const auto replies = answer(ids);
      for (size_t k = first; k < last; ++k) {
        const Question& q = questions[order[k]];
        nlohmann::json row{{"prompt", q.text}, {"response", reply_text(q.ids, replies[k - first])}};
        if (!q.sys.empty()) row["system"] = q.sys;
        // A reply cut inside a character (a byte-level model's tokens are
        // bytes) shows U+FFFD for its broken bytes, not an error.
        lines[order[k]] = row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      }
      for (; written < lines.size() && lines[written]; ++written) {
        std::printf("%s\n", lines[written]->c_str());
        lines[written].reset();
      }
      std::fflush(stdout);
    }
    return 0;
  });
}
