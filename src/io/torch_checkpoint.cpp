#include "triad/io/torch_checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "data/mapped_file.h"
#include "triad/core/error.h"
#include "triad/ops/creation.h"

namespace triad::io {
namespace {

// Little-endian fields (zip's, and the pickle's binary integers).
template <class T>
T le(const std::byte* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

// An entry of the archive: where its bytes lie in the file.
struct ZipEntry {
  uint64_t offset = 0, size = 0;
};

// The archive's entries by name. torch.save stores them uncompressed, so
// each one's bytes are read in place; archives past 4 GiB (a sharded
// checkpoint's parts) use zip64's fields.
std::map<std::string, ZipEntry> zip_entries(const std::byte* d, uint64_t size,
                                            const std::string& path) {
  auto bad = [&](const std::string& what) {
    return IoError("PyTorch checkpoint '" + path + "': " + what);
  };
  auto need = [&](uint64_t at, uint64_t bytes) {
    if (at > size || bytes > size - at) throw bad("the zip archive is truncated");
  };
  if (size < 22) throw bad("too short to be a zip archive (torch.save's format)");
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(size) - 22;
       i >= 0 && i >= static_cast<int64_t>(size) - 22 - 65535; --i) {
    if (le<uint32_t>(d + i) == 0x06054b50u) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw bad("no zip directory: not a torch.save file");
  uint64_t count = le<uint16_t>(d + eocd + 10), dir_size = le<uint32_t>(d + eocd + 12),
           dir_at = le<uint32_t>(d + eocd + 16);
  if (count == 0xFFFF || dir_size == 0xFFFFFFFFu || dir_at == 0xFFFFFFFFu) {
    if (eocd < 20 || le<uint32_t>(d + eocd - 20) != 0x07064b50u)
      throw bad("a zip64 archive without its locator");
    const uint64_t z = le<uint64_t>(d + eocd - 20 + 8);
    need(z, 56);
    if (le<uint32_t>(d + z) != 0x06064b50u) throw bad("a damaged zip64 directory record");
    count = le<uint64_t>(d + z + 32);
    dir_size = le<uint64_t>(d + z + 40);
    dir_at = le<uint64_t>(d + z + 48);
  }
  need(dir_at, dir_size);
  std::map<std::string, ZipEntry> out;
  uint64_t p = dir_at;
  for (uint64_t n = 0; n < count; ++n) {
    need(p, 46);
    if (le<uint32_t>(d + p) != 0x02014b50u) throw bad("a damaged zip directory entry");
    const uint16_t method = le<uint16_t>(d + p + 10), name_len = le<uint16_t>(d + p + 28),
                   extra_len = le<uint16_t>(d + p + 30), comment_len = le<uint16_t>(d + p + 32);
    uint64_t stored = le<uint32_t>(d + p + 20), plain = le<uint32_t>(d + p + 24),
             local = le<uint32_t>(d + p + 42);
    need(p + 46, static_cast<uint64_t>(name_len) + extra_len + comment_len);
    const std::string name(reinterpret_cast<const char*>(d + p + 46), name_len);
    // zip64's extended sizes and offset, for the fields saturated above.
    for (uint64_t q = p + 46 + name_len, end = q + extra_len; q + 4 <= end;) {
      const uint16_t id = le<uint16_t>(d + q), len = le<uint16_t>(d + q + 2);
      if (q + 4 + len > end) throw bad("a damaged extra field of '" + name + "'");
      if (id == 1) {
        uint64_t r = q + 4;
        for (uint64_t* field : {&plain, &stored, &local}) {
          if (*field != 0xFFFFFFFFu) continue;
          if (r + 8 > q + 4 + len) throw bad("a damaged zip64 field of '" + name + "'");
          *field = le<uint64_t>(d + r);
          r += 8;
        }
      }
      q += 4 + static_cast<uint64_t>(len);
    }
    if (method != 0 || stored != plain) {
      throw bad("entry '" + name + "' is compressed (method " + std::to_string(method) +
                "); torch.save stores its entries as they are");
    }
    need(local, 30);
    if (le<uint32_t>(d + local) != 0x04034b50u) throw bad("a damaged zip entry '" + name + "'");
    const uint64_t at = local + 30 + le<uint16_t>(d + local + 26) +
                        static_cast<uint64_t>(le<uint16_t>(d + local + 28));
    need(at, stored);
    out[name] = {at, stored};
    p += 46 + static_cast<uint64_t>(name_len) + extra_len + comment_len;
  }
  return out;
}

// ---- the pickle: just what a state dict is written with ----

struct PickleValue;
using ValuePtr = std::shared_ptr<PickleValue>;
struct PickleValue {
  enum class Kind { None, Int, Float, String, Tuple, List, Dict, Global, Storage, Tensor, Mark };
  Kind kind = Kind::None;
  int64_t i = 0;                // Int (and booleans)
  double f = 0;                 // Float
  std::string s;                // String; Global's "module.name"; Storage's and Tensor's key
  std::vector<ValuePtr> items;  // Tuple, List; Dict as key, value, key, value, ...
  DType dtype = DType::F32;     // Storage, Tensor: the type read into
  int narrow = 0;               // ... from 1- or 2-byte integers (bytes; negative: signed)
  int64_t numel = 0;            // Storage: its elements
  int64_t offset = 0;           // Tensor: where it starts in its storage
  Shape size, stride;           // Tensor
};

ValuePtr make(PickleValue::Kind k) {
  auto v = std::make_shared<PickleValue>();
  v->kind = k;
  return v;
}

// A typed storage's class as torch.save names it: the type its elements
// are read into, and for the narrow integers (bool, uint8, int8, int16:
// buffers such as an attention mask, which Triad holds as i32) their width
// in bytes, negative when signed.
bool storage_dtype(const std::string& type, DType* dtype, int* narrow) {
  static const std::map<std::string, std::pair<DType, int>> kTypes = {
      {"torch.FloatStorage", {DType::F32, 0}},  {"torch.DoubleStorage", {DType::F64, 0}},
      {"torch.HalfStorage", {DType::F16, 0}},   {"torch.BFloat16Storage", {DType::BF16, 0}},
      {"torch.LongStorage", {DType::I64, 0}},   {"torch.IntStorage", {DType::I32, 0}},
      {"torch.ShortStorage", {DType::I32, -2}}, {"torch.CharStorage", {DType::I32, -1}},
      {"torch.ByteStorage", {DType::I32, 1}},   {"torch.BoolStorage", {DType::I32, 1}}};
  const auto it = kTypes.find(type);
  if (it == kTypes.end()) return false;
  *dtype = it->second.first;
  *narrow = it->second.second;
  return true;
}

class Unpickler {
 public:
  Unpickler(const std::byte* data, uint64_t size, std::string source)
      : d_(data), n_(size), source_(std::move(source)) {}

  ValuePtr run() {
    while (true) {
      const uint8_t op = byte();
      switch (op) {
        case 0x80:  // PROTO
          byte();
          break;
        case 0x95:  // FRAME
          bytes(8);
          break;
        case '}':  // EMPTY_DICT
          push(make(PickleValue::Kind::Dict));
          break;
        case ']':  // EMPTY_LIST
          push(make(PickleValue::Kind::List));
          break;
        case ')':  // EMPTY_TUPLE
          push(make(PickleValue::Kind::Tuple));
          break;
        case '(':  // MARK
          marks_.push_back(stack_.size());
          break;
        case 'q':  // BINPUT
          memo_[byte()] = top();
          break;
        case 'r':  // LONG_BINPUT
          memo_[le<uint32_t>(bytes(4))] = top();
          break;
        case 0x94:  // MEMOIZE
          memo_[static_cast<uint32_t>(memo_.size())] = top();
          break;
        case 'h':  // BINGET
          push(recall(byte()));
          break;
        case 'j':  // LONG_BINGET
          push(recall(le<uint32_t>(bytes(4))));
          break;
        case 'X':  // BINUNICODE
          push(string(le<uint32_t>(bytes(4))));
          break;
        case 0x8c:  // SHORT_BINUNICODE
        case 'U':   // SHORT_BINSTRING
          push(string(byte()));
          break;
        case 'T':  // BINSTRING
          push(string(le<uint32_t>(bytes(4))));
          break;
        case 'c': {  // GLOBAL
          const std::string module = line(), name = line();
          push(global(module + "." + name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const ValuePtr name = pop(), module = pop();
          if (name->kind != PickleValue::Kind::String || module->kind != PickleValue::Kind::String)
            throw bad("STACK_GLOBAL takes two strings");
          push(global(module->s + "." + name->s));
          break;
        }
        case 'K':  // BININT1
          push(integer(byte()));
          break;
        case 'M':  // BININT2
          push(integer(le<uint16_t>(bytes(2))));
          break;
        case 'J':  // BININT
          push(integer(static_cast<int32_t>(le<uint32_t>(bytes(4)))));
          break;
        case 0x8a: {  // LONG1
          const uint8_t len = byte();
          if (len > 8) throw bad("an integer of " + std::to_string(len) + " bytes");
          const std::byte* p = bytes(len);
          uint64_t v = 0;
          for (uint8_t k = 0; k < len; ++k)
            v |= static_cast<uint64_t>(std::to_integer<uint8_t>(p[k])) << (8 * k);
          if (len > 0 && len < 8 && (std::to_integer<uint8_t>(p[len - 1]) & 0x80))
            v |= ~uint64_t{0} << (8 * len);
          push(integer(static_cast<int64_t>(v)));
          break;
        }
        case 'G': {  // BINFLOAT (big-endian)
          const std::byte* p = bytes(8);
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = (bits << 8) | std::to_integer<uint8_t>(p[k]);
          ValuePtr v = make(PickleValue::Kind::Float);
          std::memcpy(&v->f, &bits, 8);
          push(v);
          break;
        }
        case 0x88:  // NEWTRUE
        case 0x89:  // NEWFALSE
          push(integer(op == 0x88 ? 1 : 0));
          break;
        case 'N':  // NONE
          push(make(PickleValue::Kind::None));
          break;
        case 't':  // TUPLE
          push(tuple(pop_mark()));
          break;
        case 0x85:    // TUPLE1
        case 0x86:    // TUPLE2
        case 0x87: {  // TUPLE3
          std::vector<ValuePtr> items(op - 0x84);
          for (size_t k = items.size(); k-- > 0;) items[k] = pop();
          push(tuple(std::move(items)));
          break;
        }
        case 's': {  // SETITEM
          const ValuePtr v = pop(), k = pop();
          add_items(top(), {k, v}, PickleValue::Kind::Dict);
          break;
        }
        case 'u':  // SETITEMS
        {
          std::vector<ValuePtr> kv = pop_mark();
          add_items(top(), kv, PickleValue::Kind::Dict);
          break;
        }
        case 'a': {  // APPEND
          const ValuePtr v = pop();
          add_items(top(), {v}, PickleValue::Kind::List);
          break;
        }
        case 'e':  // APPENDS
        {
          std::vector<ValuePtr> vs = pop_mark();
          add_items(top(), vs, PickleValue::Kind::List);
          break;
        }
        case 'b':  // BUILD: an object's state (an OrderedDict's _metadata); nothing to keep
          pop();
          break;
        case 'Q':  // BINPERSID: a storage, ('storage', type, key, location, numel)
          push(storage(pop()));
          break;
        case 'R': {  // REDUCE
          const ValuePtr args = pop(), callable = pop();
          push(call(callable, args));
          break;
        }
        case 0x81: {  // NEWOBJ
          const ValuePtr args = pop(), cls = pop();
          push(call(cls, args));
          break;
        }
        case '.':  // STOP
          return pop();
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          throw bad(std::string("pickle opcode ") + hex + " at byte " + std::to_string(at_ - 1) +
                    " is not one a state dict is written with");
        }
      }
    }
  }

 private:
  IoError bad(const std::string& what) const {
    return IoError("PyTorch checkpoint '" + source_ + "': " + what);
  }
  const std::byte* bytes(uint64_t count) {
    if (count > n_ - at_) throw bad("the pickle ends early");
    const std::byte* p = d_ + at_;
    at_ += count;
    return p;
  }
  uint8_t byte() { return std::to_integer<uint8_t>(*bytes(1)); }
  std::string line() {
    std::string out;
    while (true) {
      const char c = static_cast<char>(byte());
      if (c == '\n') return out;
      out.push_back(c);
    }
  }
  ValuePtr string(uint64_t len) {
    ValuePtr v = make(PickleValue::Kind::String);
    v->s.assign(reinterpret_cast<const char*>(bytes(len)), len);
    return v;
  }
  static ValuePtr integer(int64_t i) {
    ValuePtr v = make(PickleValue::Kind::Int);
    v->i = i;
    return v;
  }
  static ValuePtr global(std::string name) {
    ValuePtr v = make(PickleValue::Kind::Global);
    v->s = std::move(name);
    return v;
  }
  static ValuePtr tuple(std::vector<ValuePtr> items) {
    ValuePtr v = make(PickleValue::Kind::Tuple);
    v->items = std::move(items);
    return v;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.empty() || (!marks_.empty() && marks_.back() >= stack_.size()))
      throw bad("the pickle pops an empty stack");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const ValuePtr& top() const {
    if (stack_.empty()) throw bad("the pickle reads an empty stack");
    return stack_.back();
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) throw bad("the pickle closes a mark it never opened");
    const size_t from = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> out(stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    return out;
  }
  ValuePtr recall(uint32_t key) const {
    const auto it = memo_.find(key);
    if (it == memo_.end())
      throw bad("the pickle recalls memo " + std::to_string(key) + ", never stored");
    return it->second;
  }
  void add_items(const ValuePtr& to, const std::vector<ValuePtr>& items,
                 PickleValue::Kind kind) const {
    if (to->kind != kind)
      throw bad(kind == PickleValue::Kind::Dict ? "SETITEMS on something not a dictionary"
                                                : "APPENDS on something not a list");
    if (kind == PickleValue::Kind::Dict && items.size() % 2 != 0)
      throw bad("SETITEMS with a key alone");
    to->items.insert(to->items.end(), items.begin(), items.end());
  }
  static std::vector<int64_t> ints(const ValuePtr& v, const char* what, const IoError& err) {
    if (v->kind != PickleValue::Kind::Tuple) throw err;
    std::vector<int64_t> out;
    for (const ValuePtr& x : v->items) {
      if (x->kind != PickleValue::Kind::Int)
        throw IoError(std::string(err.what()) + " (" + what + ")");
      out.push_back(x->i);
    }
    return out;
  }
  ValuePtr storage(const ValuePtr& pid) const {
    const auto& p = pid->items;
    if (pid->kind != PickleValue::Kind::Tuple || p.size() != 5 ||
        p[0]->kind != PickleValue::Kind::String || p[0]->s != "storage" ||
        p[1]->kind != PickleValue::Kind::Global || p[2]->kind != PickleValue::Kind::String ||
        p[4]->kind != PickleValue::Kind::Int)
      throw bad("a persistent id that is not torch.save's ('storage', type, key, location, numel)");
    ValuePtr v = make(PickleValue::Kind::Storage);
    if (!storage_dtype(p[1]->s, &v->dtype, &v->narrow)) {
      throw bad("storage type '" + p[1]->s +
                "' is not supported (float, double, half, bfloat16 and integer storages)");
    }
    v->s = p[2]->s;
    v->numel = p[4]->i;
    return v;
  }
  // The callables a state dict is rebuilt with; anything else is refused
  // before it could do anything.
  ValuePtr call(const ValuePtr& callable, const ValuePtr& args) const {
    if (callable->kind != PickleValue::Kind::Global || args->kind != PickleValue::Kind::Tuple)
      throw bad("the pickle calls something that is not a named function");
    const std::string& f = callable->s;
    const auto& a = args->items;
    if (f == "collections.OrderedDict") {
      if (!a.empty()) throw bad("collections.OrderedDict with arguments");
      return make(PickleValue::Kind::Dict);
    }
    if (f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") {
      if (a.size() < 4 || a[0]->kind != PickleValue::Kind::Storage ||
          a[1]->kind != PickleValue::Kind::Int)
        throw bad(f + " without (storage, offset, size, stride)");
      const IoError err = bad(f + "'s size and stride must be tuples of integers");
      ValuePtr t = make(PickleValue::Kind::Tensor);
      t->s = a[0]->s;
      t->dtype = a[0]->dtype;
      t->narrow = a[0]->narrow;
      t->numel = a[0]->numel;
      t->offset = a[1]->i;
      t->size = ints(a[2], "size", err);
      t->stride = ints(a[3], "stride", err);
      if (t->size.size() != t->stride.size()) throw err;
      return t;
    }
    if (f == "torch._utils._rebuild_parameter" ||
        f == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->kind != PickleValue::Kind::Tensor)
        throw bad(f + " without its tensor");
      return a[0];
    }
    throw bad("the pickle calls '" + f +
              "', which a state dict is not rebuilt with; Triad runs no code from a checkpoint");
  }

  const std::byte* d_;
  uint64_t n_, at_ = 0;
  std::string source_;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint32_t, ValuePtr> memo_;
};

// Gathers a strided view of `src` (elements of `elem` bytes) into `dst`,
// row-major.
void gather(const std::byte* src, const Shape& size, const Shape& stride, size_t elem,
            std::byte* dst) {
  const size_t dims = size.size();
  int64_t total = 1;
  for (int64_t s : size) total *= s;
  if (total == 0) return;
  std::vector<int64_t> index(dims, 0);
  for (int64_t n = 0; n < total; ++n) {
    int64_t at = 0;
    for (size_t k = 0; k < dims; ++k) at += index[k] * stride[k];
    std::memcpy(dst + n * static_cast<int64_t>(elem), src + at * static_cast<int64_t>(elem), elem);
    for (size_t k = dims; k-- > 0;) {
      if (++index[k] < size[k]) break;
      index[k] = 0;
    }
  }
}

}  // namespace

struct TorchCheckpointFile::State {
  std::unique_ptr<data::MappedFile> file;
  std::map<std::string, ZipEntry> entries;
  std::string prefix;                          // "<archive>/"
  std::map<std::string, PickleValue> tensors;  // the state dict's, by name
  std::map<std::string, Shape> shapes;
};

TorchCheckpointFile::TorchCheckpointFile(const std::string& path)
    : state_(std::make_unique<State>()) {
  try {
    state_->file = std::make_unique<data::MappedFile>(path);
  } catch (const IoError& e) {
    throw IoError("PyTorch checkpoint: cannot open '" + path + "': " + e.what());
  }
  const std::byte* d = state_->file->data();
  state_->entries = zip_entries(d, state_->file->size(), path);
  const std::string pkl = "data.pkl";
  for (const auto& [name, e] : state_->entries) {
    if (name.size() >= pkl.size() && name.compare(name.size() - pkl.size(), pkl.size(), pkl) == 0 &&
        (name.size() == pkl.size() || name[name.size() - pkl.size() - 1] == '/')) {
      state_->prefix = name.substr(0, name.size() - pkl.size());
    }
  }
  const auto pickle = state_->entries.find(state_->prefix + pkl);
  if (pickle == state_->entries.end())
    throw IoError("PyTorch checkpoint '" + path + "': no data.pkl in the archive");
  if (const auto order = state_->entries.find(state_->prefix + "byteorder");
      order != state_->entries.end()) {
    const std::string text(reinterpret_cast<const char*>(d + order->second.offset),
                           order->second.size);
    if (text != "little")
      throw IoError("PyTorch checkpoint '" + path + "': byte order '" + text +
                    "' (only little-endian files are read)");
  }
  const ValuePtr root = Unpickler(d + pickle->second.offset, pickle->second.size, path).run();
  if (root->kind != PickleValue::Kind::Dict)
    throw IoError("PyTorch checkpoint '" + path + "' holds no dictionary of tensors");
  for (size_t k = 0; k + 1 < root->items.size(); k += 2) {
    const ValuePtr& key = root->items[k];
    const ValuePtr& value = root->items[k + 1];
    if (key->kind != PickleValue::Kind::String)
      throw IoError("PyTorch checkpoint '" + path + "': a key that is not a string");
    if (value->kind != PickleValue::Kind::Tensor)
      throw IoError("PyTorch checkpoint '" + path + "': '" + key->s +
                    "' is not a tensor (a state dict of tensors is expected)");
    state_->tensors[key->s] = *value;
    state_->shapes[key->s] = value->size;
  }
}

TorchCheckpointFile::~TorchCheckpointFile() = default;
TorchCheckpointFile::TorchCheckpointFile(TorchCheckpointFile&&) noexcept = default;
TorchCheckpointFile& TorchCheckpointFile::operator=(TorchCheckpointFile&&) noexcept = default;

const std::string& TorchCheckpointFile::path() const {
  return state_->file->path();
}

const std::map<std::string, Shape>& TorchCheckpointFile::shapes() const {
  return state_->shapes;
}

std::map<std::string, Tensor> TorchCheckpointFile::read(const TensorFilter& wanted) const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : state_->tensors) {
    if (wanted && !wanted(name)) continue;
    const std::string where = "PyTorch checkpoint '" + path() + "': tensor '" + name + "'";
    const auto entry = state_->entries.find(state_->prefix + "data/" + t.s);
    if (entry == state_->entries.end())
      throw IoError(where + ": its storage '" + t.s + "' is not in the archive");
    const size_t elem =
        t.narrow != 0 ? static_cast<size_t>(std::abs(t.narrow)) : dtype_size(t.dtype);
    if (t.numel < 0 || static_cast<uint64_t>(t.numel) > entry->second.size / elem)
      throw IoError(where + ": its storage holds " + std::to_string(entry->second.size) +
                    " bytes, not " + std::to_string(t.numel) + " elements");
    // The furthest element the view reaches must lie in the storage (sums
    // and products checked, as a damaged pickle may say anything).
    int64_t last = t.offset, total = 1;
    bool overflow = false;
    for (size_t k = 0; k < t.size.size(); ++k) {
      if (t.size[k] < 0 || t.stride[k] < 0) throw IoError(where + ": a negative size or stride");
      int64_t reach = 0;
      overflow = overflow ||
                 __builtin_mul_overflow(t.size[k] > 0 ? t.size[k] - 1 : 0, t.stride[k], &reach) ||
                 __builtin_add_overflow(last, reach, &last) ||
                 __builtin_mul_overflow(total, t.size[k], &total);
    }
    if (overflow || total > (int64_t{1} << 40))
      throw IoError(where + ": a view of more elements than any tensor holds");
    if (total > 0 && (t.offset < 0 || last >= t.numel))
      throw IoError(where + ": its view reaches past its storage of " + std::to_string(t.numel) +
                    " elements");
    const std::byte* at =
        state_->file->data() + entry->second.offset + t.offset * static_cast<int64_t>(elem);
    Tensor copy = empty(t.size, t.dtype);
    if (t.narrow == 0) {
      gather(at, t.size, t.stride, elem, static_cast<std::byte*>(copy.raw_data()));
    } else {  // 1- or 2-byte integers, widened to i32
      std::vector<std::byte> packed(static_cast<size_t>(copy.numel()) * elem);
      gather(at, t.size, t.stride, elem, packed.data());
      int32_t* to = copy.data<int32_t>();
      for (int64_t n = 0; n < copy.numel(); ++n) {
        const std::byte* e = packed.data() + n * static_cast<int64_t>(elem);
        const uint32_t raw = elem == 1 ? std::to_integer<uint8_t>(e[0]) : le<uint16_t>(e);
        to[n] = t.narrow == -1   ? static_cast<int8_t>(raw)
                : t.narrow == -2 ? static_cast<int16_t>(raw)
                                 : static_cast<int32_t>(raw);
      }
    }
    out.emplace(name, copy);
  }
  return out;
}

bool is_torch_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

}  // namespace triad::io
