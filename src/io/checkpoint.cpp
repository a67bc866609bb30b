#include "triad/io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/mapped_file.h"
#include "triad/core/checksum.h"
#include "triad/core/error.h"
#include "triad/io/json_integer.h"
#include "triad/io/safetensors.h"
#include "triad/io/text_file.h"

namespace triad::io {
namespace fs = std::filesystem;
namespace {

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw IoError("checkpoint: cannot open '" + path + "' to sync it");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Directories on some file systems refuse fsync (EINVAL); their entries
  // are then as durable as the file system makes them.
  if (rc != 0 && err != EINVAL) {
    throw IoError("checkpoint: syncing '" + path + "' failed: " + std::strerror(err));
  }
}

// Runs a std::filesystem operation; its error becomes an IoError that says
// what the checkpoint was doing and why the file system refused.
template <class F>
decltype(auto) fs_op(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const fs::filesystem_error& e) {
    throw IoError("checkpoint: cannot " + what + ": " + e.code().message());
  }
}

std::string step_name(int64_t step) {
  return "step_" + std::to_string(step);
}

// Whether `name` is a step directory's: step_ and digits alone.
bool is_step_name(const std::string& name) {
  return name.size() > 5 && name.rfind("step_", 0) == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw IoError("checkpoint: cannot write '" + tmp + "'");
    out << text;
    out.flush();
    if (!out) throw IoError("checkpoint: error writing '" + tmp + "'");
  }
  fsync_path(tmp);
  fs_op("rename '" + tmp + "' to '" + path + "'", [&] { fs::rename(tmp, path); });
}

}  // namespace

uint64_t file_checksum(const std::string& path, const std::string& kind) {
  if (kind != kChecksumWords64 && kind != kChecksumFnv1a64) {
    throw IoError("checkpoint: unknown checksum '" + kind + "' (expected " + kChecksumWords64 +
                  " or " + kChecksumFnv1a64 + ")");
  }
  // The file mapped (read through the page cache, no copy into a buffer).
  std::unique_ptr<data::MappedFile> file;
  try {
    file = std::make_unique<data::MappedFile>(path);
  } catch (const IoError& e) {
    throw IoError(std::string("checkpoint: cannot read ") + e.what());
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(file->data());
  const uint64_t length = file->size();
  if (kind == kChecksumFnv1a64) {  // checkpoints written before words64
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < length; ++i) {
      h ^= bytes[i];
      h *= 0x100000001b3ull;
    }
    return h;
  }
  return words64_checksum(bytes, length);
}

std::string checkpoint_staging_dir(const std::string& dir, int64_t step) {
  return (fs::path(dir) / (step_name(step) + ".tmp")).string();
}

std::string checkpoint_rank_file(const std::string& step_dir, int rank) {
  return (fs::path(step_dir) / ("rank_" + std::to_string(rank) + ".safetensors")).string();
}

void write_rank_state(const std::string& staging_dir, int rank,
                      const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  fs_op("create the directory '" + staging_dir + "'", [&] { fs::create_directories(staging_dir); });
  const std::string path = checkpoint_rank_file(staging_dir, rank);
  save_safetensors(path, tensors, metadata);
  fsync_path(path);
  // Each rank hashes its own file (just written: from the page cache), so
  // the commit reads a line per rank instead of every rank's bytes.
  const uint64_t sum = file_checksum(path, kChecksumWords64);
  write_text_atomically(path + ".checksum",
                        std::string(kChecksumWords64) + " " + std::to_string(sum) + "\n");
}

namespace {

// The checkpoint a marker file (`latest`, `best`) names: a step_<N>
// directory beside it with a manifest.
CheckpointInfo read_marked_checkpoint(const fs::path& marker) {
  std::ifstream in(marker);
  std::string name;
  std::getline(in, name);
  const fs::path step_dir = marker.parent_path() / name;
  if (!is_step_name(name) || !io::path_exists(step_dir / "manifest.json")) {
    throw IoError("checkpoint: '" + marker.string() + "' points to '" + name +
                  "', which has no manifest");
  }
  return read_checkpoint(step_dir.string());
}

// Whether `path` is a marker file: its first line names a step_<N>.
bool is_marker_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > 64) return false;
  std::ifstream in(path);
  std::string name;
  std::getline(in, name);
  return is_step_name(name);
}

}  // namespace

