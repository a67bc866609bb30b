#pragma once

// Protocol Buffers' wire format, read field by field without generated code
// (SentencePiece's model file, src/data/sentencepiece_tokenizer.cpp). A
// message is a run of (field number, wire type) keys, each followed by a
// varint, 8 or 4 fixed bytes, or a length and that many bytes (strings,
// bytes and nested messages alike).

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "triad/core/error.h"

namespace triad::data::protobuf {

enum class Wire : uint8_t { Varint = 0, Fixed64 = 1, Bytes = 2, Fixed32 = 5 };

struct Field {
  uint32_t number = 0;
  Wire wire = Wire::Varint;
  uint64_t varint = 0;     // Varint, Fixed64, Fixed32 (the raw bits)
  std::string_view bytes;  // Bytes
  float as_float() const {
    const auto bits = static_cast<uint32_t>(varint);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

// Reads one message's fields in order; errors are IoErrors naming `what`
// and the byte offset from `base` (the message's place in the file).
class Reader {
 public:
  Reader(std::string_view data, std::string what, size_t base = 0)
      : data_(data), what_(std::move(what)), base_(base) {}

  bool next(Field& f) {
    if (pos_ >= data_.size()) return false;
    const size_t start = pos_;
    last_ = start;
    const uint64_t key = varint();
    f.number = static_cast<uint32_t>(key >> 3);
    if (f.number == 0) fail(start, "field number 0");
    switch (key & 7) {
      case 0:
        f.wire = Wire::Varint;
        f.varint = varint();
        break;
      case 1:
        f.wire = Wire::Fixed64;
        f.varint = fixed(8);
        break;
      case 2: {
        f.wire = Wire::Bytes;
        const uint64_t n = varint();
        if (n > data_.size() - pos_)
          fail(start, "a length of " + std::to_string(n) + " bytes past the end");
        f.bytes = data_.substr(pos_, n);
        pos_ += n;
        break;
      }
      case 5:
        f.wire = Wire::Fixed32;
        f.varint = fixed(4);
        break;
      default:
        fail(start, "wire type " + std::to_string(key & 7) + " (groups are not read)");
    }
    return true;
  }
  // The byte offset in the file of the last field's bytes.
  size_t offset_of(std::string_view bytes) const {
    return base_ + static_cast<size_t>(bytes.data() - data_.data());
  }
  // An error at the last field read.
  [[noreturn]] void fail_at_field(const std::string& why) const { fail(last_, why); }
  [[noreturn]] void fail(size_t at, const std::string& why) const {
    throw IoError(what_ + ": not a protocol buffer message at byte " + std::to_string(base_ + at) +
                  ": " + why);
  }

 private:
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) fail(pos_, "a varint cut off by the end");
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail(pos_, "a varint longer than 10 bytes");
  }
  uint64_t fixed(size_t n) {
    if (data_.size() - pos_ < n) fail(pos_, "a fixed-width value cut off by the end");
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }

  std::string_view data_;
  std::string what_;
  size_t base_;
  size_t pos_ = 0;
  size_t last_ = 0;
};

}  // namespace triad::data::protobuf
