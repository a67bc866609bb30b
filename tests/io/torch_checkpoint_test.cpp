// torch.save files read without Python, from archives and pickles written
// here byte by byte (the parity suite reads PyTorch's own): a strided view
// gathered, and what is no state dict of tensors refused with the reason —
// a pickle calling anything but the few functions a state dict is rebuilt
// with, an opcode outside them, an unknown storage type, a view past its
// storage, a compressed entry, a value that is no tensor.
#include "triad/io/torch_checkpoint.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "support/temp_dir.h"
#include "triad/core/error.h"
#include "triad/ops.h"

namespace triad::io {
namespace {

void put16(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v & 0xFF));
  s.push_back(static_cast<char>((v >> 8) & 0xFF));
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xFFFF);
  put16(s, v >> 16);
}
void put64(std::string& s, uint64_t v) {
  put32(s, static_cast<uint32_t>(v));
  put32(s, static_cast<uint32_t>(v >> 32));
}

// A zip archive of `entries` as torch.save writes one: each stored as it
// is (`method` 0), or claiming another method. `zip64`: as it writes one
// past 4 GiB, every size and offset in zip64's fields (the 32-bit ones
// saturated) and the directory found through zip64's record and locator.
std::string zip(const std::vector<std::pair<std::string, std::string>>& entries,
                uint16_t method = 0, bool zip64 = false) {
  const uint32_t full = 0xFFFFFFFFu;
  std::string out, directory;
  for (const auto& [name, data] : entries) {
    const auto offset = static_cast<uint32_t>(out.size());
    put32(out, 0x04034b50u);
    for (uint32_t v : {20u, 0u, static_cast<uint32_t>(method), 0u, 0u}) put16(out, v);
    put32(out, 0);  // crc (not checked)
    put32(out, static_cast<uint32_t>(data.size()));
    put32(out, static_cast<uint32_t>(data.size()));
    put16(out, static_cast<uint32_t>(name.size()));
    put16(out, 0);
    out += name + data;
    put32(directory, 0x02014b50u);
    for (uint32_t v : {20u, 20u, 0u, static_cast<uint32_t>(method), 0u, 0u}) put16(directory, v);
    put32(directory, 0);
    put32(directory, zip64 ? full : static_cast<uint32_t>(data.size()));
    put32(directory, zip64 ? full : static_cast<uint32_t>(data.size()));
    put16(directory, static_cast<uint32_t>(name.size()));
    put16(directory, zip64 ? 28 : 0);                 // extra
    for (int k = 0; k < 3; ++k) put16(directory, 0);  // comment, disk, internal attrs
    put32(directory, 0);                              // external attrs
    put32(directory, zip64 ? full : offset);
    directory += name;
    if (zip64) {  // sizes and offset, in zip64's order
      put16(directory, 1);
      put16(directory, 24);
      put64(directory, data.size());
      put64(directory, data.size());
      put64(directory, offset);
    }
  }
  const auto at = static_cast<uint32_t>(out.size());
  out += directory;
  if (zip64) {
    const auto record = static_cast<uint64_t>(out.size());
    put32(out, 0x06064b50u);
    put64(out, 44);
    put16(out, 45);
    put16(out, 45);
    put32(out, 0);
    put32(out, 0);
    put64(out, entries.size());
    put64(out, entries.size());
    put64(out, directory.size());
    put64(out, at);
    put32(out, 0x07064b50u);
    put32(out, 0);
    put64(out, record);
    put32(out, 1);
  }
  put32(out, 0x06054b50u);
  put16(out, 0);
  put16(out, 0);
  put16(out, zip64 ? 0xFFFF : static_cast<uint32_t>(entries.size()));
  put16(out, zip64 ? 0xFFFF : static_cast<uint32_t>(entries.size()));
  put32(out, zip64 ? full : static_cast<uint32_t>(directory.size()));
  put32(out, zip64 ? full : at);
  put16(out, 0);
  return out;
}

// Pickle pieces (protocol 2).
std::string str(const std::string& s) {
  std::string out = "X";
  put32(out, static_cast<uint32_t>(s.size()));
  return out + s;
}
std::string int1(int v) {
  return std::string("K") + static_cast<char>(v);
}
std::string ckpt_ints(const std::vector<int>& v) {
  std::string out = "(";
  for (int x : v) out += int1(x);
  return out + "t";
}

