#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace triad::io {

// The whole of a file's bytes, or nothing when `path` is not a file that
// can be read (missing, a directory, no permission, a read error). Readers
// of JSON and other small files go through it: a directory given for a
// file would otherwise read as empty, or throw the standard library's
// ios_failure from inside a parser.
std::optional<std::string> read_file(const std::string& path);

// The whole of a text file (a config, a model or cluster file): ConfigError
// "cannot open <what> '<path>'" (saying when it is a directory) when it
// cannot be read.
std::string read_text_file(const std::string& path, const std::string& what);

// Whether `path` is a directory, or names anything at all, without
// throwing: std::filesystem's own throw filesystem_error where the system
// refuses the name (too long, no permission on the way), which is neither
// here; the reader then names the path when it cannot open it.
bool is_directory(const std::filesystem::path& path);
bool path_exists(const std::filesystem::path& path);

}  // namespace triad::io
