#include "triad/io/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "data/mapped_file.h"
#include "triad/backend/backend.h"
#include "triad/ops/elementwise.h"

namespace triad::io {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw IoError("safetensors '" + source + "': " + what);
}

// The dtype a tensor is read as: its own, or f32 for F8_E4M3 (`e4m3` set:
// one byte an element in the file).
DType parse_dtype(const std::string& name, const std::string& source, const std::string& tensor,
                  bool& e4m3) {
  static const std::map<std::string, DType> kAllowed{{"F32", DType::F32},   {"F64", DType::F64},
                                                     {"BF16", DType::BF16}, {"F16", DType::F16},
                                                     {"I32", DType::I32},   {"I64", DType::I64}};
  e4m3 = name == "F8_E4M3";
  if (e4m3) return DType::F32;
  auto it = kAllowed.find(name);
  if (it == kAllowed.end()) {
    fail(source, "tensor '" + tensor + "' has dtype '" + name +
                     "' (supported: F32, F64, BF16, F16, I32, I64, F8_E4M3)");
  }
  return it->second;
}

// n bytes of F8_E4M3 (OCP's E4M3FN: a sign, 4 exponent bits biased by 7, 3
// mantissa bits, no infinities, S.1111.111 NaN) as f32, each exactly.
void decode_e4m3(const uint8_t* in, float* out, uint64_t n) {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b)
      t[static_cast<size_t>(b)] = e4m3_to_float(static_cast<uint8_t>(b));
    return t;
  }();
  for (uint64_t i = 0; i < n; ++i) out[i] = table[in[i]];
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

}  // namespace

float e4m3_to_float(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xF, mantissa = bits & 0x7;
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa) / 8.0f, -6);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::F64:
      return "F64";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

struct SafetensorsWriter::State {
  std::string path, tmp;
  std::vector<std::pair<std::string, TensorLayout>> layout;
  size_t written = 0;
  std::ofstream out;
  bool finished = false;
};

SafetensorsWriter::SafetensorsWriter(std::string path,
                                     std::vector<std::pair<std::string, TensorLayout>> layout,
                                     const std::map<std::string, std::string>& metadata)
    : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.path = std::move(path);
  st.tmp = st.path + ".tmp";
  st.layout = std::move(layout);
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, l] : st.layout) {
    if (name == "__metadata__")
      throw IoError("safetensors: '__metadata__' is not a valid tensor name");
    if (header.contains(name)) throw ValueError("safetensors: tensor '" + name + "' given twice");
    const uint64_t nbytes = static_cast<uint64_t>(numel(l.shape)) * dtype_size(l.dtype);
    json entry;
    entry["dtype"] = safetensors_dtype_name(l.dtype);
    entry["shape"] = l.shape;
    entry["data_offsets"] = {offset, offset + nbytes};
    header[name] = entry;
    offset += nbytes;
  }
  std::string text = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  st.out.open(st.tmp, std::ios::binary | std::ios::trunc);
  if (!st.out) throw IoError("safetensors: cannot open '" + st.tmp + "' for writing");
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  st.out.write(reinterpret_cast<const char*>(len), 8);
  st.out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!state_ || state_->finished) return;
  state_->out.close();
  std::error_code ignored;  // (path itself was never touched)
  std::filesystem::remove(state_->tmp, ignored);
}

std::string SafetensorsWriter::next() const {
  return state_->written < state_->layout.size() ? state_->layout[state_->written].first : "";
}

void SafetensorsWriter::write(const std::string& name, const Tensor& tensor) {
  State& st = *state_;
  if (st.finished) throw ValueError("safetensors: '" + st.path + "' is already finished");
  if (st.written == st.layout.size()) {
    throw ValueError("safetensors: tensor '" + name + "' is not in the layout of '" + st.path +
                     "' (all " + std::to_string(st.layout.size()) + " are written)");
  }
  const auto& [want, l] = st.layout[st.written];
  if (name != want) {
    throw ValueError("safetensors: tensor '" + name + "' written where the layout of '" + st.path +
                     "' has '" + want + "' next");
  }
  if (!tensor.defined() || tensor.shape() != l.shape || tensor.dtype() != l.dtype) {
    throw ValueError("safetensors: tensor '" + name + "' was to be " + shape_str(l.shape) + " " +
                     safetensors_dtype_name(l.dtype) + " but is " +
                     (tensor.defined()
                          ? shape_str(tensor.shape()) + " " + safetensors_dtype_name(tensor.dtype())
                          : std::string("undefined")));
  }
  const Tensor h = contiguous(to_device(tensor.detach(), Device::cpu())).detach();
  st.out.write(static_cast<const char*>(h.raw_data()), static_cast<std::streamsize>(h.nbytes()));
  if (!st.out) throw IoError("safetensors: error writing '" + st.tmp + "'");
  ++st.written;
}

