// A torch.save file (zip archive, pickled state dict, storages): every
// tensor it describes read out.
#include "fuzz_input.h"
#include "fuzz_target.h"
#include "triad/io/torch_checkpoint.h"

TRIAD_FUZZ_TARGET(torch_checkpoint) {
  const std::string path = triad::fuzz::write_input("model.bin", data, size);
  if (!triad::io::is_torch_checkpoint(path)) return;
  const triad::io::TorchCheckpointFile file(path);
  (void)file.read();
}
