#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "triad/core/tensor.h"

namespace triad::io {

// Contents of a safetensors file: host tensors by name, plus the optional
// string metadata ("__metadata__").
struct Safetensors {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  // Every tensor the header lists, copied out or not (see `wanted` below).
  std::map<std::string, Shape> shapes;
};

// One byte of F8_E4M3 (OCP's E4M3FN, torch.float8_e4m3fn: a sign, 4
// exponent bits biased by 7, 3 mantissa bits; no infinities, 0x7F and 0xFF
// NaN) as the f32 it is exactly.
float e4m3_to_float(uint8_t bits);

// Largest JSON header accepted (the format's reference reader uses 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100ull * 1024 * 1024;

// Writes tensors (any device; copied to host, made contiguous) atomically:
// to "<path>.tmp", flushed, then renamed over path.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A file written tensor by tensor: the header first, from each tensor's
// shape and dtype (`layout`, in the order the data follows), then each
// tensor as the caller has it, so a writer that gathers, transposes or moves
// tensors to the host holds one at a time, not a copy of everything. The
// file is "<path>.tmp" until finish() renames it over path; a writer
// destroyed before that (an error on the way) removes it. A tensor out of
// order or unlike its layout is a ValueError naming it.
struct TensorLayout {
  Shape shape;
  DType dtype;
};
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<std::pair<std::string, TensorLayout>> layout,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor of the layout (any device; copied to the host).
  void write(const std::string& name, const Tensor& tensor);
  // After the last tensor: flushed, then renamed over path.
  void finish();
  // The name write() takes next ("" when all are written).
  std::string next() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Reads and validates a whole file. Every problem is an IoError naming the
// file and what is wrong: header length, JSON, dtype (F32, F64, BF16, F16,
// I32, I64, and F8_E4M3, read as f32, every value exact: e4m3_to_float),
// shape x dtype size vs. offsets, offsets contiguous from 0 and
// inside the file, arithmetic overflow. The file is mapped, not read: a
// load holds the tensors it copies out and nothing more. `wanted`, when
// given, names the tensors to copy out (the whole header is checked either
// way): a multimodal checkpoint's language model leaves its vision tower
// unread.
using TensorFilter = std::function<bool(const std::string& name)>;
Safetensors load_safetensors(const std::string& path, const TensorFilter& wanted = {});
Safetensors parse_safetensors(const std::vector<uint8_t>& bytes, const std::string& source);
Safetensors parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& source,
                              const TensorFilter& wanted = {});

// One file mapped once, its header parsed and checked as load_safetensors
// checks it, its tensors copied out on demand: a reader that takes a large
// checkpoint part by part (one block at a time) parses the header once.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const;
  const std::map<std::string, Shape>& shapes() const;
  const std::map<std::string, std::string>& metadata() const;
  // Copies out the tensors `wanted` names (every tensor when it is empty).
  std::map<std::string, Tensor> read(const TensorFilter& wanted = {}) const;
  // Elements [offset, offset + count) of tensor `name` in its row-major
  // order, as a 1-d tensor of its dtype (a piece of a flat buffer). A name
  // the file lacks or a range outside the tensor is an IoError.
  Tensor read_elements(const std::string& name, int64_t offset, int64_t count) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Safetensors dtype names ("F32", "BF16", ...).
const char* safetensors_dtype_name(DType dtype);

}  // namespace triad::io