std::optional<int64_t> commit_checkpoint(const std::string& dir, int64_t step, int world_size,
                                         const std::map<std::string, std::string>& layout,
                                         const std::string& config_yaml, int keep,
                                         int64_t keep_every, std::optional<double> val_loss,
                                         bool keep_best) {
  const std::string staging = checkpoint_staging_dir(dir, step);
  nlohmann::json manifest;
  manifest["format"] = "triad-checkpoint-1";
  manifest["step"] = step;
  if (val_loss && std::isfinite(*val_loss)) manifest["val_loss"] = *val_loss;
  manifest["layout"] = layout;
  manifest["config"] = config_yaml;
  manifest["checksum"] = kChecksumWords64;
  nlohmann::json files = nlohmann::json::object();
  for (int r = 0; r < world_size; ++r) {
    const std::string f = checkpoint_rank_file(staging, r);
    if (!io::path_exists(f))
      throw IoError("checkpoint: rank " + std::to_string(r) + " did not write '" + f + "'");
    // The rank's own checksum of its file; a file without one (written
    // some other way) is hashed here.
    std::string kind, sum;
    {
      std::ifstream side(f + ".checksum");
      side >> kind >> sum;
    }
    if (kind != kChecksumWords64 || sum.empty() ||
        sum.find_first_not_of("0123456789") != std::string::npos) {
      sum = std::to_string(file_checksum(f, kChecksumWords64));
    }
    std::error_code ignored;
    fs::remove(f + ".checksum", ignored);
    files[fs::path(f).filename().string()] = sum;
  }
  manifest["checksums"] = files;
  write_text_atomically((fs::path(staging) / "manifest.json").string(), manifest.dump(1));
  fsync_path(staging);
  const fs::path final_dir = fs::path(dir) / step_name(step);
  fs_op("replace '" + final_dir.string() + "'", [&] {
    fs::remove_all(final_dir);
    fs::rename(staging, final_dir);
  });
  fsync_path(dir);
  // The marker moves last: a crash before this line leaves the previous
  // checkpoint as the one to resume from.
  write_text_atomically((fs::path(dir) / "latest").string(), step_name(step) + "\n");
  fsync_path(dir);
  // Keep the newest `keep` complete checkpoints, every multiple of
  // keep_every, and (keep_best) the one of the lowest validation loss. A
  // run resumed from an earlier checkpoint leaves later ones behind, of the
  // future it abandoned: those are neither counted nor removed here (each
  // is replaced when the run reaches its step), so the checkpoints kept
  // are this run's own, the one just written first.
  std::vector<int64_t> steps = checkpoint_steps(dir);
  std::erase_if(steps, [step](int64_t s) { return s > step; });
  std::optional<int64_t> best;
  if (keep_best) {
    double lowest = 0;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {  // (oldest first)
      const fs::path manifest_path = fs::path(dir) / step_name(*it) / "manifest.json";
      std::error_code ec;
      if (!fs::exists(manifest_path, ec)) continue;  // (never finished)
      std::optional<double> loss;
      try {
        loss = read_checkpoint((fs::path(dir) / step_name(*it)).string()).val_loss;
      } catch (const IoError&) {
        continue;  // (a manifest that does not read is nobody's best; resuming it says why)
      }
      if (loss && (!best || *loss < lowest)) {
        best = *it;
        lowest = *loss;
      }
    }
    if (best) {
      write_text_atomically((fs::path(dir) / "best").string(), step_name(*best) + "\n");
      fsync_path(dir);
    }
  }
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < steps.size(); ++i) {
    if (keep_every > 0 && steps[i] % keep_every == 0) continue;
    if (best && steps[i] == *best) continue;
    const fs::path old = fs::path(dir) / step_name(steps[i]);
    fs_op("remove the old checkpoint '" + old.string() + "'", [&] { fs::remove_all(old); });
  }
  // A `best` marker (of this run, or of an earlier one with keep_best) goes
  // with the checkpoint it names.
  const fs::path marker = fs::path(dir) / "best";
  if (!best && is_marker_file(marker.string())) {
    std::ifstream in(marker);
    std::string name;
    std::getline(in, name);
    std::error_code ec;
    if (!fs::exists(fs::path(dir) / name, ec)) fs::remove(marker, ec);
  }
  return best;
}

