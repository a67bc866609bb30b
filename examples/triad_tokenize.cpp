// triad-tokenize: turns a text file into an llm.c token shard, or into a
// Megatron indexed dataset, as one document or many (--documents), each
// optionally followed by an end-of-document token (--eod).
//   triad-tokenize --input corpus.txt --output train.bin            (bytes, vocab 256)
//   triad-tokenize --input corpus.txt --output train.bin --vocab vocab.json --merges merges.txt
//   triad-tokenize --input corpus.txt --output data/train --format megatron   (train.bin + .idx)
//   triad-tokenize ... --documents paragraphs --eod 50256     (GPT-2's <|endoftext|> after each)
//   triad-tokenize --input docs.jsonl --documents jsonl --tokenizer /models/Qwen3-0.6B
//       --eod 151643 --format megatron --output data/qwen         (Qwen's tokenizer.json)
//   triad-tokenize --input pairs.jsonl --documents jsonl --prompt-key prompt --json-key response
//       ... --format megatron --output data/sft     (and data/sft.loss_mask: fine-tuning data)
//   triad-tokenize --input shards/*.jsonl.zst --documents jsonl ...   (several, compressed)
//   triad-tokenize --input chats.jsonl --documents jsonl --json-key messages --chat-template chatml
//       --tokenizer /models/Qwen3-0.6B ...          (conversations; the assistant's turns scored)
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>

#include "triad/core/error.h"
#include "triad/data/chat_template.h"
#include "triad/data/indexed_dataset.h"
#include "triad/data/loss_mask.h"
#include "triad/data/text_input.h"
#include "triad/data/token_shard.h"
#include "triad/data/tokenizer.h"
#include "triad/train/console.h"

#include "cli_checks.h"
#include "tokenizer_options.h"