// {"w": a tensor of `size` and `stride` at `offset` in storage "key" of
// `numel` elements of `type`}, as torch.save pickles a state dict.
std::string tensor_dict(const std::string& type, int numel, int offset,
                        const std::vector<int>& size, const std::vector<int>& stride,
                        const std::string& key = "0") {
  return std::string("\x80\x02}(") + str("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" +
         str("storage") + "ctorch\n" + type + "\n" + str(key) + str("cpu") + int1(numel) + "tQ" +
         int1(offset) + ckpt_ints(size) + ckpt_ints(stride) +
         "\x89"
         "ccollections\nOrderedDict\n)RtRu.";
}

std::string floats(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const float f = static_cast<float>(i);
    out.append(reinterpret_cast<const char*>(&f), sizeof f);
  }
  return out;
}

std::string write_ckpt_file(testing::TempDir& dir, const std::string& name,
                            const std::string& bytes) {
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string checkpoint_error_of(const std::string& path) {
  try {
    TorchCheckpointFile f(path);
    f.read();
  } catch (const IoError& e) {
    return e.what();
  }
  return "no error";
}

// Plain and zip64 archives alike (a sharded checkpoint's parts are past
// 4 GiB, so zip64).
TEST(TorchCheckpoint, GathersTheViewItsPickleDescribes) {
  testing::TempDir dir;
  for (const bool zip64 : {false, true}) {
    SCOPED_TRACE(zip64 ? "zip64" : "zip");
    // Storage 0..7; the view: 2 x 3 from element 1 with strides (1, 2), the
    // transpose of a 3 x 2 matrix: [[1, 3, 5], [2, 4, 6]].
    const std::string path = write_ckpt_file(
        dir, zip64 ? "t64.bin" : "t.bin",
        zip({{"archive/data.pkl", tensor_dict("FloatStorage", 8, 1, {2, 3}, {1, 2})},
             {"archive/data/0", floats(8)},
             {"archive/version", "3\n"}},
            0, zip64));
    EXPECT_TRUE(is_torch_checkpoint(path));
    const TorchCheckpointFile f(path);
    EXPECT_EQ(f.shapes().at("w"), (Shape{2, 3}));
    const auto t = f.read();
    EXPECT_EQ(t.at("w").dtype(), DType::F32);
    EXPECT_EQ(to_double_vector(t.at("w")), (std::vector<double>{1, 3, 5, 2, 4, 6}));
    EXPECT_TRUE(f.read([](const std::string&) { return false; }).empty());
  }
}

TEST(TorchCheckpoint, WhatIsNoStateDictOfTensorsIsRefusedWithTheReason) {
  testing::TempDir dir;
  auto with_pickle = [&](const std::string& name, const std::string& pickle) {
    return write_ckpt_file(dir, name,
                           zip({{"archive/data.pkl", pickle}, {"archive/data/0", floats(8)}}));
  };
  const std::pair<std::string, std::string> cases[] = {
      {with_pickle("code.bin", std::string("\x80\x02") + "cos\nsystem\n(" + str("echo hi") + "tR."),
       "the pickle calls 'os.system', which a state dict is not rebuilt with; Triad runs no code "
       "from a checkpoint"},
      {with_pickle("inst.bin", "\x80\x02i"), "pickle opcode 0x69 at byte 2"},
      {with_pickle("complex.bin", tensor_dict("ComplexFloatStorage", 8, 0, {8}, {1})),
       "storage type 'torch.ComplexFloatStorage' is not supported"},
      {with_pickle("past.bin", tensor_dict("FloatStorage", 8, 3, {2, 3}, {3, 1})),
       "tensor 'w': its view reaches past its storage of 8 elements"},
      {with_pickle("missing.bin", tensor_dict("FloatStorage", 8, 0, {8}, {1}, "7")),
       "tensor 'w': its storage '7' is not in the archive"},
      {with_pickle("number.bin", std::string("\x80\x02}(") + str("w") + int1(3) + "u."),
       "'w' is not a tensor"},
      {with_pickle("list.bin", "\x80\x02]."), "holds no dictionary of tensors"},
      {with_pickle("short.bin", "\x80\x02}("), "the pickle ends early"},
      {write_ckpt_file(dir, "deflated.bin",
                       zip({{"archive/data.pkl", tensor_dict("FloatStorage", 8, 0, {8}, {1})}}, 8)),
       "entry 'archive/data.pkl' is compressed (method 8)"},
      {write_ckpt_file(dir, "plain.bin", "not a zip archive, but long enough to look for one"),
       "no zip directory: not a torch.save file"},
  };
  for (const auto& [path, why] : cases) {
    SCOPED_TRACE(path);
    const std::string m = checkpoint_error_of(path);
    EXPECT_NE(m.find(why), std::string::npos) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
  }
  EXPECT_FALSE(is_torch_checkpoint(dir.file("plain.bin")));
}

}  // namespace
}  // namespace triad::io
