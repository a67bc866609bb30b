// Every file Triad reads from disk — safetensors weights and checkpoints,
// llm.c token shards, Megatron indexed datasets — is damaged one byte at a
// time (each header byte set to a handful of values) and cut short at every
// length: reading it either succeeds with data inside the file or raises a
// triad::Error. Anything else (another exception type, a crash under the
// test runner, a read outside the mapping) fails the test.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "support/temp_dir.h"
#include "triad/data/chat_template.h"
#include "triad/data/indexed_dataset.h"
#include "triad/data/sentencepiece.h"
#include "triad/data/text_input.h"
#include "triad/data/token_dataset.h"
#include "triad/data/token_shard.h"
#include "triad/data/tokenizer.h"
#include "triad/io/checkpoint.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_config.h"
#include "triad/io/peft_adapter.h"
#include "triad/io/safetensors.h"
#include "triad/io/text_file.h"
#include "triad/ops.h"
#include "triad/plan/model_spec.h"
#include "triad/train/config.h"

namespace triad {
namespace {

using triad::testing::TempDir;

std::vector<uint8_t> damaged_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b, size_t n) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(n));
}

// The values each damaged byte takes: structural characters of JSON, the
// extremes, digits and a one-bit flip of the original.
std::vector<uint8_t> replacements(uint8_t original) {
  return {0x00,
          0xff,
          0x7f,
          '"',
          '{',
          ']',
          ',',
          ':',
          '9',
          '-',
          static_cast<uint8_t>(original ^ 0x01),
          static_cast<uint8_t>(original ^ 0x80)};
}

// Runs `read` and says how it ended: "ok", "error" (a triad::Error) or a
// description of anything else.
template <class F>
std::string outcome(F&& read) {
  try {
    read();
    return "ok";
  } catch (const Error&) {
    return "error";
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
}

TEST(DamagedFiles, SafetensorsLoadOrRaiseForEveryHeaderByteAndLength) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  io::save_safetensors(path,
                       {{"a", from_vector(std::vector<double>{1.5, -2, 3, 4, 5, 6}, {2, 3})},
                        {"b", cast(from_vector(std::vector<double>{7, 8}, {2}), DType::BF16)},
                        {"c", from_vector(std::vector<double>{9}, {1}, DType::I64)}},
                       {{"step", "12"}});
  const std::vector<uint8_t> good = damaged_bytes(path);
  uint64_t header = 0;
  std::memcpy(&header, good.data(), 8);
  ASSERT_LT(8 + header, good.size());
  int loaded = 0, refused = 0;
  auto check = [&](const std::vector<uint8_t>& bytes, const std::string& what) {
    const std::string how = outcome([&] {
      const io::Safetensors s = io::parse_safetensors(bytes, "w.safetensors");
      size_t total = 0;  // what it read must lie inside the file
      for (const auto& [name, t] : s.tensors) total += t.nbytes();
      if (total > bytes.size()) throw std::logic_error("tensors larger than the file");
    });
    if (how == "ok") ++loaded;
    if (how == "error") ++refused;
    EXPECT_TRUE(how == "ok" || how == "error") << what << ": " << how;
  };
  for (size_t i = 0; i < 8 + header; ++i) {
    for (uint8_t v : replacements(good[i])) {
      if (v == good[i]) continue;
      std::vector<uint8_t> bad = good;
      bad[i] = v;
      check(bad, "byte " + std::to_string(i) + " = " + std::to_string(v));
    }
  }
  for (size_t n = 0; n < good.size(); ++n) {
    check(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)),
          "cut to " + std::to_string(n) + " bytes");
  }
  // Most damage is refused; some (a digit of a value in the metadata, a
  // letter of a name) leaves a valid file.
  EXPECT_GT(refused, 8 * static_cast<int>(header));
  EXPECT_GT(loaded, 0);
}

// Reads every sequence of a dataset the way the trainer does.
void read_whole(const std::string& source, int64_t seq_len, int64_t vocab) {
  data::TokenDataset ds({source}, seq_len, vocab);
  std::vector<int64_t> tokens(static_cast<size_t>(seq_len + 1));
  for (int64_t g = 0; g < ds.num_sequences(); ++g) {
    ds.read_sequence(g, tokens.data());
    for (int64_t t : tokens) {
      if (t < 0 || t >= vocab) throw std::logic_error("token outside the vocabulary read");
    }
  }
}

TEST(DamagedFiles, TokenShardsLoadOrRaiseForEveryHeaderByteAndLength) {
  TempDir dir;
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(static_cast<uint16_t>((i * 37) % 50));
  const std::string path = dir.file("s.bin");
  data::write_token_shard(path, tokens);
  const std::vector<uint8_t> good = damaged_bytes(path);
  ASSERT_EQ(good.size(), 1024 + 2 * tokens.size());
  auto check = [&](const std::vector<uint8_t>& bytes, size_t n, const std::string& what) {
    write_bytes(path, bytes, n);
    const std::string how = outcome([&] { read_whole(path, 16, 50); });
    EXPECT_TRUE(how == "ok" || how == "error") << what << ": " << how;
  };
  // The header's magic, version and token count, and the first tokens.
  for (size_t i = 0; i < 12; ++i) {
    for (uint8_t v : replacements(good[i])) {
      if (v == good[i]) continue;
      std::vector<uint8_t> bad = good;
      bad[i] = v;
      check(bad, bad.size(), "byte " + std::to_string(i) + " = " + std::to_string(v));
    }
  }
  for (size_t i = 1024; i < 1034; ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] = 0xff;  // token 0xff.. is past the vocabulary of 50
    check(bad, bad.size(), "token byte " + std::to_string(i));
  }
  for (size_t n = 0; n < good.size(); n += 7) check(good, n, "cut to " + std::to_string(n));
}

