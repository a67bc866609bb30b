// fp8 block-quantized Hugging Face weights (DeepSeek-V3's and Kimi K2's
// published files): F8_E4M3 bytes decoded exactly, and each weight times its
// blocks' scales (weight_scale_inv) as init.from reads it: the same model as
// the dequantized weights stored in f32.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "support/temp_dir.h"
#include "support/tiny_deepseek.h"
#include "triad/core/error.h"
#include "triad/io/gpt2_weights.h"
#include "triad/io/hf_config.h"
#include "triad/io/hf_export.h"
#include "triad/io/safetensors.h"
#include "triad/nn/gpt.h"
#include "triad/ops.h"

namespace triad::io {
namespace {

// E4M3FN's values written out: sign, exponent (bias 7) and mantissa; the
// smallest subnormal 2^-9, the largest 448, 0x7F and 0xFF NaN.
TEST(Fp8, EveryE4m3ByteDecodesToItsValue) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x3C), 1.5f);
  EXPECT_EQ(e4m3_to_float(0xC0), -2.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  // Every other byte: increasing with the unsigned byte below 0x7F, its
  // negative above.
  for (int b = 1; b < 0x7F; ++b) {
    EXPECT_GT(e4m3_to_float(static_cast<uint8_t>(b)), e4m3_to_float(static_cast<uint8_t>(b - 1)))
        << b;
    EXPECT_EQ(e4m3_to_float(static_cast<uint8_t>(b | 0x80)),
              -e4m3_to_float(static_cast<uint8_t>(b)))
        << b;
  }
}

// A safetensors file of f32 tensors and F8_E4M3 ones (given as bytes).
void write_mixed_safetensors(
    const std::string& path, const std::map<std::string, Tensor>& f32,
    const std::map<std::string, std::pair<Shape, std::vector<uint8_t>>>& f8) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<char> data;
  auto add = [&](const std::string& name, const char* dtype, const Shape& shape, const char* bytes,
                 size_t n) {
    header[name] = {
        {"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + n}}};
    data.insert(data.end(), bytes, bytes + n);
  };
  for (const auto& [name, t] : f32) {
    const Tensor c = contiguous(t.detach());
    add(name, "F32", c.shape(), static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  for (const auto& [name, q] : f8)
    add(name, "F8_E4M3", q.first, reinterpret_cast<const char*>(q.second.data()), q.second.size());
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// A LLaMA with latent attention and DeepSeek's mixture, written by the
// exporter, then rewritten as DeepSeek-V3's fp8 files are: every 2-D weight
// of the blocks as F8_E4M3 bytes with a scale per block of 5 x 7 (the last
// blocks partial), beside the same model stored dequantized in f32. Both
// read to the same parameters, bit for bit.
TEST(Fp8, BlockQuantizedWeightsReadAsTheirDequantizedValues) {
  nn::GptConfig c{.n_layer = 2, .n_head = 4, .d_model = 16, .vocab_size = 19, .seq_len = 12};
  c.position_embedding = nn::PositionEmbedding::Rotary;
  c.activation = nn::Activation::SwiGlu;
  c.ffn_hidden_size = 24;
  c.normalization = nn::Normalization::RmsNorm;
  c.linear_bias = false;
  c.tie_embeddings = false;
  c.mla = testing::tiny_latent_attention();
  c.moe = testing::tiny_deepseek_mixture();
  const nn::Gpt model(c, 3);
  testing::TempDir dir;
  save_hf_model(model.state_dict(), c, dir.file("written"));
  const Safetensors written = load_safetensors(dir.file("written/model.safetensors"));
  std::map<std::string, Tensor> plain, kept;
  std::map<std::string, std::pair<Shape, std::vector<uint8_t>>> f8;
  const int64_t R = 5, C = 7;
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  int quantized = 0;
  for (const auto& [name, t] : written.tensors) {
    const bool matrix = t.dim() == 2 && name.rfind("model.layers.", 0) == 0 &&
                        name.find("layernorm") == std::string::npos;
    if (!matrix) {
      plain[name] = kept[name] = t;
      continue;
    }
    ++quantized;
    const int64_t rows = t.size(0), cols = t.size(1);
    const int64_t br = (rows + R - 1) / R, bc = (cols + C - 1) / C;
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols));
    std::vector<float> scales(static_cast<size_t>(br * bc)), values(bytes.size());
    for (float& s : scales) s = 0.001f * static_cast<float>(1 + next() % 1000);
    for (size_t i = 0; i < bytes.size(); ++i) {
      uint8_t b;
      do {
        b = static_cast<uint8_t>(next() & 0xFF);
      } while ((b & 0x7F) == 0x7F);  // (no NaN)
      bytes[i] = b;
      const int64_t r = static_cast<int64_t>(i) / cols, col = static_cast<int64_t>(i) % cols;
      values[i] = e4m3_to_float(b) * scales[static_cast<size_t>((r / R) * bc + col / C)];
    }
    f8[name] = {t.shape(), bytes};
    kept[name + "_scale_inv"] = from_vector(scales, {br, bc});
    plain[name] = from_vector(values, t.shape());
  }
  EXPECT_GT(quantized, 10);
  namespace fs = std::filesystem;
  for (const char* d : {"fp8", "f32"}) fs::create_directory(dir.file(d));
  std::ifstream written_config(dir.file("written/config.json"));
  nlohmann::json config = nlohmann::json::parse(written_config);
  std::ofstream(dir.file("f32/config.json")) << config.dump();
  config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                   {"fmt", "e4m3"},
                                   {"quant_method", "fp8"},
                                   {"weight_block_size", {R, C}}};
  std::ofstream(dir.file("fp8/config.json")) << config.dump();
  save_safetensors(dir.file("f32/model.safetensors"), plain);
  write_mixed_safetensors(dir.file("fp8/model.safetensors"), kept, f8);

  const nn::GptConfig read = load_hf_config(dir.file("fp8"));
  EXPECT_EQ(read.mla, c.mla);
  nn::Gpt from_fp8(read, 1), from_f32(read, 2);
  load_gpt2_safetensors(from_fp8, dir.file("fp8"));
  load_gpt2_safetensors(from_f32, dir.file("f32"));
  const nn::StateDict a = from_fp8.state_dict(), b = from_f32.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a)
    EXPECT_EQ(to_double_vector(t), to_double_vector(b.at(name))) << name;

  // Scales of another shape (blocks of 128, the default without
  // weight_block_size) are named.
  config["quantization_config"].erase("weight_block_size");
  std::ofstream(dir.file("fp8/config.json")) << config.dump();
  nn::Gpt again(read, 1);
  try {
    load_gpt2_safetensors(again, dir.file("fp8"));
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("one scale per block of 128 x 128"), std::string::npos)
        << e.what();
  }
  // Other quantization schemes are refused by name.
  config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  std::ofstream(dir.file("fp8/config.json")) << config.dump();
  try {
    (void)load_hf_config(dir.file("fp8"));
    FAIL() << "expected NotSupportedError";
  } catch (const NotSupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("'quantization_config'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Triad reads fp8 (e4m3) block-quantized weights"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace triad::io