void SafetensorsWriter::finish() {
  State& st = *state_;
  if (st.written != st.layout.size()) {
    throw ValueError("safetensors: '" + st.path + "' finished after " + std::to_string(st.written) +
                     " of its " + std::to_string(st.layout.size()) + " tensors (next: '" + next() +
                     "')");
  }
  st.out.flush();
  if (!st.out) throw IoError("safetensors: error writing '" + st.tmp + "'");
  st.out.close();
  std::error_code ec;
  std::filesystem::rename(st.tmp, st.path, ec);
  if (ec) {
    throw IoError("safetensors: cannot rename '" + st.tmp + "' to '" + st.path +
                  "': " + ec.message());
  }
  st.finished = true;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, TensorLayout>> layout;
  for (const auto& [name, t] : tensors) layout.push_back({name, {t.shape(), t.dtype()}});
  SafetensorsWriter writer(path, std::move(layout), metadata);
  for (const auto& [name, t] : tensors) writer.write(name, t);
  writer.finish();
}

namespace {

// One tensor's place in a file's data section.
struct TensorEntry {
  DType dtype;  // as read (f32 for F8_E4M3)
  Shape shape;
  uint64_t begin, end;
  bool e4m3 = false;  // stored as F8_E4M3, one byte an element
};

// A header parsed and checked against the file's size: every entry's
// dtype, shape, byte count, and the entries tiling the data section.
struct Header {
  std::map<std::string, TensorEntry> entries;
  std::map<std::string, std::string> metadata;
  std::map<std::string, Shape> shapes;
  const uint8_t* data = nullptr;
};

Header parse_header(const uint8_t* bytes, uint64_t size, const std::string& source) {
  if (size < 8) {
    fail(source,
         "file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (header_len > kMaxSafetensorsHeader) {
    fail(source, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                     std::to_string(kMaxSafetensorsHeader) + " bytes");
  }
  if (header_len > size - 8) {
    fail(source, "header length " + std::to_string(header_len) +
                     " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {
    fail(source, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(source, "header is not a JSON object");
  const uint64_t data_size = size - 8 - header_len;

  Header result;
  result.data = bytes + 8 + header_len;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail(source, "__metadata__ must be an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          fail(source, "__metadata__ value for '" + m.key() + "' is not a string");
        result.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      fail(source, "tensor '" + name + "' needs dtype, shape and data_offsets");
    }
    if (!e["dtype"].is_string()) fail(source, "tensor '" + name + "' dtype is not a string");
    bool e4m3 = false;
    const DType dtype = parse_dtype(e["dtype"].get<std::string>(), source, name, e4m3);
    const json& js = e["shape"];
    const json& jo = e["data_offsets"];
    if (!js.is_array()) fail(source, "tensor '" + name + "' shape is not an array");
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() ||
        !jo[1].is_number_unsigned()) {
      fail(source, "tensor '" + name + "' data_offsets must be two non-negative integers");
    }
    Shape shape;
    uint64_t count = 1;
    for (const json& d : js) {
      if (!d.is_number_unsigned())
        fail(source, "tensor '" + name + "' has a negative or non-integer dimension");
      const uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          mul_overflows(count, v, count)) {
        fail(source, "tensor '" + name + "' shape overflows");
      }
      shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t nbytes;
    if (mul_overflows(count, e4m3 ? 1 : dtype_size(dtype), nbytes))
      fail(source, "tensor '" + name + "' size overflows");
    const uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (end < begin) fail(source, "tensor '" + name + "' has data_offsets end < begin");
    if (end - begin != nbytes) {
      fail(source, "tensor '" + name + "' of shape " + shape_str(shape) + " and dtype " +
                       (e4m3 ? "F8_E4M3" : safetensors_dtype_name(dtype)) + " needs " +
                       std::to_string(nbytes) + " bytes but its data_offsets span " +
                       std::to_string(end - begin));
    }
    if (end > data_size) {
      fail(source, "tensor '" + name + "' data [" + std::to_string(begin) + ", " +
                       std::to_string(end) + ") lies outside the " + std::to_string(data_size) +
                       "-byte data section");
    }
    spans.push_back({begin, end, name});
    result.shapes[name] = shape;
    result.entries[name] = TensorEntry{dtype, shape, begin, end, e4m3};
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const Span& s : spans) {
    if (s.begin != cursor) {
      fail(source, "tensor '" + s.name + "' starts at byte " + std::to_string(s.begin) +
                       ", expected " + std::to_string(cursor) +
                       " (data must be contiguous, without gaps or overlaps)");
    }
    cursor = s.end;
  }
  if (cursor != data_size) {
    fail(source, "data section is " + std::to_string(data_size) + " bytes but tensors cover " +
                     std::to_string(cursor));
  }
  return result;
}

std::map<std::string, Tensor> copy_out(const Header& header, const TensorFilter& wanted) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, e] : header.entries) {
    if (wanted && !wanted(name)) continue;
    Tensor t = empty(e.shape, e.dtype);
    if (e.e4m3) {
      decode_e4m3(header.data + e.begin, static_cast<float*>(t.raw_data()), e.end - e.begin);
    } else if (e.end > e.begin) {
      std::memcpy(t.raw_data(), header.data + e.begin, e.end - e.begin);
    }
    out.emplace(name, t);
  }
  return out;
}

}  // namespace

