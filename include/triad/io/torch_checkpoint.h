#pragma once

#include <map>
#include <memory>
#include <string>

#include "triad/io/safetensors.h"

namespace triad::io {

// A PyTorch checkpoint as torch.save writes it since PyTorch 1.6 (a zip
// archive: <name>/data.pkl, the pickled object, beside <name>/data/<key>,
// each storage's bytes): Hugging Face's pytorch_model.bin, sharded or not,
// and the older checkpoints (Pythia's intermediate steps, many fine-tunes)
// that come in no other format. It must hold a dictionary of tensors (a
// state dict), read without Python: a small pickle machine knows the few
// callables a state dict is rebuilt with (collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 and _rebuild_parameter, the typed
// storages) and refuses any other, naming it, so a file never runs code.
// Tensors are copied out of the mapped file as they are read, strided
// views (a transposed weight, one sharing another's storage) gathered
// into contiguous tensors. f32, f64, f16, bf16, i64 and i32 storages keep
// their type; bool, uint8, int8 and int16 ones (buffers such as an
// attention mask) are widened to i32. Another type, a compressed entry, a
// big-endian file, or anything but tensors as the dictionary's values is
// an IoError naming the file.
class TorchCheckpointFile {
 public:
  explicit TorchCheckpointFile(const std::string& path);
  ~TorchCheckpointFile();
  TorchCheckpointFile(TorchCheckpointFile&&) noexcept;
  TorchCheckpointFile& operator=(TorchCheckpointFile&&) noexcept;

  const std::string& path() const;
  const std::map<std::string, Shape>& shapes() const;
  // Copies out the tensors `wanted` names (every tensor when it is empty).
  std::map<std::string, Tensor> read(const TensorFilter& wanted = {}) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Whether `path` names a torch.save file by its bytes (a zip archive).
bool is_torch_checkpoint(const std::string& path);

}  // namespace triad::io
