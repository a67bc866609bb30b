#pragma once

// Text files as corpora come: plain, or compressed with gzip (.gz) or
// Zstandard (.zst), the kind told by the file's first bytes (its magic
// number), not its name. Decompression streams: a corpus larger than
// memory is read a piece at a time.

#include <istream>
#include <memory>
#include <string>

namespace triad::data {

// The file's text, decompressed as it is read ("-": the standard input,
// read as it comes: decompress a pipe before it, zstdcat x.zst | ...). Concatenated gzip members
// and Zstandard frames (parallel compressors write them) read as one text. IoErrors name the file:
// it cannot be opened; its compressed data is corrupt or ends in the middle (raised by the stream's
// reads, whose exceptions() include badbit for this); it is compressed in a way this build cannot
// read (NotSupportedError naming the package to build with).
std::unique_ptr<std::istream> open_text_input(const std::string& path);

// Whether this build reads gzip (zlib) and Zstandard (libzstd) input.
bool reads_gzip();
bool reads_zstd();

}  // namespace triad::data
