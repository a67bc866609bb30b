// triad-eval: scores a trained model on multiple-choice questions, on
// LAMBADA's last words, on math word problems answered by generation
// (GSM8K) and on the perplexity of text.
//   triad-eval --run out/gpt2 --vocab vocab.json --merges merges.txt
//       --choices hellaswag_val.jsonl          (accuracy: acc, acc_norm, acc_per_token)
//   triad-eval --checkpoint out/ckpt --tokenizer /models/Llama-3.2-1B --bos-token
//   "<|begin_of_text|>"
//       --text wiki.test.txt --stride 512      (loss, perplexity, bits per byte)
//   triad-eval --run out/gpt2 --vocab vocab.json --merges merges.txt
//       --lambada lambada_test.jsonl           (last-word accuracy, perplexity)
//   triad-eval --run out/sft --tokenizer /models/Qwen2.5-0.5B --fewshot 5
//       --gsm8k test.jsonl --gsm8k-fewshot-from train.jsonl   (exact match)
//       [--fewshot-seed 1234] [--chat-template model --fewshot-as-multiturn]
//                                              (the harness's draw; a chat model's turns)
// The model is given as to triad-generate (--run, --config with --weights,
// or --checkpoint); tokens are bytes unless --vocab/--merges or --tokenizer
// name a tokenizer. docs/evaluation.md says how each number is defined.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "triad/core/error.h"
#include "triad/data/last_word.h"
#include "triad/data/math_problems.h"
#include "triad/data/multiple_choice.h"
#include "triad/data/text_input.h"
#include "triad/data/tokenizer.h"
#include "triad/nn/evaluate.h"
#include "triad/train/config.h"
#include "triad/train/gsm8k_eval.h"

