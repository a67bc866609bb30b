#include "triad/data/text_input.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "triad/data/multiple_choice.h"
#include "triad/data/tokenizer.h"

#ifdef TRIAD_WITH_ZLIB
#include <zlib.h>
#endif
#ifdef TRIAD_WITH_ZSTD
#include <zstd.h>
#endif

namespace triad::data {
namespace {

using testing::expect_error;
using testing::TempDir;

// Text larger than the reader's 1 MiB blocks, compressible but not trivially.
std::string corpus(int lines, int seed) {
  std::string s;
  for (int i = 0; i < lines; ++i) {
    s += "{\"text\": \"line " + std::to_string(i * seed) + " of the corpus, " +
         std::string(static_cast<size_t>(i % 37), static_cast<char>('a' + i % 26)) + "\"}\n";
  }
  return s;
}

std::string read_all(const std::string& path) {
  const auto in = open_text_input(path);
  return std::string(std::istreambuf_iterator<char>(*in), {});
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

#ifdef TRIAD_WITH_ZLIB
std::string gzip(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
#endif

#ifdef TRIAD_WITH_ZSTD
std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}
#endif

TEST(TextInput, PlainTextReadsAsItIs) {
  TempDir dir;
  const std::string text = corpus(100, 3);
  write(dir.file("a.jsonl"), text);
  EXPECT_EQ(read_all(dir.file("a.jsonl")), text);
  write(dir.file("empty.txt"), "");
  EXPECT_EQ(read_all(dir.file("empty.txt")), "");
  expect_error([&] { open_text_input(dir.file("none.txt")); }, {"cannot open input '"});
}

TEST(TextInput, GzipMembersDecompressAsOneText) {
#ifndef TRIAD_WITH_ZLIB
  GTEST_SKIP() << "this build reads no gzip";
#else
  TempDir dir;
  const std::string a = corpus(40000, 7), b = corpus(3000, 11);  // a: several MiB
  ASSERT_GT(a.size(), size_t{2} << 20);
  const std::string both = gzip(a) + gzip(b);  // gzip -c a b
  write(dir.file("ab.jsonl.gz"), both);
  EXPECT_EQ(read_all(dir.file("ab.jsonl.gz")), a + b);
  // The name does not matter, the bytes do.
  write(dir.file("misnamed.txt"), gzip(b));
  EXPECT_EQ(read_all(dir.file("misnamed.txt")), b);
  // Cut short, or damaged: errors that name the file, never silent ends.
  write(dir.file("cut.gz"), both.substr(0, both.size() - 100));
  expect_error([&] { read_all(dir.file("cut.gz")); },
               {"input '", "cut.gz': the gzip data ends in the middle"});
  std::string damaged = gzip(a);
  for (size_t i = damaged.size() / 2; i < damaged.size() / 2 + 64; ++i) damaged[i] ^= 0x5a;
  write(dir.file("bad.gz"), damaged);
  expect_error([&] { read_all(dir.file("bad.gz")); }, {"bad.gz': the gzip data is corrupt ("});
  // Multiple-choice questions may come compressed too.
  write(dir.file("q.jsonl.gz"), gzip(R"({"context": "c", "choices": ["a", "b"], "answer": 1})"
                                     "\n"));
  const auto questions = read_choice_questions(dir.file("q.jsonl.gz"));
  ASSERT_EQ(questions.size(), 1u);
  EXPECT_EQ(questions[0].answer, 1);
  // A reader of whole documents sees the error too (it reads, not <<).
  const auto in = open_text_input(dir.file("cut.gz"));
  DocumentReader reader(*in, DocumentSplit::Whole);
  std::vector<std::string> docs;
  expect_error([&] { reader.next(docs, 1 << 20); }, {"ends in the middle"});
#endif
}

TEST(TextInput, ZstdFramesDecompressAsOneText) {
#ifndef TRIAD_WITH_ZSTD
  GTEST_SKIP() << "this build reads no zstd";
#else
  TempDir dir;
  const std::string a = corpus(40000, 5), b = corpus(10, 13);
  const std::string both = zstd(a) + zstd(b) + zstd("");
  write(dir.file("ab.jsonl.zst"), both);
  EXPECT_EQ(read_all(dir.file("ab.jsonl.zst")), a + b);
  // Lines arrive whole across the 1 MiB blocks.
  const auto in = open_text_input(dir.file("ab.jsonl.zst"));
  DocumentReader reader(*in, DocumentSplit::JsonLines);
  std::vector<std::string> docs;
  while (reader.next(docs, size_t{1} << 20)) {
  }
  ASSERT_EQ(docs.size(), 40010u);
  EXPECT_EQ(docs[39999], "line " + std::to_string(39999 * 5) + " of the corpus, " +
                             std::string(39999 % 37, static_cast<char>('a' + 39999 % 26)));
  write(dir.file("cut.zst"), both.substr(0, zstd(a).size() / 2));
  expect_error([&] { read_all(dir.file("cut.zst")); },
               {"cut.zst': the zstd data ends in the middle"});
  std::string damaged = zstd(a);
  for (size_t i = 20; i < 60; ++i) damaged[i] ^= 0x33;
  write(dir.file("bad.zst"), damaged);
  expect_error([&] { read_all(dir.file("bad.zst")); }, {"bad.zst': the zstd data is corrupt ("});
#endif
}

}  // namespace
}  // namespace triad::data