std::vector<int64_t> checkpoint_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  fs_op("list '" + dir + "'", [&] {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && is_step_name(n)) {
        // (A number past int64 names no step Triad writes: not one.)
        int64_t step = 0;
        const auto [end, ec] = std::from_chars(n.data() + 5, n.data() + n.size(), step);
        if (ec == std::errc() && end == n.data() + n.size()) steps.push_back(step);
      }
    }
  });
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::vector<CheckpointInfo> recent_checkpoints(const std::string& path, int64_t count) {
  if (count < 1) {
    throw ValueError("recent_checkpoints: a count of " + std::to_string(count) +
                     " (expected 1 or more)");
  }
  const CheckpointInfo last = open_checkpoint(path);
  fs::path last_dir = fs::path(last.step_dir).lexically_normal();
  if (!last_dir.has_filename()) last_dir = last_dir.parent_path();  // ("step_5/")
  const std::string dir = last_dir.parent_path().string();
  std::vector<CheckpointInfo> out;
  std::vector<int64_t> kept;
  for (const int64_t step : checkpoint_steps(dir)) {
    if (step > last.step) continue;
    const fs::path step_dir = fs::path(dir) / step_name(step);
    if (!io::path_exists(step_dir / "manifest.json")) continue;  // (an unfinished write)
    kept.push_back(step);
    if (static_cast<int64_t>(out.size()) < count) out.push_back(read_checkpoint(step_dir.string()));
  }
  if (static_cast<int64_t>(out.size()) < count) {
    std::string steps;
    for (const int64_t s : kept) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    throw IoError("checkpoint.dir '" + dir + "' holds " + std::to_string(kept.size()) +
                  " checkpoint(s) up to step " + std::to_string(last.step) + " (" + steps +
                  "), not the " + std::to_string(count) + " asked for");
  }
  return out;
}

void check_checkpoint_dir_writable(const std::string& dir, int rank) {
  fs_op("create checkpoint.dir '" + dir + "'", [&] { fs::create_directories(dir); });
  const std::string probe =
      (fs::path(dir) / (".write_probe_rank_" + std::to_string(rank))).string();
  {
    std::ofstream out(probe, std::ios::trunc);
    out << "triad";
    out.flush();
    if (!out) {
      throw IoError("checkpoint.dir '" + dir + "' is not writable (rank " + std::to_string(rank) +
                    " could not write '" + probe + "': " + std::strerror(errno) + ")");
    }
  }
  std::error_code ec;
  fs::remove(probe, ec);
}

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir) {
  const fs::path marker = fs::path(dir) / "latest";
  if (!io::path_exists(marker)) return std::nullopt;
  return read_marked_checkpoint(marker);
}

CheckpointInfo open_checkpoint(const std::string& path) {
  if (io::path_exists(fs::path(path) / "manifest.json")) return read_checkpoint(path);
  if (io::path_exists(fs::path(path) / "latest")) return *find_latest_checkpoint(path);
  if (is_marker_file(path)) return read_marked_checkpoint(path);
  throw IoError("checkpoint '" + path +
                "': neither a checkpoint (a step_<N> directory with manifest.json), a "
                "checkpoint.dir (with a 'latest' marker) nor a marker naming one (its 'latest' or "
                "'best')");
}

bool is_checkpoint(const std::string& path) {
  std::error_code ec;
  return (fs::is_directory(path, ec) && (fs::exists(fs::path(path) / "manifest.json", ec) ||
                                         fs::exists(fs::path(path) / "latest", ec))) ||
         is_marker_file(path);
}

