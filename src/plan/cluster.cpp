#include "triad/plan/cluster.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>

#include "io/yaml_document.h"
#include "triad/core/error.h"
#include "triad/io/text_file.h"

namespace triad::plan {
namespace {

double number(const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      return n.as<double>();
    } catch (const YAML::Exception&) {
    }
  }
  std::stringstream ss;
  ss << n;
  throw ConfigError(key + ": expected a number, got '" + ss.str() + "'");
}

// A whole number in [1, 2^31): GPU and SM counts.
int count(const YAML::Node& n, const std::string& key) {
  const double v = number(n, key);
  if (!(v >= 1 && v <= INT_MAX) || v != std::floor(v)) {
    std::stringstream ss;
    ss << n;
    throw ConfigError(key + " (" + ss.str() + ") must be a positive integer");
  }
  return static_cast<int>(v);
}

std::string text(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) {
    std::stringstream ss;
    ss << n;
    throw ConfigError(key + ": expected a name, got '" + ss.str() + "'");
  }
  return n.Scalar();
}

void positive(double v, const std::string& key) {
  if (!(v > 0) || !std::isfinite(v))
    throw ConfigError(key + " (" + std::to_string(v) + ") must be a finite number > 0");
}

void non_negative(double v, const std::string& key) {
  if (!(v >= 0) || !std::isfinite(v))
    throw ConfigError(key + " (" + std::to_string(v) + ") must be a finite number >= 0");
}

void fraction(double v, const std::string& key) {
  if (!(v > 0 && v <= 1)) throw ConfigError(key + " (" + std::to_string(v) + ") must be in (0, 1]");
}

using Setter = std::function<void(const YAML::Node&, const std::string&)>;

void apply(const YAML::Node& node, const std::string& section,
           const std::map<std::string, Setter>& fields, const std::vector<std::string>& required) {
  if (!node.IsMap()) throw ConfigError(section + ": expected a mapping");
  std::string allowed;
  for (auto& [k, f] : fields) allowed += (allowed.empty() ? "" : ", ") + k;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    auto f = fields.find(k);
    const std::string full = section.empty() ? k : section + "." + k;
    if (f == fields.end()) {
      throw ConfigError("unknown key '" + full + "' (allowed" +
                        (section.empty() ? "" : " in " + section) + ": " + allowed + ")");
    }
    f->second(it->second, full);
  }
  for (const auto& k : required) {
    if (!node[k])
      throw ConfigError("missing required key '" + (section.empty() ? k : section + "." + k) + "'");
  }
}

}  // namespace

