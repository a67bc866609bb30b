#pragma once

#include <stdexcept>
#include <string>

namespace triad {

// Base of every error Triad raises. Messages name the offending value and
// what was expected, e.g. "n_head (12) must be divisible by tp (5)".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor argument has the wrong shape, rank or layout.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A value (dtype, option, number) is outside what an operation accepts.
class ValueError : public Error {
 public:
  using Error::Error;
};

// The combination (op, dtype, device) exists in principle but is not
// implemented by the backend asked to run it.
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written, or its contents are malformed.
class IoError : public Error {
 public:
  using Error::Error;
};

// A configuration key or value is invalid.
class ConfigError : public Error {
 public:
  using Error::Error;
};

}  // namespace triad