CheckpointInfo read_checkpoint(const std::string& step_dir) {
  const fs::path manifest_path = fs::path(step_dir) / "manifest.json";
  std::string trimmed = step_dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (trimmed.ends_with(".tmp")) {
    throw IoError("checkpoint '" + step_dir +
                  "' is a staging directory, a checkpoint whose writing never finished");
  }
  if (!io::path_exists(manifest_path)) {
    throw IoError("checkpoint '" + step_dir +
                  "' has no manifest.json (not a committed checkpoint)");
  }
  const std::optional<std::string> text = read_file(manifest_path.string());
  if (!text) throw IoError("checkpoint: cannot read manifest '" + manifest_path.string() + "'");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError("checkpoint: manifest '" + manifest_path.string() +
                  "' is not valid JSON: " + e.what());
  }
  if (!m.is_object() || !m.contains("format") || m.at("format") != "triad-checkpoint-1") {
    throw IoError("checkpoint: manifest '" + manifest_path.string() +
                  "' has an unknown format (expected an object with format "
                  "\"triad-checkpoint-1\")");
  }
  CheckpointInfo info;
  info.step_dir = step_dir;
  try {
    info.step = json_int<IoError>(m.at("step"),
                                  "checkpoint: manifest '" + manifest_path.string() + "': step");
    info.layout = m.at("layout").get<std::map<std::string, std::string>>();
    info.config = m.value("config", std::string());
    if (m.contains("val_loss")) info.val_loss = m.at("val_loss").get<double>();
    // (Manifests before words64 name no checksum: FNV-1a.)
    info.checksum = m.value("checksum", std::string(kChecksumFnv1a64));
    if (info.checksum != kChecksumWords64 && info.checksum != kChecksumFnv1a64) {
      throw IoError("checkpoint: manifest '" + manifest_path.string() + "' names the checksum '" +
                    info.checksum + "', expected " + kChecksumWords64 + " or " + kChecksumFnv1a64);
    }
    for (auto it = m.at("checksums").begin(); it != m.at("checksums").end(); ++it) {
      const std::string f = it.key();  // rank_<r>.safetensors
      const std::string digits = f.rfind("rank_", 0) == 0 ? f.substr(5, f.find('.') - 5) : "";
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
          f != "rank_" + digits + ".safetensors") {
        throw IoError("checkpoint: manifest '" + manifest_path.string() + "' lists '" + f +
                      "', expected rank_<r>.safetensors");
      }
      const std::string sum = it.value().get<std::string>();
      if (sum.empty() || sum.find_first_not_of("0123456789") != std::string::npos) {
        throw IoError("checkpoint: manifest '" + manifest_path.string() + "' gives '" + f +
                      "' the checksum '" + sum + "', expected a decimal number");
      }
      info.checksums[std::stoi(digits)] = std::stoull(sum);
    }
  } catch (const nlohmann::json::exception& e) {
    throw IoError("checkpoint: manifest '" + manifest_path.string() +
                  "' lacks or misstates step, layout or checksums: " + e.what());
  } catch (const std::out_of_range&) {
    throw IoError("checkpoint: manifest '" + manifest_path.string() +
                  "' has a rank or checksum out of range");
  }
  return info;
}

void check_checkpoint_layout(const CheckpointInfo& info,
                             const std::map<std::string, std::string>& layout) {
  for (const auto& [key, value] : layout) {
    auto it = info.layout.find(key);
    const std::string stored = it == info.layout.end() ? "(missing)" : it->second;
    if (stored != value) {
      throw IoError("checkpoint '" + info.step_dir + "' was written with " + key + " = " + stored +
                    ", this run has " + key + " = " + value + " (resuming needs the same " + key +
                    ")");
    }
  }
}

namespace {
void require_rank_file(const CheckpointInfo& info, int rank) {
  if (!info.checksums.count(rank))
    throw IoError("checkpoint '" + info.step_dir + "' has no file for rank " +
                  std::to_string(rank));
}
}  // namespace

RankHeader read_rank_header(const CheckpointInfo& info, int rank) {
  require_rank_file(info, rank);
  Safetensors s = load_safetensors(checkpoint_rank_file(info.step_dir, rank),
                                   [](const std::string&) { return false; });
  return {std::move(s.metadata), std::move(s.shapes)};
}

namespace {
// Rank r's file, once its checksum matches the manifest's.
std::string verified_rank_file(const CheckpointInfo& info, int rank) {
  const std::string path = checkpoint_rank_file(info.step_dir, rank);
  require_rank_file(info, rank);
  auto it = info.checksums.find(rank);
  const uint64_t actual = file_checksum(path, info.checksum);
  if (actual != it->second) {
    throw IoError("checkpoint file '" + path + "' is corrupted (checksum " +
                  std::to_string(actual) + ", manifest says " + std::to_string(it->second) + ")");
  }
  return path;
}
}  // namespace

RankState read_rank_state(const CheckpointInfo& info, int rank, const TensorFilter& wanted) {
  Safetensors s = load_safetensors(verified_rank_file(info, rank), wanted);
  return {std::move(s.tensors), std::move(s.metadata)};
}

RankFile::RankFile(const CheckpointInfo& info, int rank, bool verify)
    : file_(verify ? verified_rank_file(info, rank)
                   : (require_rank_file(info, rank), checkpoint_rank_file(info.step_dir, rank))) {}

}  // namespace triad::io
