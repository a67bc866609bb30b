#include "triad/io/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/temp_dir.h"
#include "triad/core/allocator.h"
#include "triad/io/gpt2_weights.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::io {
namespace {

using triad::testing::TempDir;

// Builds a raw file: 8-byte length, header text, data bytes.
std::vector<uint8_t> raw(const std::string& header, size_t data_bytes,
                         uint64_t claimed_len = UINT64_MAX) {
  const uint64_t n = claimed_len == UINT64_MAX ? header.size() : claimed_len;
  std::vector<uint8_t> b(8 + header.size() + data_bytes, 0x3f);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
  for (size_t i = 0; i < header.size(); ++i) b[8 + i] = static_cast<uint8_t>(header[i]);
  return b;
}

// `load` throws an IoError whose message holds `fragment`.
template <class Load>
void expect_load_error(Load load, const std::string& fragment) {
  try {
    load();
    FAIL() << "expected an IoError mentioning '" << fragment << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

void expect_io_error(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  try {
    parse_safetensors(bytes, "x.safetensors");
    FAIL() << "expected an IoError mentioning '" << fragment << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  TempDir dir;
  std::map<std::string, Tensor> tensors;
  tensors["a"] = randn({3, 4}, 1, 1);
  tensors["b"] = from_vector(std::vector<double>{1, 2, 3}, {3}, DType::BF16);
  tensors["c"] = from_vector(std::vector<int64_t>{5, -6}, {2}, DType::I64);
  tensors["d"] = from_vector(std::vector<double>{0.5}, {}, DType::F16);
  tensors["e"] = zeros({0, 3});
  tensors["f"] = transpose(randn({2, 3}, 1, 2, 1.0, DType::F64), 0, 1);  // non-contiguous
  const std::string path = dir.file("t.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}});
  Safetensors back = load_safetensors(path);
  EXPECT_EQ(back.metadata.at("format"), "pt");
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (auto& [name, t] : tensors) {
    const Tensor& u = back.tensors.at(name);
    EXPECT_EQ(u.shape(), t.shape()) << name;
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(to_double_vector(u), to_double_vector(t)) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Safetensors, RejectsMalformedFiles) {
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  EXPECT_NO_THROW(parse_safetensors(raw(ok, 16), "x.safetensors"));
  expect_io_error({1, 2, 3}, "too short");
  expect_io_error(raw(ok, 16, 200ull * 1024 * 1024), "exceeds the limit");
  expect_io_error(raw(ok, 16, ok.size() + 100), "past the end");
  expect_io_error(raw("{not json", 0), "not valid JSON");
  expect_io_error(raw("[1,2]", 0), "not a JSON object");
  expect_io_error(raw(R"({"w":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2), "dtype 'F8'");
  expect_io_error(raw(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
                  "needs 16 bytes");
  expect_io_error(raw(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 8),
                  "outside");
  expect_io_error(raw(R"({"w":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", 16),
                  "negative");
  expect_io_error(raw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                  "end < begin");
  expect_io_error(
      raw(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0),
      "overflows");
  expect_io_error(raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                  "contiguous");
  expect_io_error(raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12),
                  "contiguous");
  expect_io_error(raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8), "cover 4");
  expect_io_error(raw(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "needs dtype");
  expect_io_error(raw(R"({"__metadata__":{"k":1}})", 0), "not a string");
  EXPECT_THROW(load_safetensors("/nonexistent/file.safetensors"), IoError);
}

// A filter copies out only the tensors it names, and the header is checked
// whole all the same: a tensor left out still has to be well formed. An
// empty file is named, mapped as it is.
TEST(Safetensors, AFilterCopiesOutOnlyTheWantedTensorsAndChecksThemAll) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  save_safetensors(path, {{"keep", randn({2, 3}, 1)}, {"vision.skip", randn({4}, 2)}});
  const TensorFilter keep = [](const std::string& name) { return name.rfind("vision.", 0) != 0; };
  const Safetensors some = load_safetensors(path, keep);
  ASSERT_EQ(some.tensors.size(), 1u);
  EXPECT_EQ(to_double_vector(some.tensors.at("keep")), to_double_vector(randn({2, 3}, 1)));
  // The header's shapes are all listed, copied out or not.
  EXPECT_EQ(some.shapes, (std::map<std::string, Shape>{{"keep", {2, 3}}, {"vision.skip", {4}}}));
  const std::vector<uint8_t> bad =
      raw(R"({"keep":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
          R"("vision.skip":{"dtype":"F32","shape":[2],"data_offsets":[4,8]}})",
          8);
  try {
    parse_safetensors(bad.data(), bad.size(), "x.safetensors", keep);
    FAIL() << "a malformed tensor that was left out passed";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'vision.skip'"), std::string::npos) << e.what();
  }
  const std::string empty_file = dir.file("empty.safetensors");
  std::ofstream(empty_file).flush();
  try {
    load_safetensors(empty_file);
    FAIL() << "an empty file loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("too short"), std::string::npos) << e.what();
  }
}

// A mapped file hands out pieces of a tensor (a ZeRO-1 flat buffer's
// parameter) without copying the rest; a range outside it is named.
TEST(Safetensors, AMappedFileReadsARangeOfElements) {
  TempDir dir;
  const std::string path = dir.file("flat.safetensors");
  const Tensor flat = randn({3, 4}, 5);
  save_safetensors(path, {{"zero/m", flat}});
  const SafetensorsFile file(path);
  EXPECT_EQ(file.shapes().at("zero/m"), (Shape{3, 4}));
  const auto all = to_double_vector(flat);
  const Tensor piece = file.read_elements("zero/m", 5, 4);
  EXPECT_EQ(piece.shape(), (Shape{4}));
  EXPECT_EQ(to_double_vector(piece), std::vector<double>(all.begin() + 5, all.begin() + 9));
  EXPECT_EQ(file.read_elements("zero/m", 12, 0).numel(), 0);
  expect_load_error([&] { file.read_elements("zero/m", 9, 4); },
                    "elements [9, +4) lie outside tensor 'zero/m' (12 elements)");
  expect_load_error([&] { file.read_elements("zero/v", 0, 1); }, "no tensor 'zero/v'");
}

// A writer takes the tensors one at a time in its layout's order (here not
// the names' order), the header written first; the file reads back as
// save_safetensors' does. A tensor out of order, unlike its layout, or a
// writer left unfinished leaves neither the file nor its temporary behind.
TEST(Safetensors, AWriterTakesOneTensorAtATimeInItsOrder) {
  TempDir dir;
  const Tensor a = randn({2, 3}, 1), b = randn({4}, 2, 1, 1.0, DType::F64);
  const std::vector<std::pair<std::string, TensorLayout>> layout{{"b", {{4}, DType::F64}},
                                                                 {"a", {{2, 3}, DType::F32}}};
  const std::string path = dir.file("w.safetensors");
  {
    SafetensorsWriter w(path, layout, {{"k", "v"}});
    EXPECT_EQ(w.next(), "b");
    w.write("b", b);
    EXPECT_FALSE(std::filesystem::exists(path));  // until finish()
    w.write("a", a);
    EXPECT_EQ(w.next(), "");
    w.finish();
  }
  const Safetensors back = load_safetensors(path);
  EXPECT_EQ(to_double_vector(back.tensors.at("a")), to_double_vector(a));
  EXPECT_EQ(to_double_vector(back.tensors.at("b")), to_double_vector(b));
  EXPECT_EQ(back.metadata.at("k"), "v");
  auto expect_refused = [&](const std::function<void(SafetensorsWriter&)>& use,
                            const std::string& want) {
    const std::string broken = dir.file("broken.safetensors");
    try {
      SafetensorsWriter w(broken, layout);
      use(w);
      FAIL() << "no error for " << want;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(broken)) << want;
    EXPECT_FALSE(std::filesystem::exists(broken + ".tmp")) << want;
  };
  expect_refused([&](SafetensorsWriter& w) { w.write("a", a); },
                 "tensor 'a' written where the layout of");
  expect_refused([&](SafetensorsWriter& w) { w.write("b", randn({5}, 2, 1, 1.0, DType::F64)); },
                 "tensor 'b' was to be [4] F64 but is [5] F64");
  expect_refused([&](SafetensorsWriter& w) { w.write("b", randn({4}, 2)); },
                 "tensor 'b' was to be [4] F64 but is [4] F32");
  expect_refused(
      [&](SafetensorsWriter& w) {
        w.write("b", b);
        w.finish();
      },
      "finished after 1 of its 2 tensors (next: 'a')");
  {
    SafetensorsWriter w(dir.file("dropped.safetensors"), layout);
    w.write("b", b);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("dropped.safetensors.tmp")));
}

// Saving in GPT-2's layout transposes the Conv1D weights one at a time: the
// host holds the state dict and one converted tensor, not a second model.
TEST(Gpt2Weights, SavingHoldsOneConvertedTensorAtATime) {
  TempDir dir;
  const nn::GptConfig cfg{.n_layer = 8, .n_head = 2, .d_model = 32, .vocab_size = 11, .seq_len = 5};
  const nn::Gpt model(cfg, 3);
  const nn::StateDict state = model.state_dict();
  int64_t largest = 0, total = 0;
  for (const auto& [name, t] : state) {
    largest = std::max(largest, static_cast<int64_t>(t.nbytes()));
    total += static_cast<int64_t>(t.nbytes());
  }
  Allocator& host = cpu_allocator();
  const int64_t before = host.stats().allocated;
  host.reset_peak();
  const std::string path = dir.file("gpt2.safetensors");
  save_gpt2_state_dict(state, cfg, path);
  const int64_t peak = host.stats().peak_allocated - before;
  EXPECT_LE(peak, 2 * largest) << "of a " << total << "-byte model";
  nn::Gpt loaded(cfg, 4);
  load_gpt2_safetensors(loaded, path);
  for (const auto& [name, t] : state) {
    EXPECT_EQ(to_double_vector(loaded.state_dict().at(name)), to_double_vector(t)) << name;
  }
}

TEST(Gpt2Weights, SavedFileUsesGpt2NamesAndLayouts) {
  TempDir dir;
  nn::GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5};
  nn::Gpt model(cfg, 3);
  const std::string path = dir.file("gpt2.safetensors");
  save_gpt2_safetensors(model, path);
  Safetensors f = load_safetensors(path);
  EXPECT_EQ(f.tensors.at("h.1.attn.c_attn.weight").shape(), (Shape{8, 24}));  // [in, out]
  EXPECT_EQ(f.tensors.at("h.0.mlp.c_proj.weight").shape(), (Shape{32, 8}));
  EXPECT_EQ(f.tensors.at("wte.weight").shape(), (Shape{11, 8}));
  EXPECT_EQ(f.tensors.at("ln_f.bias").shape(), (Shape{8}));
  // Transposed values: stored[i][j] == ours[j][i].
  auto ours = to_double_vector(model.state_dict().at("h.1.attn.c_attn.weight"));
  auto stored = to_double_vector(f.tensors.at("h.1.attn.c_attn.weight"));
  EXPECT_EQ(stored[1 * 24 + 5], ours[5 * 8 + 1]);

  // Loading (with a "transformer." prefix and mask buffers) restores the model.
  std::map<std::string, Tensor> prefixed;
  for (auto& [k, v] : f.tensors) prefixed["transformer." + k] = v;
  prefixed["transformer.h.0.attn.bias"] = zeros({1, 1, 5, 5});
  save_safetensors(path, prefixed);
  nn::Gpt other(cfg, 99);
  load_gpt2_safetensors(other, path);
  for (auto& [name, t] : model.state_dict()) {
    EXPECT_EQ(to_double_vector(t), to_double_vector(other.state_dict().at(name))) << name;
  }
}

TEST(Gpt2Weights, ShapeMismatchNamesTensorAndShapes) {
  TempDir dir;
  nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5};
  nn::Gpt model(cfg, 3);
  const std::string path = dir.file("gpt2.safetensors");
  save_gpt2_safetensors(model, path);
  cfg.vocab_size = 12;
  nn::Gpt bigger(cfg, 3);
  try {
    load_gpt2_safetensors(bigger, path);
    FAIL();
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("wte.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[11, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find("[12, 8]"), std::string::npos) << m;
  }
}

// A file of another width or depth says so, instead of naming the first
// tensor in name order that differs (c_attn's bias, or a block missing).
TEST(Gpt2Weights, AnotherWidthOrDepthIsNamed) {
  TempDir dir;
  const nn::GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5};
  const std::string path = dir.file("gpt2.safetensors");
  save_gpt2_safetensors(nn::Gpt(cfg, 3), path);
  auto expect_error = [&](nn::GptConfig other, const std::string& want) {
    nn::Gpt m(other, 4);
    expect_load_error([&] { load_gpt2_safetensors(m, path); }, want);
  };
  nn::GptConfig narrower = cfg;
  narrower.d_model = 4;
  expect_error(narrower,
               "the file's model is 8 wide (wte.weight [11, 8]) but the configured model.d_model "
               "is 4");
  nn::GptConfig deeper = cfg;
  deeper.n_layer = 3;
  expect_error(deeper, "the file holds 2 blocks but the configured model.n_layer is 3");
  nn::GptConfig shallower = cfg;
  shallower.n_layer = 1;
  expect_error(shallower, "the file holds 2 blocks but the configured model.n_layer is 1");
}

// A pipeline rank reads its own blocks: the others' tensors are neither
// returned nor checked, while the embedding, the final norm and the file's
// depth and width always are.
TEST(Gpt2Weights, ARankReadsOnlyTheBlocksItNames) {
  TempDir dir;
  const nn::GptConfig cfg{.n_layer = 3, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5};
  const nn::Gpt model(cfg, 3);
  const std::string path = dir.file("gpt2.safetensors");
  save_gpt2_safetensors(model, path);
  const std::set<int64_t> middle{1};
  const nn::StateDict got = load_gpt2_state_dict(path, nn::gpt_parameter_shapes(cfg), &middle);
  const nn::StateDict all = model.state_dict();
  size_t expected = 0;
  for (const auto& [name, t] : all) {
    const bool wanted = name.rfind("h.", 0) != 0 || name.rfind("h.1.", 0) == 0;
    expected += wanted;
    EXPECT_EQ(got.count(name), wanted ? 1u : 0u) << name;
    if (wanted && got.count(name)) {
      EXPECT_EQ(to_double_vector(got.at(name)), to_double_vector(t)) << name;
    }
  }
  EXPECT_EQ(got.size(), expected);
  EXPECT_TRUE(got.count("wte.weight") && got.count("ln_f.weight") && got.count("wpe.weight"));
  // Depth is checked from the file's names even so.
  nn::GptConfig deeper = cfg;
  deeper.n_layer = 4;
  expect_load_error([&] { load_gpt2_state_dict(path, nn::gpt_parameter_shapes(deeper), &middle); },
                    "the file holds 3 blocks but the configured model.n_layer is 4");
  // A tensor missing from block 0 is found by the rank reading block 0 only.
  nn::StateDict holed = all;
  holed.erase("h.0.mlp.c_fc.weight");
  const std::string holed_path = dir.file("holed.safetensors");
  save_gpt2_state_dict(holed, cfg, holed_path);
  EXPECT_EQ(load_gpt2_state_dict(holed_path, nn::gpt_parameter_shapes(cfg), &middle)
                .count("h.1.mlp.c_fc.weight"),
            1u);
  const std::set<int64_t> first{0};
  expect_load_error(
      [&] { load_gpt2_state_dict(holed_path, nn::gpt_parameter_shapes(cfg), &first); },
      "'h.0.mlp.c_fc.weight' is missing");
}

// The blocks of each part read, in the order read_gpt2_weights hands the
// parts over (-1: the tensors outside the blocks).
std::vector<std::set<int64_t>> parts_read(const std::string& path,
                                          const std::map<std::string, Shape>& expected,
                                          const std::set<int64_t>* blocks, nn::StateDict* all) {
  std::vector<std::set<int64_t>> parts;
  read_gpt2_weights(path, expected, blocks, [&](nn::StateDict&& part) {
    std::set<int64_t> in;
    for (const auto& [name, t] : part) {
      in.insert(name.rfind("h.", 0) == 0 ? std::stoll(name.substr(2)) : -1);
      if (all) all->emplace(name, t);
    }
    parts.push_back(in);
  });
  return parts;
}

// A reader gets the file part by part (the tensors outside the blocks, then
// one block at a time): a tensor-parallel rank cuts its shards from each and
// never holds the whole model. The parts add up to the whole file, and a
// broken block stops the reading after the blocks before it.
TEST(Gpt2Weights, TheFileIsHandedOverOneBlockAtATime) {
  TempDir dir;
  const nn::GptConfig cfg{.n_layer = 3, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5};
  const nn::Gpt model(cfg, 3);
  const std::string path = dir.file("gpt2.safetensors");
  save_gpt2_safetensors(model, path);
  const auto shapes = nn::gpt_parameter_shapes(cfg);
  nn::StateDict all;
  EXPECT_EQ(parts_read(path, shapes, nullptr, &all),
            (std::vector<std::set<int64_t>>{{-1}, {0}, {1}, {2}}));
  const nn::StateDict want = model.state_dict();
  ASSERT_EQ(all.size(), want.size());
  for (const auto& [name, t] : want) {
    EXPECT_EQ(to_double_vector(all.at(name)), to_double_vector(t)) << name;
  }
  const std::set<int64_t> last_two{1, 2};
  EXPECT_EQ(parts_read(path, shapes, &last_two, nullptr),
            (std::vector<std::set<int64_t>>{{-1}, {1}, {2}}));
  // Block 2's MLP of another shape: blocks 0 and 1 were handed over first.
  nn::StateDict broken = want;
  broken["h.2.mlp.c_proj.bias"] = randn({9}, 1, 1);
  const std::string broken_path = dir.file("broken.safetensors");
  save_gpt2_state_dict(broken, cfg, broken_path);
  int handed = 0;
  expect_load_error(
      [&] { read_gpt2_weights(broken_path, shapes, nullptr, [&](nn::StateDict&&) { ++handed; }); },
      "tensor 'h.2.mlp.c_proj.bias' has shape [9] but the configured model needs [8]");
  EXPECT_EQ(handed, 3);
  // load_gpt2_safetensors reads everything before it changes the model.
  nn::Gpt kept(cfg, 4);
  const auto before = to_double_vector(kept.state_dict().at("h.0.mlp.c_fc.weight"));
  expect_load_error([&] { load_gpt2_safetensors(kept, broken_path); }, "'h.2.mlp.c_proj.bias'");
  EXPECT_EQ(to_double_vector(kept.state_dict().at("h.0.mlp.c_fc.weight")), before);
}

// Grouped-query attention's narrower c_attn travels in GPT-2's layout with
// n_kv_head in the metadata; a model with other key/value heads is told
// which setting to check.
TEST(Gpt2Weights, GroupedQueryAttentionRoundTripsAndAMismatchIsNamed) {
  TempDir dir;
  nn::GptConfig cfg{
      .n_layer = 1, .n_head = 4, .n_kv_head = 2, .d_model = 16, .vocab_size = 11, .seq_len = 5};
  const nn::Gpt model(cfg, 3);
  const std::string path = dir.file("gqa.safetensors");
  save_gpt2_safetensors(model, path);
  const Safetensors f = load_safetensors(path);
  EXPECT_EQ(f.metadata.at("n_kv_head"), "2");
  EXPECT_EQ(f.tensors.at("h.0.attn.c_attn.weight").shape(), (Shape{16, 32}));  // (in, out)
  nn::Gpt back(cfg, 99);
  load_gpt2_safetensors(back, path);
  EXPECT_EQ(to_double_vector(back.state_dict().at("h.0.attn.c_attn.weight")),
            to_double_vector(model.state_dict().at("h.0.attn.c_attn.weight")));
  nn::GptConfig mha = cfg;
  mha.n_kv_head = 0;
  nn::Gpt other(mha, 1);
  try {
    load_gpt2_safetensors(other, path);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("projections are 8 wide, the configured model's 16: "
                                         "check model.n_kv_head"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(load_safetensors([&] {
                 const std::string p = dir.file("mha.safetensors");
                 save_gpt2_safetensors(other, p);
                 return p;
               }())
                   .metadata.count("n_kv_head"));
}

// An untied head travels as lm_head.weight. A tied model accepts a file's
// lm_head only as the copy of wte some exports carry; either side missing
// what the other has is named with the setting to change.
TEST(Gpt2Weights, AnUntiedHeadRoundTripsAndMismatchesAreNamed) {
  TempDir dir;
  nn::GptConfig cfg{.n_layer = 1, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5};
  nn::GptConfig ucfg = cfg;
  ucfg.tie_embeddings = false;
  const nn::Gpt untied(ucfg, 3);
  const std::string upath = dir.file("untied.safetensors");
  save_gpt2_safetensors(untied, upath);
  const Safetensors f = load_safetensors(upath);
  EXPECT_EQ(f.tensors.at("lm_head.weight").shape(), (Shape{11, 8}));
  EXPECT_EQ(f.metadata.at("tie_embeddings"), "false");
  nn::Gpt back(ucfg, 99);
  load_gpt2_safetensors(back, upath);
  EXPECT_EQ(to_double_vector(back.state_dict().at("lm_head.weight")),
            to_double_vector(untied.state_dict().at("lm_head.weight")));
  auto expect_io_error = [](const std::function<void()>& fn, const std::string& want) {
    try {
      fn();
      FAIL() << "no error";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  // A tied model and an untied file, and the reverse.
  nn::Gpt tied(cfg, 3);
  expect_io_error([&] { load_gpt2_safetensors(tied, upath); }, "model.tie_embeddings: false");
  const std::string tpath = dir.file("tied.safetensors");
  save_gpt2_safetensors(tied, tpath);
  EXPECT_FALSE(load_safetensors(tpath).metadata.count("tie_embeddings"));
  nn::Gpt other(ucfg, 3);
  expect_io_error([&] { load_gpt2_safetensors(other, tpath); },
                  "'lm_head.weight' is missing (its output head is tied to wte? Set "
                  "model.tie_embeddings: true)");
  // A tied file carrying lm_head = wte (as Hugging Face exports do) loads.
  std::map<std::string, Tensor> with_copy = load_safetensors(tpath).tensors;
  with_copy["lm_head.weight"] = clone(with_copy.at("wte.weight"));
  save_safetensors(tpath, with_copy);
  nn::Gpt again(cfg, 99);
  load_gpt2_safetensors(again, tpath);
  EXPECT_EQ(to_double_vector(again.state_dict().at("wte.weight")),
            to_double_vector(tied.state_dict().at("wte.weight")));
}

// Hugging Face's LLaMA layout: separate q/k/v and gate/up projections under
// their names load into the same model; grouped-query attention, a missing
// and an unknown tensor are named.
TEST(HfLlamaWeights, LoadIntoTheSameModelAndMismatchesAreNamed) {
  TempDir dir;
  nn::GptConfig cfg{.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5};
  cfg.position_embedding = nn::PositionEmbedding::Rotary;
  cfg.activation = nn::Activation::SwiGlu;
  cfg.ffn_hidden_size = 12;
  cfg.normalization = nn::Normalization::RmsNorm;
  cfg.linear_bias = false;
  cfg.tie_embeddings = false;
  const nn::Gpt model(cfg, 3);
  const nn::StateDict sd = model.state_dict();
  std::map<std::string, Tensor> hf{{"model.embed_tokens.weight", sd.at("wte.weight")},
                                   {"model.norm.weight", sd.at("ln_f.weight")},
                                   {"lm_head.weight", sd.at("lm_head.weight")}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "h." + std::to_string(i) + ".",
                      q = "model.layers." + std::to_string(i) + ".";
    const Tensor qkv = sd.at(p + "attn.c_attn.weight"), fc = sd.at(p + "mlp.c_fc.weight");
    hf[q + "self_attn.q_proj.weight"] = contiguous(narrow(qkv, 0, 0, 8));
    hf[q + "self_attn.k_proj.weight"] = contiguous(narrow(qkv, 0, 8, 8));
    hf[q + "self_attn.v_proj.weight"] = contiguous(narrow(qkv, 0, 16, 8));
    hf[q + "self_attn.o_proj.weight"] = sd.at(p + "attn.c_proj.weight");
    hf[q + "mlp.gate_proj.weight"] = contiguous(narrow(fc, 0, 0, 12));
    hf[q + "mlp.up_proj.weight"] = contiguous(narrow(fc, 0, 12, 12));
    hf[q + "mlp.down_proj.weight"] = sd.at(p + "mlp.c_proj.weight");
    hf[q + "input_layernorm.weight"] = sd.at(p + "ln_1.weight");
    hf[q + "post_attention_layernorm.weight"] = sd.at(p + "ln_2.weight");
  }
  const std::string path = dir.file("hf.safetensors");
  save_safetensors(path, hf);
  nn::Gpt loaded(cfg, 99);
  load_gpt2_safetensors(loaded, path);
  for (const auto& [name, t] : sd)
    EXPECT_EQ(to_double_vector(loaded.state_dict().at(name)), to_double_vector(t)) << name;
  // Sharded (Hugging Face's model.safetensors.index.json beside its files):
  // through the index or its directory.
  {
    std::map<std::string, Tensor> first, second;
    // The weight_map's entries, layer 1 in the shard named `second_file`.
    const auto weight_map = [&](const std::string& second_file) {
      std::string map;
      for (const auto& [name, t] : hf) {
        const bool a = name.find("layers.1.") == std::string::npos;
        map += std::string(map.empty() ? "" : ", ") + "\"" + name + "\": \"" +
               (a ? "model-00001-of-00002.safetensors" : second_file) + "\"";
      }
      return map;
    };
    const std::string map = weight_map("model-00002-of-00002.safetensors");
    for (const auto& [name, t] : hf)
      (name.find("layers.1.") == std::string::npos ? first : second)[name] = t;
    const std::string shards = dir.file("sharded");
    std::filesystem::create_directories(shards);
    save_safetensors(shards + "/model-00001-of-00002.safetensors", first);
    save_safetensors(shards + "/model-00002-of-00002.safetensors", second);
    std::ofstream(shards + "/model.safetensors.index.json")
        << "{\"metadata\": {}, \"weight_map\": {" << map << "}}";
    for (const std::string& from : {shards + "/model.safetensors.index.json", shards}) {
      nn::Gpt m(cfg, 98);
      load_gpt2_safetensors(m, from);
      EXPECT_EQ(to_double_vector(m.state_dict().at("h.1.attn.c_attn.weight")),
                to_double_vector(sd.at("h.1.attn.c_attn.weight")))
          << from;
    }
    // Part by part, each layer's projections stacked within its part.
    nn::StateDict parts;
    EXPECT_EQ(parts_read(shards, nn::gpt_parameter_shapes(cfg), nullptr, &parts),
              (std::vector<std::set<int64_t>>{{-1}, {0}, {1}}));
    EXPECT_EQ(to_double_vector(parts.at("h.1.mlp.c_fc.weight")),
              to_double_vector(sd.at("h.1.mlp.c_fc.weight")));
    // Shards named outside the index's directory: a path, "..", an absolute
    // name (each would open a file the checkpoint does not hold).
    std::filesystem::copy_file(shards + "/model-00002-of-00002.safetensors",
                               dir.file("model-00002-of-00002.safetensors"));
    for (const std::string& f :
         {std::string("../model-00002-of-00002.safetensors"),
          dir.file("model-00002-of-00002.safetensors"), std::string(".."), std::string("")}) {
      std::ofstream(shards + "/model.safetensors.index.json")
          << "{\"weight_map\": {" << weight_map(f) << "}}";
      nn::Gpt m(cfg, 98);
      try {
        load_gpt2_safetensors(m, shards);
        FAIL() << "no error for '" << f << "'";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("is '" + f +
                                             "', expected the name of a file beside the index"),
                  std::string::npos)
            << e.what();
      }
    }
    // The index naming a tensor its shard lacks.
    std::ofstream(shards + "/model.safetensors.index.json")
        << "{\"weight_map\": {" << map
        << ", \"model.layers.9.mlp.up_proj.weight\": \"model-00002-of-00002.safetensors\"}}";
    nn::Gpt m(cfg, 98);
    try {
      load_gpt2_safetensors(m, shards);
      FAIL() << "no error";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("lacks 'model.layers.9.mlp.up_proj.weight'"),
                std::string::npos)
          << e.what();
    }
  }
  auto expect_error = [&](std::map<std::string, Tensor> tensors, const std::string& want) {
    save_safetensors(path, tensors);
    nn::Gpt m(cfg, 1);
    try {
      load_gpt2_safetensors(m, path);
      FAIL() << "no error for " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  // A grouped-query file (one key/value head of 4 for the 2 query heads)
  // into the configured multi-head model names the setting; k_proj and
  // v_proj of different heights are refused.
  auto gqa = hf;
  for (const char* kv : {"k_proj", "v_proj"}) {
    for (int i = 0; i < 2; ++i) {
      const std::string key = "model.layers." + std::to_string(i) + ".self_attn." + kv + ".weight";
      gqa[key] = contiguous(narrow(gqa.at(key), 0, 0, 4));
    }
  }
  expect_error(gqa,
               "its key and value projections are 4 wide, the configured model's 8: check "
               "model.n_kv_head");
  auto uneven = hf;
  uneven["model.layers.1.self_attn.k_proj.weight"] =
      contiguous(narrow(uneven.at("model.layers.1.self_attn.k_proj.weight"), 0, 0, 4));
  expect_error(uneven, "expected k_proj and v_proj alike");
  // The model it fits: n_kv_head 1 loads those projections as they are.
  {
    nn::GptConfig mqa = cfg;
    mqa.n_kv_head = 1;
    save_safetensors(path, gqa);
    nn::Gpt m(mqa, 5);
    load_gpt2_safetensors(m, path);
    const Tensor qkv = m.state_dict().at("h.1.attn.c_attn.weight");
    ASSERT_EQ(qkv.shape(), (Shape{16, 8}));
    EXPECT_EQ(to_double_vector(narrow(qkv, 0, 8, 4)),
              to_double_vector(gqa.at("model.layers.1.self_attn.k_proj.weight")));
    EXPECT_EQ(to_double_vector(narrow(qkv, 0, 12, 4)),
              to_double_vector(gqa.at("model.layers.1.self_attn.v_proj.weight")));
  }
  auto missing = hf;
  missing.erase("model.layers.0.mlp.up_proj.weight");
  expect_error(missing, "'model.layers.0.mlp.up_proj.weight' is missing");
  auto extra = hf;
  extra["model.layers.1.self_attn.sinks"] = sd.at("ln_f.weight");
  expect_error(extra, "unexpected tensor 'model.layers.1.self_attn.sinks'");
  // Qwen3's head norms come in pairs; both into a model without
  // model.qk_norm name the setting.
  auto half_normed = hf;
  half_normed["model.layers.1.self_attn.q_norm.weight"] = sd.at("ln_f.weight");
  expect_error(half_normed, "'model.layers.1.self_attn.k_norm.weight' is missing");
  auto normed = half_normed;
  normed["model.layers.1.self_attn.k_norm.weight"] = sd.at("ln_f.weight");
  expect_error(normed, "set model.qk_norm: true");
  EXPECT_THROW(hf_llama_to_triad({{"model.embed_tokens.weight", sd.at("wte.weight")},
                                  {"model.layers.x.mlp.up_proj.weight", sd.at("wte.weight")}}),
               IoError);
  // A layer's number is digits as transformers writes them: "1x", "01" or
  // "+1" name no layer (std::stoll once read them all as layer 1).
  for (const char* layer : {"1x", "01", "+1", " 1"}) {
    auto renamed = hf;
    const std::string name = std::string("model.layers.") + layer + ".mlp.up_proj.weight";
    renamed[name] = renamed.at("model.layers.1.mlp.up_proj.weight");
    renamed.erase("model.layers.1.mlp.up_proj.weight");
    expect_error(renamed, "tensor '" + name + "' has no layer number");
  }
}

}  // namespace
}  // namespace triad::io