ClusterSpec parse_cluster(const std::string& yaml_text, const std::string& source) {
  const YAML::Node root = io::load_yaml(yaml_text, source);
  ClusterSpec c;
  const std::map<std::string, Setter> gpu{
      {"name", [&](auto& v, auto& k) { c.gpu_name = text(v, k); }},
      {"peak_tflops",
       [&](auto& v, auto& k) {
         c.peak_flops = number(v, k) * 1e12;
         positive(c.peak_flops, k);
       }},
      {"sm_count", [&](auto& v, auto& k) { c.sm_count = count(v, k); }},
      {"memory_gib",
       [&](auto& v, auto& k) {
         c.memory_bytes = number(v, k) * (1ull << 30);
         positive(c.memory_bytes, k);
       }},
      {"memory_bandwidth_gbs",
       [&](auto& v, auto& k) {
         c.memory_bandwidth = number(v, k) * 1e9;
         positive(c.memory_bandwidth, k);
       }},
  };
  const std::map<std::string, Setter> intra{
      {"bandwidth_gbs",
       [&](auto& v, auto& k) {
         c.intra_bandwidth = number(v, k) * 1e9;
         positive(c.intra_bandwidth, k);
       }},
      {"latency_us",
       [&](auto& v, auto& k) {
         const double us = number(v, k);
         non_negative(us, k);
         c.intra_latency = us * 1e-6;
       }},
  };
  const std::map<std::string, Setter> inter{
      {"bandwidth_gbs",
       [&](auto& v, auto& k) {
         c.inter_bandwidth = number(v, k) * 1e9;
         positive(c.inter_bandwidth, k);
       }},
      {"latency_us",
       [&](auto& v, auto& k) {
         const double us = number(v, k);
         non_negative(us, k);
         c.inter_latency = us * 1e-6;
       }},
  };
  const std::map<std::string, Setter> eff{
      {"gemm",
       [&](auto& v, auto& k) {
         c.gemm_efficiency = number(v, k);
         fraction(c.gemm_efficiency, k);
       }},
      {"memory",
       [&](auto& v, auto& k) {
         c.memory_efficiency = number(v, k);
         fraction(c.memory_efficiency, k);
       }},
      {"collective",
       [&](auto& v, auto& k) {
         c.collective_efficiency = number(v, k);
         fraction(c.collective_efficiency, k);
       }},
      {"attention",
       [&](auto& v, auto& k) {
         if (!v.IsMap()) {
           c.attention_efficiency = number(v, k);
           fraction(c.attention_efficiency, k);
           return;
         }
         // {keys: fraction, ...}: the fractions measured at those lengths.
         if (v.size() == 0) throw ConfigError(k + ": a curve needs at least one point");
         for (auto it = v.begin(); it != v.end(); ++it) {
           std::stringstream key;
           key << it->first;
           const std::string at = k + "." + key.str();
           const double keys = number(it->first, at + " (a length)");
           if (!(keys >= 1) || !std::isfinite(keys)) {
             throw ConfigError(at + ": a length of keys must be a finite number >= 1, got " +
                               key.str());
           }
           const double f = number(it->second, at);
           fraction(f, at);
           for (const auto& [seen, _] : c.attention_curve)
             if (seen == keys) throw ConfigError(at + ": the length " + key.str() + " twice");
           c.attention_curve.emplace_back(keys, f);
         }
         std::sort(c.attention_curve.begin(), c.attention_curve.end());
       }},
  };
  const std::map<std::string, Setter> top{
      {"name", [&](auto& v, auto& k) { c.name = text(v, k); }},
      {"gpus_per_node", [&](auto& v, auto& k) { c.gpus_per_node = count(v, k); }},
      {"gpu",
       [&](auto& v, auto&) {
         apply(v, "gpu", gpu, {"peak_tflops", "memory_gib", "memory_bandwidth_gbs"});
       }},
      {"intra_node", [&](auto& v, auto&) { apply(v, "intra_node", intra, {"bandwidth_gbs"}); }},
      {"inter_node", [&](auto& v, auto&) { apply(v, "inter_node", inter, {"bandwidth_gbs"}); }},
      {"efficiency", [&](auto& v, auto&) { apply(v, "efficiency", eff, {}); }},
      {"reserved_gib",
       [&](auto& v, auto& k) {
         const double gib = number(v, k);
         non_negative(gib, k);
         c.reserved_bytes = gib * (1ull << 30);
       }},
  };
  if (!root || !root.IsMap())
    throw ConfigError(source + ": a cluster file is a mapping (see docs/planner.md)");
  try {
    apply(root, "", top, {"gpus_per_node", "gpu", "intra_node", "inter_node"});
    if (c.reserved_bytes >= c.memory_bytes) {
      auto gib = [](double bytes) {
        std::ostringstream out;
        out << bytes / (1ull << 30);
        return out.str();
      };
      throw ConfigError("reserved_gib (" + gib(c.reserved_bytes) +
                        ") must be less than gpu.memory_gib (" + gib(c.memory_bytes) +
                        "): nothing would be left for the model");
    }
  } catch (const ConfigError& e) {
    throw ConfigError(source + ": " + e.what());
  }
  return c;
}

double ClusterSpec::flash_attention_efficiency(double keys) const {
  if (attention_curve.empty())
    return attention_efficiency > 0 ? attention_efficiency : 0.75 * gemm_efficiency;
  if (!(keys > attention_curve.front().first)) return attention_curve.front().second;
  if (keys >= attention_curve.back().first) return attention_curve.back().second;
  size_t i = 1;
  while (attention_curve[i].first < keys) ++i;
  const auto& [x0, y0] = attention_curve[i - 1];
  const auto& [x1, y1] = attention_curve[i];
  const double t = std::log2(keys / x0) / std::log2(x1 / x0);
  return y0 + t * (y1 - y0);
}

ClusterSpec load_cluster(const std::string& path) {
  return parse_cluster(io::read_text_file(path, "cluster file"), path);
}

}  // namespace triad::plan
