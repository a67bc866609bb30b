// A checkpoint directory as a resume or triad-export opens it: the
// `latest` marker, step_5/manifest.json and rank 0's file (the input's
// three parts: manifest, marker, rank file, kPartSeparator between). What
// opens reads rank 0's header and, its checksum matching, its state: the
// two agree on the metadata and the tensors' shapes.
#include <filesystem>

#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/io/checkpoint.h"

TRIAD_FUZZ_TARGET(checkpoint) {
  using triad::fuzz::require;
  namespace fs = std::filesystem;
  const auto parts = triad::fuzz::split_input(data, size, 3);
  const fs::path dir = fs::path(triad::fuzz::scratch_dir()) / "checkpoints";
  fs::remove_all(dir);
  fs::create_directories(dir / "step_5");
  triad::fuzz::write_input("checkpoints/step_5/manifest.json", parts[0]);
  triad::fuzz::write_input("checkpoints/latest", parts[1]);
  triad::fuzz::write_input("checkpoints/step_5/rank_0.safetensors", parts[2]);
  const triad::io::CheckpointInfo info = triad::io::open_checkpoint(dir.string());
  try {
    triad::io::check_checkpoint_layout(info, {{"tensor_parallel", "1"}});
  } catch (const triad::Error&) {
  }
  try {
    (void)triad::io::recent_checkpoints(dir.string(), 1);
  } catch (const triad::Error&) {
  }
  const triad::io::RankHeader header = triad::io::read_rank_header(info, 0);
  const triad::io::RankState state = triad::io::read_rank_state(info, 0);
  require(state.metadata == header.metadata, "the header's metadata is the state's");
  require(state.tensors.size() == header.shapes.size(), "the header lists every tensor");
  for (const auto& [name, t] : state.tensors) {
    const auto it = header.shapes.find(name);
    require(it != header.shapes.end() && it->second == t.shape(),
            "the header gives each tensor's shape");
  }
}
