#pragma once

// TensorBoard's event files, written without TensorFlow: TFRecord framing
// (each record's length and data followed by their masked CRC-32C) around
// `Event` protocol buffers holding scalar and text summaries. `tensorboard --logdir
// <output.dir>` plots them; a resumed run adds a file beside the first and
// its steps go on.

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "triad/train/metrics.h"

namespace triad::train {

// CRC-32C (Castagnoli), and the masked form TFRecord stores.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and opens dir/events.out.tfevents.<unix
  // time>.<host>.<pid> (TensorBoard reads every file with "tfevents" in its
  // name), writing the file-version event first. An IoError names the file.
  explicit TensorBoardWriter(const std::string& dir);
  // One scalar at a step; `wall_time` in seconds since the epoch (now when
  // negative).
  void scalar(const std::string& tag, int64_t step, double value, double wall_time = -1);
  // One text at a step, for TensorBoard's Text tab (its "text" plugin: a
  // string tensor; the tab renders it as Markdown).
  void text(const std::string& tag, int64_t step, const std::string& value, double wall_time = -1);
  // A session restarting at `step` (a resumed run): TensorBoard discards the
  // points of earlier files from that step on, which the resumed run trains
  // again (SessionLog START).
  void restart(int64_t step);
  // A step's metrics as train/... scalars (and val/loss; eval.samples as
  // samples/N texts, each in a code block so that it shows as written),
  // flushed.
  void write(const StepMetrics& m);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(std::string_view event);
  std::ofstream out_;
  std::string path_;
};

}  // namespace triad::train
