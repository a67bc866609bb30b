#include "triad/data/text_input.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <streambuf>
#include <vector>

#include "triad/core/error.h"

#ifdef TRIAD_WITH_ZLIB
#include <zlib.h>
#endif
#ifdef TRIAD_WITH_ZSTD
#include <zstd.h>
#endif

namespace triad::data {
namespace {

enum class Compression { None, Gzip, Zstd };

Compression sniff(const std::string& path) {
  // (A directory opens as a stream that reads nothing: an empty corpus.)
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw IoError("input '" + path + "' is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError("cannot open input '" + path + "'");
  std::array<unsigned char, 4> m{};
  f.read(reinterpret_cast<char*>(m.data()), m.size());
  const auto n = f.gcount();
  if (n >= 2 && m[0] == 0x1f && m[1] == 0x8b) return Compression::Gzip;
  if (n >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) {
    return Compression::Zstd;
  }
  return Compression::None;
}

// A stream buffer that decompresses a file a block at a time: subclasses
// turn the compressed bytes read so far into text (decode).
class DecompressingBuffer : public std::streambuf {
 public:
  explicit DecompressingBuffer(const std::string& path)
      : path_(path), file_(path, std::ios::binary) {
    if (!file_) throw IoError("cannot open input '" + path + "'");
  }

 protected:
  static constexpr size_t kBlock = size_t{1} << 20;

  int_type underflow() override {
    while (gptr() == egptr()) {
      if (in_pos_ == in_len_ && !file_eof_) {
        file_.read(in_.data(), static_cast<std::streamsize>(in_.size()));
        in_len_ = static_cast<size_t>(file_.gcount());
        in_pos_ = 0;
        file_eof_ = in_len_ == 0;
      }
      const size_t made = decode();
      if (made > 0) {
        setg(out_.data(), out_.data(), out_.data() + made);
        break;
      }
      if (file_eof_ && in_pos_ == in_len_) {
        finish();  // raises for data that stops in the middle
        return traits_type::eof();
      }
    }
    return traits_type::to_int_type(*gptr());
  }

  // Decompresses from in_[in_pos_, in_len_) into out_, returning the bytes
  // made (possibly none, having consumed input); raises for corrupt data.
  virtual size_t decode() = 0;
  // At the end of the file: raises if it ends inside a member or frame.
  virtual void finish() = 0;

  [[noreturn]] void corrupt(const std::string& kind, const std::string& why) const {
    throw IoError("input '" + path_ + "': the " + kind + " data is corrupt (" + why + ") after " +
                  std::to_string(consumed_) + " compressed bytes");
  }
  [[noreturn]] void truncated(const std::string& kind) const {
    throw IoError("input '" + path_ + "': the " + kind +
                  " data ends in the middle of a compressed block (the file is cut short?) after " +
                  std::to_string(consumed_) + " compressed bytes");
  }

  std::string path_;
  std::ifstream file_;
  std::vector<char> in_ = std::vector<char>(kBlock), out_ = std::vector<char>(kBlock);
  size_t in_pos_ = 0, in_len_ = 0;
  bool file_eof_ = false;
  uint64_t consumed_ = 0;  // compressed bytes decoded so far
};

#ifdef TRIAD_WITH_ZLIB
class GzipBuffer final : public DecompressingBuffer {
 public:
  explicit GzipBuffer(const std::string& path) : DecompressingBuffer(path) {
    // 15 + 32: the largest window, and a gzip or zlib header told apart.
    if (inflateInit2(&z_, 15 + 32) != Z_OK)
      throw IoError("input '" + path + "': zlib failed to start");
  }
  ~GzipBuffer() override { inflateEnd(&z_); }

 private:
  size_t decode() override {
    // (Without input, inflate still owes what a full buffer held back.)
    if (in_pos_ == in_len_ && !out_full_) return 0;
    if (member_ended_) {
      if (in_pos_ == in_len_) return 0;
      // Another member follows the one that ended: gzip -c a b > ab.gz.
      inflateReset(&z_);
      member_ended_ = false;
    }
    z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
    z_.avail_in = static_cast<uInt>(in_len_ - in_pos_);
    z_.next_out = reinterpret_cast<Bytef*>(out_.data());
    z_.avail_out = static_cast<uInt>(out_.size());
    const int rc = inflate(&z_, Z_NO_FLUSH);
    out_full_ = z_.avail_out == 0;
    const size_t used = (in_len_ - in_pos_) - z_.avail_in;
    in_pos_ += used;
    consumed_ += used;
    if (rc == Z_STREAM_END) {
      member_ended_ = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      corrupt("gzip", z_.msg ? z_.msg : "zlib error " + std::to_string(rc));
    }
    return out_.size() - z_.avail_out;
  }
  void finish() override {
    if (!member_ended_) truncated("gzip");
  }

  z_stream z_{};
  bool member_ended_ = false, out_full_ = false;
};
#endif

#ifdef TRIAD_WITH_ZSTD
class ZstdBuffer final : public DecompressingBuffer {
 public:
  explicit ZstdBuffer(const std::string& path)
      : DecompressingBuffer(path), ctx_(ZSTD_createDCtx()) {
    if (!ctx_) throw IoError("input '" + path + "': zstd failed to start");
  }
  ~ZstdBuffer() override { ZSTD_freeDCtx(ctx_); }

 private:
  size_t decode() override {
    ZSTD_inBuffer in{in_.data() + in_pos_, in_len_ - in_pos_, 0};
    ZSTD_outBuffer out{out_.data(), out_.size(), 0};
    if (in.size == 0 && frame_done_) return 0;
    const size_t rc = ZSTD_decompressStream(ctx_, &out, &in);
    if (ZSTD_isError(rc)) corrupt("zstd", ZSTD_getErrorName(rc));
    in_pos_ += in.pos;
    consumed_ += in.pos;
    // 0: a frame is decoded and flushed whole.
    frame_done_ = rc == 0;
    return out.pos;
  }
  void finish() override {
    if (!frame_done_) truncated("zstd");
  }

  ZSTD_DCtx* ctx_;
  bool frame_done_ = false;
};
#endif

// An istream that owns its buffer.
class OwningStream final : public std::istream {
 public:
  explicit OwningStream(std::unique_ptr<std::streambuf> buffer)
      : std::istream(buffer.get()), buffer_(std::move(buffer)) {
    exceptions(std::ios::badbit);  // a decompression error reaches the reader
  }

 private:
  std::unique_ptr<std::streambuf> buffer_;
};

}  // namespace

bool reads_gzip() {
#ifdef TRIAD_WITH_ZLIB
  return true;
#else
  return false;
#endif
}

bool reads_zstd() {
#ifdef TRIAD_WITH_ZSTD
  return true;
#else
  return false;
#endif
}

std::unique_ptr<std::istream> open_text_input(const std::string& path) {
  if (path == "-") {
    auto in = std::make_unique<std::istream>(std::cin.rdbuf());  // (not owned)
    in->exceptions(std::ios::badbit);
    return in;
  }
  switch (sniff(path)) {
    case Compression::Gzip:
#ifdef TRIAD_WITH_ZLIB
      return std::make_unique<OwningStream>(std::make_unique<GzipBuffer>(path));
#else
      throw NotSupportedError("input '" + path +
                              "' is gzip-compressed, and this build reads no gzip (install "
                              "zlib1g-dev and configure again)");
#endif
    case Compression::Zstd:
#ifdef TRIAD_WITH_ZSTD
      return std::make_unique<OwningStream>(std::make_unique<ZstdBuffer>(path));
#else
      throw NotSupportedError("input '" + path +
                              "' is Zstandard-compressed, and this build reads no zstd (install "
                              "libzstd-dev and configure again)");
#endif
    case Compression::None:
      break;
  }
  auto f = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*f) throw IoError("cannot open input '" + path + "'");
  return f;
}

}  // namespace triad::data