int main(int argc, char** argv) {
  CLI::App app{"Tokenize a text file into an llm.c shard or a Megatron indexed dataset"};
  std::string output, format = "llmc", documents = "whole", json_key = "text";
  std::vector<std::string> inputs;
  int64_t eod = -1;
  std::string eod_token;
  int workers = 0;
  app.add_option("--input", inputs,
                 "UTF-8 text files, read in the order given (plain, or compressed with gzip or "
                 "zstd: .gz and .zst files are told by their first bytes); '-': the standard "
                 "input")
      ->required();
  app.add_option("--output", output, "shard to write (llmc), or the dataset's prefix (megatron)")
      ->required();
  app.add_option("--format", format,
                 "llmc: one shard of uint16 tokens; megatron: <output>.bin and <output>.idx, the "
                 "file one document (uint16 tokens below vocab 65500, int32 above)")
      ->check(CLI::IsMember({"llmc", "megatron"}));
  triad::examples::TokenizerOptions tokens;
  tokens.add_options(app,
                     "a special token of --tokenizer's put before each document, by its text "
                     "(e.g. LLaMA 2's <s>; SentencePiece models do not add it themselves)");
  app.add_option("--documents", documents,
                 "how the input divides into documents: whole (one), lines (each non-empty line), "
                 "paragraphs (separated by blank lines) or jsonl (one JSON object per line, the "
                 "text under --json-key); each is a document of a Megatron dataset");
  app.add_option("--json-key", json_key, "jsonl: the field holding each document's text")
      ->capture_default_str();
  std::string prompt_key;
  app.add_option("--prompt-key", prompt_key,
                 "jsonl: the field holding each line's prompt, for supervised fine-tuning; the "
                 "text under --json-key is then its response, and <output>.loss_mask records "
                 "that only the response (and --eod) is scored");
  std::string chat_template;
  app.add_option("--chat-template", chat_template,
                 "jsonl: the field under --json-key is a conversation, a list of {role, content} "
                 "messages, written out in this template (chatml: Qwen's; llama3; gemma; auto: "
                 "the --tokenizer model's own, when it is one of them; model: the --tokenizer "
                 "model's own Jinja program, run as transformers runs it) with "
                 "<output>.loss_mask scoring the assistant's turns");
  std::string chat_turns = "whole";
  app.add_option("--chat-turns", chat_turns,
                 "with --chat-template model: whole (a conversation is one document, every "
                 "assistant turn scored) or each (a document per assistant turn: the "
                 "conversation up to it, that turn scored; for templates such as Qwen3's that "
                 "write earlier turns differently once later ones follow)")
      ->check(CLI::IsMember({"whole", "each"}))
      ->capture_default_str();
  app.add_option("--eod", eod,
                 "token appended after each document (e.g. 50256, GPT-2's <|endoftext|>; "
                 "data.eod_token in triad-train); -1: none");
  app.add_option("--eod-token", eod_token,
                 "the end-of-document token by its text, a special token of --tokenizer's (e.g. "
                 "<|endoftext|>, </s>); instead of --eod");
  app.add_option("--workers", workers,
                 "threads encoding documents (0: one per hardware thread); the output is the same "
                 "for any number")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return triad::examples::report_errors([&]() -> int {
    triad::train::configure_console_colors();
    if (eod < -1) {
      throw triad::ValueError("--eod (" + std::to_string(eod) +
                              ") must be a token id >= 0, or -1 for none");
    }
    const std::unique_ptr<triad::data::Tokenizer> tok = tokens.make();
    if (!eod_token.empty()) {
      if (eod != -1) throw triad::ValueError("give --eod or --eod-token, not both");
      eod = triad::data::require_special_token(*tok, eod_token, "--eod-token");
    }
    const int64_t bos = tokens.bos(*tok);
    // Every input can be opened (a missing one is named before any output
    // is written or any work done).
    if (std::count(inputs.begin(), inputs.end(), "-") > 1) {
      throw triad::ValueError("--input names the standard input ('-') more than once");
    }
    for (const std::string& input : inputs) {
      if (input != "-" && !std::ifstream(input, std::ios::binary)) {
        throw triad::IoError("cannot open input '" + input + "'");
      }
    }
    // The input a batch of documents at a time (about 64 MB of text), each
    // batch encoded by the workers and appended to the output, so a corpus
    // larger than memory streams through.
    triad::data::DocumentLabels labels{prompt_key, std::nullopt};
    labels.each_turn = chat_turns == "each";
    if (chat_template == "model") {
      labels.model_chat = std::make_shared<const triad::data::ModelChatTemplate>(
          triad::data::ModelChatTemplate::load(tokens.tokenizer_path(), tok->special_tokens()));
      spdlog::info("chat template: the model's own, from {}", labels.model_chat->origin());
    } else if (!chat_template.empty()) {
      labels.chat = triad::data::resolve_chat_template(chat_template, tokens.tokenizer_path());
      if (chat_template == "auto") {
        spdlog::info("chat template: {} (the model's)",
                     triad::data::chat_template_name(*labels.chat));
        chat_template = triad::data::chat_template_name(*labels.chat);
      }
      // Every marker must be one special token, never text spelt out.
      triad::data::require_chat_markers(*tok, *labels.chat,
                                        "--chat-template " + chat_template + ":");
    }
    const triad::data::DocumentSplit split = triad::data::document_split_from_string(documents);
    const std::string mask_path = triad::data::loss_mask_path(output);
    std::unique_ptr<triad::data::LossMaskWriter> mask;
    if (labels.any()) mask = std::make_unique<triad::data::LossMaskWriter>(mask_path);
    const bool megatron = format == "megatron";
    const auto dtype = triad::data::indexed_dtype_for_vocab(tok->vocab_size());
    std::unique_ptr<triad::data::IndexedDatasetWriter> dataset;
    std::unique_ptr<triad::data::TokenShardWriter> shard;
    if (megatron) {
      dataset = std::make_unique<triad::data::IndexedDatasetWriter>(output, dtype);
    } else {
      shard = std::make_unique<triad::data::TokenShardWriter>(output);
    }
    int64_t count = 0, document_count = 0, scored = 0;
    std::vector<std::string> batch;
    std::vector<triad::data::SegmentedDocument> segmented;
    for (const std::string& input : inputs) {
      // Opened in its turn (thousands of shards need not be open at once).
      const std::unique_ptr<std::istream> in = triad::data::open_text_input(input);
      triad::data::DocumentReader reader(*in, split, json_key, labels);
      auto next_batch = [&] {
        try {
          return mask ? reader.next(segmented, size_t{64} << 20)
                      : reader.next(batch, size_t{64} << 20);
        } catch (const triad::ValueError& e) {
          throw triad::ValueError("input '" + input + "': " + e.what());
        }
      };
      while (next_batch()) {
        triad::data::MaskedDocuments docs;
        if (mask) {
          // A pair's end token is its cue to stop; a chat's turns end with
          // their own marker.
          const bool chat = labels.chat || labels.model_chat;
          docs = triad::data::tokenize_segmented(*tok, segmented, eod, !chat, workers,
                                                 document_count, bos);
        } else {
          docs.tokens =
              triad::data::tokenize_documents(*tok, batch, eod, workers, document_count, bos);
        }
        for (size_t i = 0; i < docs.tokens.size(); ++i) {
          const auto& d = docs.tokens[i];
          try {
            megatron ? dataset->add(d) : shard->add(d);
            if (mask) mask->add(docs.keep[i]);
          } catch (const triad::Error& e) {
            throw triad::ValueError("document " + std::to_string(document_count) + ": " + e.what());
          }
          count += static_cast<int64_t>(d.size());
          if (mask) scored += std::count(docs.keep[i].begin(), docs.keep[i].end(), uint8_t{1});
          ++document_count;
        }
        batch.clear();
        segmented.clear();
      }
    }
    if (megatron) {
      dataset->finish();
      spdlog::info("wrote {} tokens in {} documents (vocab {}, {}) to {}.bin and {}.idx", count,
                   document_count, tok->vocab_size(), triad::data::indexed_dtype_name(dtype),
                   output, output);
    } else {
      shard->finish();
      spdlog::info("wrote {} tokens in {} documents (vocab {}) to {}", count, document_count,
                   tok->vocab_size(), output);
    }
    // The mask once the tokens it describes are in place.
    if (mask) {
      mask->finish();
      spdlog::info("wrote the loss mask {}: {} of {} tokens ({:.1f}%) are scored ({})", mask_path,
                   scored, count,
                   count ? 100.0 * static_cast<double>(scored) / static_cast<double>(count) : 0.0,
                   labels.chat || labels.model_chat ? "the assistant's turns"
                                                    : "the responses and end tokens");
    } else if (std::filesystem::exists(mask_path)) {
      // A mask left by an earlier run over this output would mislabel the new tokens.
      std::filesystem::remove(mask_path);
      spdlog::info("removed {}, the loss mask of the data this run replaced", mask_path);
    }
    return 0;
  });
}
