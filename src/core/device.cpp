#include "triad/core/device.h"

#include "triad/core/error.h"

namespace triad {

std::string Device::str() const {
  return type == DeviceType::CPU ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device device_from_string(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string idx = text.substr(5);
    // (At most 9 digits: an int's, std::stoi's out_of_range otherwise.)
    if (!idx.empty() && idx.size() <= 9 &&
        idx.find_first_not_of("0123456789") == std::string::npos) {
      return Device::cuda(std::stoi(idx));
    }
  }
  throw ValueError("unknown device '" + text + "' (expected cpu, cuda or cuda:N)");
}

}  // namespace triad
