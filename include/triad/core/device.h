#pragma once

#include <cstdint>
#include <string>

namespace triad {

enum class DeviceType : uint8_t { CPU, CUDA };

// Where a tensor's storage lives: the host, or CUDA device `index`.
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index) { return {DeviceType::CUDA, index}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

// Parses "cpu", "cuda", "cuda:1"; throws ValueError otherwise.
Device device_from_string(const std::string& text);

}  // namespace triad