#include "chat_options.h"
#include "cli_checks.h"
#include "model_source.h"
#include "tokenizer_options.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> widen(const std::vector<int32_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Evaluate a GPT trained by Triad: multiple-choice accuracy, LAMBADA, math word problems "
      "answered by generation (GSM8K) and text perplexity"};
  triad::examples::ModelSource source;
  source.add_options(app);
  std::vector<std::string> choice_files, text_files;
  app.add_option("--choices", choice_files,
                 "multiple-choice questions, JSON lines: HellaSwag's, WinoGrande's, ARC's, "
                 "OpenBookQA's, PIQA's, BoolQ's, Social IQa's, MMLU's, MMLU-Pro's or TruthfulQA's "
                 "(MC1 and MC2) as they come, or "
                 "context, choices, answer (or contexts, continuation, answer); repeatable");
  app.add_option("--text", text_files, "a text file whose perplexity to measure; repeatable");
  std::vector<std::string> lambada_files;
  app.add_option("--lambada", lambada_files,
                 "texts whose last word to predict, JSON lines of \"text\" (LAMBADA's): the "
                 "share that greedy decoding gets right, and the words' perplexity; repeatable");
  std::vector<std::string> gsm8k_files;
  app.add_option("--gsm8k", gsm8k_files,
                 "math word problems, JSON lines of \"question\" and \"answer\" (GSM8K's): each "
                 "answered greedily after --fewshot solved examples and scored by exact match, as "
                 "lm-evaluation-harness's gsm8k task scores it; repeatable");
  std::string gsm8k_fewshot_from;
  app.add_option("--gsm8k-fewshot-from", gsm8k_fewshot_from,
                 "take --gsm8k's few-shot examples from this file (its first N, or drawn with "
                 "--fewshot-seed; GSM8K's train.jsonl, where lm-evaluation-harness draws them) "
                 "instead of the other problems of each --gsm8k file");
  int64_t gen_tokens = 256;
  app.add_option("--gen-tokens", gen_tokens,
                 "--gsm8k: the most tokens generated for a problem (lm-evaluation-harness's "
                 "max_gen_toks); the prompt keeps its last seq_len minus this many tokens")
      ->check(triad::examples::at_least_one())
      ->capture_default_str();
  std::vector<std::string> stops{"Question:", "</s>", "<|im_end|>"};
  app.add_option("--stop", stops,
                 "--gsm8k: generation ends before the first of these strings (replaces the "
                 "default, lm-evaluation-harness's gsm8k list; data.eod_token ends it too)")
      ->capture_default_str();
  std::string separator = " ";
  app.add_option("--separator", separator,
                 "what goes between a context and each choice (lm-evaluation-harness's "
                 "target_delimiter)")
      ->capture_default_str();
  int64_t limit = 0;
  app.add_option("--limit", limit,
                 "only the first N questions of each --choices file, texts of each --lambada "
                 "file or problems of each --gsm8k file (0: all)")
      ->capture_default_str();
  int64_t fewshot = 0;
  app.add_option("--fewshot", fewshot,
                 "ask each question after N solved examples (lm-evaluation-harness's few-shot "
                 "prompt): the first N other questions of its file, of its subject where it "
                 "names one (MMLU), or drawn with --fewshot-seed; for --gsm8k, "
                 "lm-evaluation-harness asks after 5")
      ->capture_default_str();
  std::string hellaswag_prompt = "llmc";
  app.add_option("--hellaswag-prompt", hellaswag_prompt,
                 "how HellaSwag's lines are asked: llmc (ctx and endings as they stand, as llm.c "
                 "asks them) or harness (lm-evaluation-harness's prompt: the activity label, "
                 "WikiHow's markers cleaned)")
      ->check(CLI::IsMember({"llmc", "harness"}))
      ->capture_default_str();
  std::vector<std::string> fewshot_files;
  app.add_option("--fewshot-from", fewshot_files,
                 "take --fewshot's examples from this file instead (a dev or train split; one "
                 "per --choices file, in their order)");
  std::string chat_template;
  app.add_option("--chat-template", chat_template,
                 "--gsm8k and --choices: ask as a chat model is asked, lm-evaluation-harness's "
                 "--apply_chat_template (chatml, llama3, gemma, auto: the --tokenizer model's, or "
                 "model: its own Jinja program): a choice is scored as the assistant's answer; a "
                 "reply is the assistant's turn, ending at its end of turn (model: the model's "
                 "eos_token) too");
  bool multiturn = false;
  app.add_flag("--fewshot-as-multiturn", multiturn,
               "with --chat-template: each few-shot example a user turn and the assistant's "
               "answer (the harness's --fewshot_as_multiturn), not one user turn holding all");
  std::string system_instruction;
  app.add_option("--system-instruction", system_instruction,
                 "with --chat-template: a system message first (the harness's "
                 "--system_instruction)");
  int64_t fewshot_seed = -1;
  app.add_option("--fewshot-seed", fewshot_seed,
                 "draw each question's --fewshot examples at random, as lm-evaluation-harness "
                 "draws them with its fewshot seed (1234 by default there): Python's "
                 "random.Random(SEED), one draw per question in file order (MMLU's and "
                 "MMLU-Pro's still the first, as the harness takes them)");
  int64_t stride = 0;
  app.add_option("--stride", stride,
                 "--text: tokens scored per window, each after the text before it (default: "
                 "seq_len, windows that do not overlap)");
  int64_t batch = 8;
  app.add_option("--batch", batch, "rows the model reads at once")
      ->check(triad::examples::at_least_one())
      ->capture_default_str();
  std::string device, dtype = "f32";
  app.add_option("--device", device, "cpu, cuda or cuda:N (default: the config's)");
  app.add_option("--dtype", dtype, "the model's parameters: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  triad::examples::TokenizerOptions tokens;
  tokens.add_options(app,
                     "a special token put before every context and text, by its text (LLaMA's "
                     "<|begin_of_text|>, GPT-2's <|endoftext|>): a text's first token is then "
                     "scored too");
  std::string predictions;
  app.add_option("--predictions", predictions,
                 "write each question's scores and picks here, one JSON line each (and each "
                 "--lambada text's score)");
  bool json = false;
  app.add_flag("--json", json, "print the results as one JSON object instead of lines of text");
  CLI11_PARSE(app, argc, argv);
  // Results alone on stdout (--json's object is one line a program reads);
  // progress, choices the library logs and errors on stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("triad-eval"));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  return triad::examples::report_errors([&]() -> int {
    if (choice_files.empty() && text_files.empty() && lambada_files.empty() &&
        gsm8k_files.empty()) {
      throw triad::ValueError(
          "give --choices FILE, --lambada FILE, --gsm8k FILE or --text FILE (or several)");
    }
    if (!gsm8k_fewshot_from.empty() && gsm8k_files.empty()) {
      throw triad::ValueError("--gsm8k-fewshot-from needs --gsm8k FILE (the problems to ask)");
    }
    if (limit < 0) throw triad::ValueError("--limit " + std::to_string(limit) + " must be >= 0");
    if (fewshot < 0) {
      throw triad::ValueError("--fewshot " + std::to_string(fewshot) + " must be >= 0");
    }
    if (fewshot_seed < -1) {
      throw triad::ValueError("--fewshot-seed " + std::to_string(fewshot_seed) + " must be >= 0");
    }
    if (fewshot_seed >= 0 && fewshot == 0) {
      throw triad::ValueError("--fewshot-seed needs --fewshot N (how many examples to draw)");
    }
    const std::optional<uint64_t> draw_seed =
        fewshot_seed >= 0 ? std::optional<uint64_t>(static_cast<uint64_t>(fewshot_seed))
                          : std::nullopt;
    const triad::train::Config config = source.resolve();
    triad::nn::GptConfig model_cfg = config.model;
    model_cfg.dropout = 0;
    if (stride == 0) stride = model_cfg.seq_len;
    if (stride < 1 || stride > model_cfg.seq_len) {
      throw triad::ValueError("--stride " + std::to_string(stride) + " must be in [1, seq_len " +
                              std::to_string(model_cfg.seq_len) + "]");
    }
    const std::unique_ptr<triad::data::Tokenizer> tok = tokens.make_for(model_cfg.vocab_size);
    std::vector<int64_t> bos;
    if (tokens.has_bos()) bos.push_back(tokens.bos(*tok));
    if (!chat_template.empty() && gsm8k_files.empty() && choice_files.empty()) {
      throw triad::ValueError(
          "--chat-template asks --gsm8k's problems and --choices' questions as a chat: give "
          "either (LAMBADA and text scores are taken without one)");
    }
    if ((multiturn || !system_instruction.empty()) && chat_template.empty()) {
      throw triad::ValueError(
          std::string(multiturn ? "--fewshot-as-multiturn" : "--system-instruction") +
          " needs --chat-template (the turns of a chat model's conversation)");
    }
    const triad::examples::ChatPrompts chat(chat_template, tokens, *tok);
    // Every file is read before the model is built: a bad line costs no
    // loading time.
    std::vector<std::vector<triad::data::ChoiceQuestion>> question_sets;
    std::vector<std::vector<triad::data::SegmentedDocument>> chat_contexts;
    if (!fewshot_files.empty() && fewshot_files.size() != choice_files.size()) {
      throw triad::ValueError("--fewshot-from names " + std::to_string(fewshot_files.size()) +
                              " file(s) for " + std::to_string(choice_files.size()) +
                              " --choices file(s): give one for each, in their order");
    }
    if (!fewshot_files.empty() && fewshot == 0) {
      throw triad::ValueError("--fewshot-from needs --fewshot N (how many examples to show)");
    }
    const auto hellaswag = triad::data::hellaswag_prompt_from_string(hellaswag_prompt);
    for (size_t s = 0; s < choice_files.size(); ++s) {
      const std::string& f = choice_files[s];
      question_sets.push_back(triad::data::read_choice_questions(f, limit, hellaswag));
      if (fewshot > 0) {
        const bool own = fewshot_files.empty();
        const std::string& from = own ? f : fewshot_files[s];
        triad::data::add_examples(question_sets.back(),
                                  triad::data::read_choice_questions(from, 0, hellaswag), fewshot,
                                  separator, own, "--choices '" + f + "'", draw_seed);
      }
      // With a chat template: each question's conversation as written out.
      auto& rendered = chat_contexts.emplace_back();
      if (chat.active()) {
        for (const auto& q : question_sets.back()) {
          rendered.push_back(chat.render(
              triad::data::choice_chat(q, multiturn, system_instruction, "--choices '" + f + "'")));
        }
      }
    }
    std::vector<std::vector<triad::data::LastWordText>> lambada_sets;
    for (const auto& f : lambada_files) {
      lambada_sets.push_back(triad::data::read_last_word_texts(f, limit));
    }
    // Each --gsm8k file's problems and each problem's few-shot examples.
    std::vector<std::vector<triad::data::MathProblem>> gsm8k_sets;
    std::vector<std::vector<std::string>> gsm8k_prompts;          // each prompt's text
    std::vector<std::vector<std::vector<int64_t>>> gsm8k_tokens;  // with a chat template
    std::vector<triad::data::MathProblem> gsm8k_pool;
    if (!gsm8k_fewshot_from.empty())
      gsm8k_pool = triad::data::read_math_problems(gsm8k_fewshot_from);
    for (const auto& f : gsm8k_files) {
      // Examples from the file itself may lie past --limit: then the whole
      // file is read once and the problems asked are its first --limit.
      const bool own_shots = gsm8k_pool.empty() && fewshot > 0;
      const auto own = triad::data::read_math_problems(f, own_shots ? 0 : limit);
      auto& set = gsm8k_sets.emplace_back(own.begin(),
                                          limit > 0 && static_cast<size_t>(limit) < own.size()
                                              ? own.begin() + static_cast<std::ptrdiff_t>(limit)
                                              : own.end());
      auto& prompts = gsm8k_prompts.emplace_back();
      auto& prompt_tokens = gsm8k_tokens.emplace_back();
      // The plain prompt, or the conversation a chat template writes out.
      const auto ask = [&](const triad::data::MathProblem& problem,
                           const std::vector<triad::data::MathProblem>& shots) {
        if (!chat.active()) {
          prompts.push_back(triad::data::math_prompt(problem, shots));
          return;
        }
        const auto messages = triad::data::math_chat(problem, shots, multiturn, system_instruction);
        const triad::data::SegmentedDocument prompt = chat.render(messages);
        prompts.push_back(triad::examples::ChatPrompts::text(prompt));
        const auto ids = triad::examples::ChatPrompts::encode(*tok, prompt);
        prompt_tokens.emplace_back(ids.begin(), ids.end());
      };
      const std::string pool_name = gsm8k_pool.empty()
                                        ? "--gsm8k '" + f + "'"
                                        : "--gsm8k-fewshot-from '" + gsm8k_fewshot_from + "'";
      const auto& pool = gsm8k_pool.empty() ? own : gsm8k_pool;
      if (draw_seed) {
        // (A fresh generator per file: each is a task of its own to the harness.)
        const auto drawn =
            triad::data::drawn_shots(set, pool, fewshot, gsm8k_pool.empty(), *draw_seed, pool_name);
        for (size_t i = 0; i < set.size(); ++i) ask(set[i], drawn[i]);
      } else {
        for (size_t i = 0; i < set.size(); ++i) {
          const auto shots = triad::data::first_shots(
              pool, fewshot, gsm8k_pool.empty() ? static_cast<int64_t>(i) : -1, pool_name);
          ask(set[i], shots);
        }
      }
    }
    if (!gsm8k_files.empty() && gen_tokens >= model_cfg.seq_len) {
      throw triad::ValueError("--gen-tokens " + std::to_string(gen_tokens) +
                              " must be below the model's seq_len (" +
                              std::to_string(model_cfg.seq_len) + "), which holds the prompt too");
    }
    std::vector<std::string> texts;
    for (const auto& f : text_files) {
      if (!std::ifstream(f, std::ios::binary)) {
        throw triad::IoError("--text: cannot open '" + f + "'");
      }
      // (gzip and Zstandard files decompressed as read)
      const std::unique_ptr<std::istream> in = triad::data::open_text_input(f);
      texts.emplace_back(std::istreambuf_iterator<char>(*in), std::istreambuf_iterator<char>());
    }
    std::unique_ptr<std::ofstream> predictions_out;
    if (!predictions.empty()) {
      predictions_out = std::make_unique<std::ofstream>(predictions);
      if (!*predictions_out) {
        throw triad::IoError("--predictions: cannot write '" + predictions + "'");
      }
    }
    // Not initialised: the weights (all of them, or an error) are read in.
    triad::nn::Gpt model(model_cfg, config.train.seed, triad::DType::F32,
                         triad::nn::Gpt::Init::None);
    source.read(model_cfg, [&](triad::nn::StateDict&& part) {
      model.load_state_dict(part, /*strict=*/false);
    });
    model.to(triad::device_from_string(device.empty() ? config.device : device));
    if (dtype != "f32") model.to(triad::dtype_from_name(dtype));

    nlohmann::ordered_json report = nlohmann::ordered_json::object();
    for (size_t s = 0; s < question_sets.size(); ++s) {
      const auto& questions = question_sets[s];
      const std::string& name = choice_files[s];
      int64_t right_total = 0, right_char = 0, right_token = 0;
      double mc2_sum = 0;  // TruthfulQA's MC2 scores, over mc2_count questions
      int64_t mc2_count = 0;
      // Questions that name their group (MMLU's subjects): each group's
      // count and right answers by acc and acc_norm.
      std::map<std::string, std::array<int64_t, 3>> groups;
      auto last_report = Clock::now();
      triad::nn::ScoringWork work;  // over every chunk
      // Questions a chunk at a time: their choices batched together.
      constexpr size_t kChunk = 64;
      for (size_t first = 0; first < questions.size(); first += kChunk) {
        const size_t last = std::min(questions.size(), first + kChunk);
        std::vector<triad::nn::ContinuationRequest> requests;
        for (size_t q = first; q < last; ++q) {
          // Its choices, then TruthfulQA's second set (mc2) after the same
          // context.
          const auto& all = questions[q];
          const size_t n = all.choices.size() + all.mc2_choices.size();
          for (size_t i = 0; i < n; ++i) {
            const bool mc2 = i >= all.choices.size();
            const std::string& choice =
                mc2 ? all.mc2_choices[i - all.choices.size()] : all.choices[i];
            // A chat model answers with the choice alone (the harness puts
            // no separator before it).
            auto [context, continuation] = chat.active()
                                               ? triad::data::encode_chat_context_and_continuation(
                                                     *tok, chat_contexts[s][q], choice)
                                               : triad::data::encode_context_and_continuation(
                                                     *tok, all.context_of(mc2 ? 0 : i),
                                                     all.separator.value_or(separator) + choice);
            std::vector<int64_t> c = bos;
            c.insert(c.end(), context.begin(), context.end());
            requests.push_back({std::move(c), widen(continuation)});
          }
        }
        std::vector<triad::nn::ContinuationScore> scores;
        try {
          triad::nn::ScoringWork chunk;
          scores = triad::nn::score_continuations(model, requests, batch, false, &chunk);
          work.positions += chunk.positions;
          work.shared_prefixes += chunk.shared_prefixes;
          work.shared_prefix_positions += chunk.shared_prefix_positions;
        } catch (const triad::ValueError& e) {
          throw triad::ValueError(name + " (questions " + std::to_string(first + 1) + " to " +
                                  std::to_string(last) + "): " + e.what());
        }
        size_t at = 0;
        for (size_t q = first; q < last; ++q) {
          const auto& question = questions[q];
          const std::vector<triad::nn::ContinuationScore> mine(
              scores.begin() + static_cast<std::ptrdiff_t>(at),
              scores.begin() + static_cast<std::ptrdiff_t>(at + question.choices.size()));
          at += question.choices.size();
          std::optional<double> mc2;
          std::vector<triad::nn::ContinuationScore> set;  // mc2's scores
          if (!question.mc2_choices.empty()) {
            set.assign(
                scores.begin() + static_cast<std::ptrdiff_t>(at),
                scores.begin() + static_cast<std::ptrdiff_t>(at + question.mc2_choices.size()));
            at += question.mc2_choices.size();
            mc2 = triad::nn::true_probability_share(set, question.mc2_true);
            mc2_sum += *mc2;
            ++mc2_count;
          }
          std::vector<int64_t> chars;
          for (const auto& c : question.choices) chars.push_back(triad::data::utf8_characters(c));
          const triad::nn::ChoicePicks p = triad::nn::pick_choice(mine, chars);
          right_total += p.total == question.answer;
          right_char += p.per_char == question.answer;
          right_token += p.per_token == question.answer;
          if (!question.group.empty()) {
            auto& g = groups[question.group];
            g[0] += 1;
            g[1] += p.total == question.answer;
            g[2] += p.per_char == question.answer;
          }
          if (predictions_out) {
            nlohmann::ordered_json row{{"file", name}, {"index", q}, {"answer", question.answer}};
            if (!question.group.empty()) row["subject"] = question.group;
            // What the choices were scored after (the harness's arguments).
            if (chat.active()) {
              row["context"] = triad::examples::ChatPrompts::text(chat_contexts[s][q]);
            } else if (question.contexts.empty()) {
              row["context"] = question.context_of(0);
            } else {
              nlohmann::ordered_json contexts = nlohmann::ordered_json::array();
              for (size_t i = 0; i < question.contexts.size(); ++i)
                contexts.push_back(question.context_of(i));
              row["contexts"] = contexts;
            }
            nlohmann::ordered_json nll = nlohmann::ordered_json::array(),
                                   tokens = nlohmann::ordered_json::array();
            for (const auto& m : mine) {
              nll.push_back(m.nll);
              tokens.push_back(m.tokens);
            }
            row["nll"] = nll;
            row["tokens"] = tokens;
            row["chars"] = chars;
            row["pick"] = p.total;
            row["pick_norm"] = p.per_char;
            row["pick_per_token"] = p.per_token;
            if (mc2) {
              nlohmann::ordered_json mc2_nll = nlohmann::ordered_json::array();
              for (const auto& m : set) mc2_nll.push_back(m.nll);
              row["mc2_nll"] = mc2_nll;
              row["mc2_true"] = question.mc2_true;
              row["mc2"] = *mc2;
            }
            *predictions_out << row.dump() << "\n";
          }
        }
        if (std::chrono::duration<double>(Clock::now() - last_report).count() > 10 &&
            last < questions.size()) {
          spdlog::info("{}: {}/{} questions, acc_norm so far {:.4f}", name, last, questions.size(),
                       static_cast<double>(right_char) / last);
          last_report = Clock::now();
        }
      }
      // How much ran: few-shot examples shared by a chunk's questions of one
      // subject are read once (nn::score_continuations).
      spdlog::info("{}: {} positions through the model, {} of them {} shared beginnings read once",
                   name, work.positions, work.shared_prefix_positions, work.shared_prefixes);
      const auto n = static_cast<double>(questions.size());
      report["choices"][name] = {{"questions", questions.size()},
                                 {"acc", right_total / n},
                                 {"acc_norm", right_char / n},
                                 {"acc_per_token", right_token / n}};
      if (mc2_count > 0) {
        // (Over the questions with a second set: TruthfulQA's all have one.)
        report["choices"][name]["mc2"] = mc2_sum / static_cast<double>(mc2_count);
        report["choices"][name]["mc2_questions"] = mc2_count;
      }
      if (chat.active()) {
        report["choices"][name]["chat_template"] = chat.name();
        report["choices"][name]["fewshot_as_multiturn"] = multiturn;
      }
      if (!json) {
        const std::string mc2 =
            mc2_count > 0 ? fmt::format(" | mc2 {:.4f}", mc2_sum / static_cast<double>(mc2_count))
                          : "";
        std::printf("%s: %zu questions | acc %.4f | acc_norm %.4f | acc_per_token %.4f%s\n",
                    name.c_str(), questions.size(), right_total / n, right_char / n,
                    right_token / n, mc2.c_str());
        std::fflush(stdout);
      }
      if (!groups.empty()) {
        // Each subject's accuracy, and their mean (MMLU's tables quote both
        // the mean over questions above and this mean over subjects).
        nlohmann::ordered_json by = nlohmann::ordered_json::object();
        double mean = 0, mean_norm = 0;
        for (const auto& [group, g] : groups) {
          const auto count = static_cast<double>(g[0]);
          by[group] = {{"questions", g[0]}, {"acc", g[1] / count}, {"acc_norm", g[2] / count}};
          mean += g[1] / count / static_cast<double>(groups.size());
          mean_norm += g[2] / count / static_cast<double>(groups.size());
        }
        report["choices"][name]["acc_group_mean"] = mean;
        report["choices"][name]["acc_norm_group_mean"] = mean_norm;
        report["choices"][name]["groups"] = by;
        if (!json) {
          std::printf("%s: %zu subjects | mean acc over subjects %.4f | acc_norm %.4f\n",
                      name.c_str(), groups.size(), mean, mean_norm);
          std::fflush(stdout);
        }
      }
    }
    // LAMBADA: a text's last word is right when greedy decoding writes it
    // (every token the argmax), and its perplexity is exp of the mean over
    // texts of the word's -log p (lm-evaluation-harness's and Megatron-LM's
    // numbers).
    for (size_t s = 0; s < lambada_sets.size(); ++s) {
      const auto& set = lambada_sets[s];
      const std::string& name = lambada_files[s];
      std::vector<triad::nn::ContinuationRequest> requests;
      for (const auto& t : set) {
        auto [context, continuation] =
            triad::data::encode_context_and_continuation(*tok, t.context, t.target);
        std::vector<int64_t> c = bos;
        c.insert(c.end(), context.begin(), context.end());
        requests.push_back({std::move(c), widen(continuation)});
      }
      std::vector<triad::nn::ContinuationScore> scores;
      try {
        scores = triad::nn::score_continuations(model, requests, batch, /*greedy=*/true);
      } catch (const triad::ValueError& e) {
        throw triad::ValueError(name + ": " + e.what());
      }
      double nll = 0;
      int64_t right = 0;
      for (size_t i = 0; i < scores.size(); ++i) {
        nll += scores[i].nll;
        right += scores[i].greedy;
        if (predictions_out) {
          *predictions_out << nlohmann::ordered_json{{"file", name},
                                                     {"index", i},
                                                     {"nll", scores[i].nll},
                                                     {"tokens", scores[i].tokens},
                                                     {"greedy", scores[i].greedy}}
                                  .dump()
                           << "\n";
        }
      }
      const auto n = static_cast<double>(set.size());
      const double acc = static_cast<double>(right) / n, ppl = std::exp(nll / n);
      report["lambada"][name] = {{"texts", set.size()}, {"acc", acc}, {"perplexity", ppl}};
      if (!json) {
        std::printf("%s: %zu texts | last-word acc %.4f | perplexity %.3f\n", name.c_str(),
                    set.size(), acc, ppl);
        std::fflush(stdout);
      }
    }
    // GSM8K: each problem's prompt continued greedily (train::answer_gsm8k)
    // and its number taken out two ways.
    triad::train::Gsm8kOptions gsm8k;
    gsm8k.gen_tokens = gen_tokens;
    gsm8k.batch = batch;
    gsm8k.stops = stops;
    gsm8k.bos = bos;
    gsm8k.eod_token = config.model.eod_token;
    if (chat.end_of_turn() >= 0) gsm8k.stop_tokens.push_back(chat.end_of_turn());
    for (size_t s = 0; s < gsm8k_sets.size(); ++s) {
      const auto& set = gsm8k_sets[s];
      const std::string& name = gsm8k_files[s];
      auto last_report = Clock::now();
      const auto progress = [&](const triad::train::Gsm8kResult& so_far) {
        if (std::chrono::duration<double>(Clock::now() - last_report).count() > 10 &&
            so_far.replies.size() < set.size()) {
          spdlog::info("{}: {}/{} problems, flexible exact match so far {:.4f}", name,
                       so_far.replies.size(), set.size(), so_far.exact_match_flexible());
          last_report = Clock::now();
        }
      };
      const triad::train::Gsm8kResult r =
          chat.active()
              ? triad::train::answer_gsm8k(model, *tok, set, gsm8k_tokens[s], gsm8k, progress)
              : triad::train::answer_gsm8k(model, *tok, set, gsm8k_prompts[s], gsm8k, progress);
      if (predictions_out) {
        for (size_t i = 0; i < r.replies.size(); ++i) {
          const auto& x = r.replies[i];
          *predictions_out << nlohmann::ordered_json{{"file", name},
                                                     {"index", i},
                                                     {"prompt", gsm8k_prompts[s][i]},
                                                     {"reply", x.reply},
                                                     {"strict", x.strict},
                                                     {"flexible", x.flexible},
                                                     {"strict_right", x.strict_right},
                                                     {"flexible_right", x.flexible_right},
                                                     {"tokens", x.tokens}}
                                  // (A reply cut inside a character: U+FFFD in its place.)
                                  .dump(-1, ' ', false,
                                        nlohmann::ordered_json::error_handler_t::replace)
                           << "\n";
        }
      }
      if (r.truncated > 0) {
        spdlog::warn(
            "{}: {} of {} prompts were longer than seq_len - --gen-tokens ({}) and kept "
            "only their last tokens",
            name, r.truncated, set.size(), model_cfg.seq_len - gen_tokens);
      }
      report["gsm8k"][name] = {{"problems", set.size()},
                               {"fewshot", fewshot},
                               {"exact_match_strict", r.exact_match_strict()},
                               {"exact_match_flexible", r.exact_match_flexible()},
                               {"truncated_prompts", r.truncated},
                               {"generated_tokens", r.generated_tokens()}};
      if (draw_seed) report["gsm8k"][name]["fewshot_seed"] = *draw_seed;
      if (chat.active()) {
        report["gsm8k"][name]["chat_template"] = chat.name();
        report["gsm8k"][name]["fewshot_as_multiturn"] = multiturn;
      }
      if (!json) {
        std::printf("%s: %zu problems, %lld-shot | exact match strict %.4f | flexible %.4f\n",
                    name.c_str(), set.size(), static_cast<long long>(fewshot),
                    r.exact_match_strict(), r.exact_match_flexible());
        std::fflush(stdout);
      }
    }
    double all_nll = 0;
    int64_t all_tokens = 0, all_bytes = 0, all_words = 0;
    bool every_byte = true;
    for (size_t t = 0; t < texts.size(); ++t) {
      const std::string& name = text_files[t];
      std::vector<int64_t> tokens = bos;
      for (const int32_t id : tok->encode(texts[t])) tokens.push_back(id);
      const auto requests = triad::nn::rolling_requests(tokens, model_cfg.seq_len, stride);
      if (requests.empty()) {
        throw triad::ValueError("--text '" + name + "' has " + std::to_string(tokens.size()) +
                                " token(s): too few to score" +
                                (bos.empty() ? " (give --bos-token to score the first)" : ""));
      }
      double nll = 0;
      int64_t scored = 0;
      for (const auto& s : triad::nn::score_continuations(model, requests, batch)) {
        nll += s.nll;
        scored += s.tokens;
      }
      const double loss = nll / static_cast<double>(scored);
      nlohmann::ordered_json r{{"tokens", scored}, {"loss", loss}, {"perplexity", std::exp(loss)}};
      // Bits per byte and the perplexity per word when every token is
      // scored (a beginning token given): the whole text is then what the
      // scores pay for (lm-evaluation-harness's WikiText measures).
      const bool whole = !bos.empty();
      const int64_t words = triad::data::count_words(texts[t]);
      every_byte = every_byte && whole;
      if (whole) {
        r["bits_per_byte"] = nll / std::log(2.0) / static_cast<double>(texts[t].size());
        r["words"] = words;
        r["word_perplexity"] = std::exp(nll / static_cast<double>(words));
      }
      all_nll += nll;
      all_tokens += scored;
      all_bytes += static_cast<int64_t>(texts[t].size());
      all_words += words;
      report["text"][name] = r;
      if (!json) {
        std::printf("%s: %lld tokens scored | loss %.4f | perplexity %.3f", name.c_str(),
                    static_cast<long long>(scored), loss, std::exp(loss));
        if (whole) {
          std::printf(" | bits per byte %.4f | word perplexity %.3f",
                      r["bits_per_byte"].get<double>(), r["word_perplexity"].get<double>());
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    if (texts.size() > 1) {
      const double loss = all_nll / static_cast<double>(all_tokens);
      nlohmann::ordered_json r{
          {"tokens", all_tokens}, {"loss", loss}, {"perplexity", std::exp(loss)}};
      if (every_byte) {
        r["bits_per_byte"] = all_nll / std::log(2.0) / static_cast<double>(all_bytes);
        r["words"] = all_words;
        r["word_perplexity"] = std::exp(all_nll / static_cast<double>(all_words));
      }
      report["text_all"] = r;
      if (!json) {
        std::printf("all text: %lld tokens scored | loss %.4f | perplexity %.3f",
                    static_cast<long long>(all_tokens), loss, std::exp(loss));
        if (every_byte) {
          std::printf(" | bits per byte %.4f | word perplexity %.3f",
                      r["bits_per_byte"].get<double>(), r["word_perplexity"].get<double>());
        }
        std::printf("\n");
      }
    }
    if (json) std::printf("%s\n", report.dump().c_str());
    return 0;
  });
}
