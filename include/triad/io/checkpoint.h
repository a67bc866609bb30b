#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "triad/core/tensor.h"
#include "triad/io/safetensors.h"

namespace triad::io {

// Checkpoint directories, committed atomically:
//   <dir>/step_<N>/rank_<r>.safetensors   every rank's own state
//   <dir>/step_<N>/manifest.json          layout, config, a checksum per file
//   <dir>/latest                          "step_<N>", written last
// A step directory is first written as step_<N>.tmp, files fsynced, then
// renamed; `latest` moves only after that, so a checkpoint without its
// marker (an interrupted write) is never loaded.

// A rank file's checksum. "words64" (written since 2026-11-25): the
// file's words64_checksum (core/checksum.h: memory speed, any one changed
// word changes it). "fnv1a64": FNV-1a
// byte by byte, what older manifests (which name no checksum) hold.
inline constexpr const char* kChecksumWords64 = "words64";
inline constexpr const char* kChecksumFnv1a64 = "fnv1a64";
uint64_t file_checksum(const std::string& path, const std::string& kind = kChecksumWords64);

// Where rank r writes while step N is being saved (inside the .tmp dir).
std::string checkpoint_staging_dir(const std::string& dir, int64_t step);
std::string checkpoint_rank_file(const std::string& step_dir, int rank);

// Writes a rank's tensors (any device: each is moved to the host as it is
// written) and string metadata into the staging dir, fsynced, then its
// checksum beside it (rank_<r>.safetensors.checksum): every rank hashes its
// own file, in parallel.
void write_rank_state(const std::string& staging_dir, int rank,
                      const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

// Rank 0, after every rank has written: the manifest (layout, config text,
// the checksums the ranks wrote beside their files, a file without one
// hashed here, and `val_loss` when given), then rename staging -> step_<N>,
// then the `latest` marker; finally removes all but the newest `keep`
// checkpoints and those whose step is a multiple of `keep_every` (> 0). With
// `keep_best`, the checkpoint whose manifest has the lowest val_loss (the
// earliest of equals) is kept too and the `best` marker names it; its step
// is returned (none without keep_best or a validation loss).
std::optional<int64_t> commit_checkpoint(const std::string& dir, int64_t step, int world_size,
                                         const std::map<std::string, std::string>& layout,
                                         const std::string& config_yaml, int keep,
                                         int64_t keep_every = 0,
                                         std::optional<double> val_loss = std::nullopt,
                                         bool keep_best = false);

// Creates `dir` if needed and writes (then removes) a probe file there as
// rank `rank`; an IoError names the directory and the reason when it cannot.
// The trainer calls it before the first step, so an unwritable directory
// fails the run at once instead of at its first checkpoint.
void check_checkpoint_dir_writable(const std::string& dir, int rank);

struct CheckpointInfo {
  std::string step_dir;
  int64_t step = 0;
  std::map<std::string, std::string> layout;
  std::map<int, uint64_t> checksums;        // rank -> checksum
  std::string checksum = kChecksumFnv1a64;  // their kind (file_checksum)
  std::string config;                       // the writing run's resolved config (YAML)
  std::optional<double> val_loss;  // the validation loss at its step, when the run measured one
};

// The checkpoint `latest` points to, if any (validated manifest).
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& dir);
// The steps of the step_<N> directories in `dir`, newest first (finished or
// not: a caller reading them checks their manifests).
std::vector<int64_t> checkpoint_steps(const std::string& dir);
// The `count` newest checkpoints of a checkpoint.dir up to the one `path`
// names (a step directory, or the checkpoint.dir: its latest), newest first,
// manifests validated; fewer is an IoError listing the steps there are.
std::vector<CheckpointInfo> recent_checkpoints(const std::string& path, int64_t count);
// One checkpoint by its step directory (<dir>/step_<N>), manifest validated.
CheckpointInfo read_checkpoint(const std::string& step_dir);
// A step directory, or a checkpoint.dir (its latest checkpoint); anything
// else is an IoError naming the path and both forms.
CheckpointInfo open_checkpoint(const std::string& path);
// Whether `path` is either (a directory with manifest.json or `latest`).
bool is_checkpoint(const std::string& path);

// Checks the stored layout's entries for the keys of `layout` (the trainer
// passes those a resume cannot change: the model's shape): an error names
// the first key that differs and both values.
void check_checkpoint_layout(const CheckpointInfo& info,
                             const std::map<std::string, std::string>& layout);

// Reads rank r's file, verifying its checksum first (a mismatch names the
// file). `wanted`, when given, names the tensors to copy out (the rest of
// the file is checked, not held).
struct RankState {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};
RankState read_rank_state(const CheckpointInfo& info, int rank, const TensorFilter& wanted = {});
// Rank r's metadata and the shape of every tensor it holds, from the
// file's header alone: no checksum, no tensor read.
struct RankHeader {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Shape> shapes;
};
RankHeader read_rank_header(const CheckpointInfo& info, int rank);
// Rank r's file verified against its checksum once and then mapped: its
// tensors, or pieces of them, copied out as they are wanted (a resume under
// another layout takes one parameter's state at a time from many files).
// `verify` false skips the checksum, for a reader that has just verified
// the same file (an export's second pass).
class RankFile {
 public:
  RankFile(const CheckpointInfo& info, int rank, bool verify = true);
  const SafetensorsFile& file() const { return file_; }

 private:
  SafetensorsFile file_;
};

}  // namespace triad::io