Safetensors parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& source) {
  return parse_safetensors(bytes.data(), bytes.size(), source);
}

Safetensors parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& source,
                              const TensorFilter& wanted) {
  Header header = parse_header(bytes, size, source);
  Safetensors result;
  result.tensors = copy_out(header, wanted);
  result.metadata = std::move(header.metadata);
  result.shapes = std::move(header.shapes);
  return result;
}

struct SafetensorsFile::State {
  std::unique_ptr<data::MappedFile> file;
  Header header;
};

SafetensorsFile::SafetensorsFile(const std::string& path) : state_(std::make_unique<State>()) {
  try {
    state_->file = std::make_unique<data::MappedFile>(path);
  } catch (const IoError& e) {
    throw IoError(std::string("safetensors: cannot open '") + path + "': " + e.what());
  }
  state_->header = parse_header(reinterpret_cast<const uint8_t*>(state_->file->data()),
                                state_->file->size(), path);
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;

const std::string& SafetensorsFile::path() const {
  return state_->file->path();
}
const std::map<std::string, Shape>& SafetensorsFile::shapes() const {
  return state_->header.shapes;
}
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return state_->header.metadata;
}
std::map<std::string, Tensor> SafetensorsFile::read(const TensorFilter& wanted) const {
  return copy_out(state_->header, wanted);
}

Tensor SafetensorsFile::read_elements(const std::string& name, int64_t offset,
                                      int64_t count) const {
  const Header& h = state_->header;
  auto it = h.entries.find(name);
  if (it == h.entries.end()) fail(path(), "no tensor '" + name + "'");
  const TensorEntry& e = it->second;
  const int64_t n = numel(e.shape);
  if (offset < 0 || count < 0 || offset > n || count > n - offset) {
    fail(path(), "elements [" + std::to_string(offset) + ", +" + std::to_string(count) +
                     ") lie outside tensor '" + name + "' (" + std::to_string(n) + " elements)");
  }
  Tensor t = empty({count}, e.dtype);
  if (e.e4m3) {
    decode_e4m3(h.data + e.begin + static_cast<uint64_t>(offset), static_cast<float*>(t.raw_data()),
                static_cast<uint64_t>(count));
    return t;
  }
  const size_t esize = dtype_size(e.dtype);
  if (count > 0) {
    std::memcpy(t.raw_data(), h.data + e.begin + static_cast<uint64_t>(offset) * esize,
                static_cast<size_t>(count) * esize);
  }
  return t;
}

Safetensors load_safetensors(const std::string& path, const TensorFilter& wanted) {
  const SafetensorsFile file(path);
  Safetensors result;
  result.tensors = file.read(wanted);
  result.metadata = file.metadata();
  result.shapes = file.shapes();
  return result;
}

}  // namespace triad::io