TEST(DamagedFiles, IndexedDatasetsLoadOrRaiseForEveryIndexByteAndLength) {
  TempDir dir;
  const std::string prefix = dir.file("m");
  std::vector<std::vector<int64_t>> docs;
  for (int d = 0; d < 5; ++d) {
    std::vector<int64_t> doc;
    for (int i = 0; i < 20 + 7 * d; ++i) doc.push_back((i * 11 + d) % 60);
    docs.push_back(doc);
  }
  data::write_indexed_dataset(prefix, docs, data::IndexedDType::U16);
  const std::vector<uint8_t> idx = damaged_bytes(prefix + ".idx");
  const std::vector<uint8_t> bin = damaged_bytes(prefix + ".bin");
  ASSERT_NO_THROW(read_whole(prefix, 16, 60));
  auto check = [&](const std::string& file, const std::vector<uint8_t>& bytes, size_t n,
                   const std::string& what) {
    write_bytes(file, bytes, n);
    const std::string how = outcome([&] { read_whole(prefix, 16, 60); });
    EXPECT_TRUE(how == "ok" || how == "error") << what << ": " << how;
  };
  // The whole index: header, lengths, pointers and document indices.
  for (size_t i = 0; i < idx.size(); ++i) {
    for (uint8_t v : replacements(idx[i])) {
      if (v == idx[i]) continue;
      std::vector<uint8_t> bad = idx;
      bad[i] = v;
      check(prefix + ".idx", bad, bad.size(), "idx byte " + std::to_string(i));
    }
  }
  for (size_t n = 0; n < idx.size(); ++n) {
    check(prefix + ".idx", idx, n, "idx cut to " + std::to_string(n));
  }
  write_bytes(prefix + ".idx", idx, idx.size());
  for (size_t n = 0; n < bin.size(); n += 5) {
    check(prefix + ".bin", bin, n, "bin cut to " + std::to_string(n));
  }
}

// A directory where a file belongs (a path typed wrong, a name taken by a
// folder) is named as what cannot be read. Reading one through a stream
// reads nothing, or throws the standard library's ios_failure from inside
// the JSON parser; sized by seeking, it is 2^63 bytes long.
TEST(DamagedFiles, ADirectoryWhereAFileBelongsIsAnError) {
  TempDir dir;
  const std::string folder = dir.file("folder");
  for (const char* name : {"folder", "adapter/adapter_config.json", "model/tokenizer_config.json",
                           "ckpt/step_2/manifest.json"}) {
    std::filesystem::create_directories(dir.file(name));
  }
  std::ofstream(dir.file("ckpt/latest")) << "step_2\n";
  const std::vector<std::pair<std::string, std::function<void()>>> readers = {
      {"token shard", [&] { data::read_token_shard(folder); }},
      {"GPT-2 vocab.json", [&] { data::make_tokenizer(folder, folder, ""); }},
      {"SentencePiece model", [&] { data::load_sentencepiece(folder); }},
      {"tokenizer.json", [&] { data::load_hf_tokenizer(folder); }},
      {"tokenizer_config.json", [&] { data::ModelChatTemplate::load(dir.file("model"), {}); }},
      {"text input", [&] { data::open_text_input(folder); }},
      {"safetensors", [&] { io::load_safetensors(folder); }},
      {"config.json", [&] { io::load_hf_config(dir.file("folder/config.json")); }},
      {"adapter_config.json", [&] { io::read_peft_adapter(dir.file("adapter")); }},
      {"manifest.json", [&] { io::find_latest_checkpoint(dir.file("ckpt")); }},
      {"training config", [&] { train::load_config(folder); }},
      {"text file", [&] { io::read_text_file(folder, "cluster file"); }},
  };
  for (const auto& [what, read] : readers) EXPECT_EQ(outcome(read), "error") << what;
  try {
    io::read_text_file(folder, "cluster file");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open cluster file '" + folder + "' (a directory)"),
              std::string::npos)
        << e.what();
  }
}

// A name the system refuses (longer than a name may be) is a path the
// reader cannot open, and says so: std::filesystem's checks threw
// filesystem_error (found by fuzzing a config's model.hf_config).
TEST(DamagedFiles, ANameTheSystemRefusesIsAnError) {
  const std::string name = "/tmp/" + std::string(5000, 'a');
  const std::vector<std::pair<std::string, std::function<void()>>> readers = {
      {"config.json", [&] { io::load_hf_config(name); }},
      {"model.hf_config",
       [&] {
         train::parse_config("model: {hf_config: " + name +
                             "}\ntrain: {steps: 1, global_batch_size: 1, micro_batch_size: 1}\n"
                             "data: {train: x.bin}\n");
       }},
      {"model file", [&] { plan::load_model_spec(name); }},
      {"tokenizer.json", [&] { data::load_hf_tokenizer(name); }},
      {"--chat-template auto", [&] { data::chat_template_of_model(name); }},
      {"tokenizer_config.json", [&] { data::ModelChatTemplate::load(name, {}); }},
      {"weights", [&] { io::load_gpt2_state_dict(name, {}); }},
      {"adapter", [&] { io::read_peft_adapter(name); }},
  };
  for (const auto& [what, read] : readers) EXPECT_EQ(outcome(read), "error") << what;
  // (No checkpoint there: none to resume from.)
  EXPECT_EQ(outcome([&] { EXPECT_FALSE(io::find_latest_checkpoint(name)); }), "ok");
}

}  // namespace
}  // namespace triad
