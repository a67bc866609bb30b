// Hugging Face's tokenizer.json, byte-level BPE kind (GPT-2's, LLaMA 3's,
// Qwen2's and Qwen3's), read into a BpeTokenizer: every setting that
// changes how text becomes ids is either honoured or refused by name.
#include <nlohmann/json.hpp>

#include <climits>
#include <filesystem>

#include "triad/core/error.h"
#include "triad/data/tokenizer.h"
#include "triad/io/text_file.h"

namespace triad::data {
namespace {

using Json = nlohmann::json;

// The pre-tokenisers' regular expressions as tokenizer.json writes them.
const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void unsupported(const std::string& key, const Json& value,
                                const std::string& why) const {
    throw NotSupportedError(source_ + ": '" + key + "' (" + shortened(value) + "): " + why);
  }
  [[noreturn]] void bad(const std::string& key, const std::string& why) const {
    throw IoError(source_ + ": '" + key + "' " + why);
  }

 private:
  static std::string shortened(const Json& v) {
    std::string s = v.dump();
    return s.size() > 200 ? s.substr(0, 200) + "..." : s;
  }
  std::string source_;
};

bool is_byte_level(const Json& j) {
  return j.is_object() && j.value("type", "") == "ByteLevel";
}

// A ByteLevel pre-tokeniser that adds no prefix space.
void check_byte_level(const Reader& r, const std::string& key, const Json& j) {
  if (j.value("add_prefix_space", false))
    r.unsupported(key + ".add_prefix_space", j.at("add_prefix_space"),
                  "a space before the text is not implemented");
}

PretokenizePattern pattern_of(const Reader& r, const Json& pre) {
  const std::string key = "pre_tokenizer";
  if (is_byte_level(pre)) {
    check_byte_level(r, key, pre);
    if (!pre.value("use_regex", true))
      r.unsupported(key + ".use_regex", pre.at("use_regex"),
                    "byte-level pieces without a splitting pattern are not implemented");
    return PretokenizePattern::Gpt2;
  }
  // Split(pattern, Isolated) then ByteLevel without its own pattern.
  const bool sequence = pre.is_object() && pre.value("type", "") == "Sequence" &&
                        pre.contains("pretokenizers") && pre.at("pretokenizers").is_array() &&
                        pre.at("pretokenizers").size() == 2;
  if (!sequence) {
    r.unsupported(key, pre,
                  "expected ByteLevel, or a Sequence of a Split and a ByteLevel (GPT-2's, LLaMA "
                  "3's, Qwen2's)");
  }
  const Json& split = pre.at("pretokenizers").at(0);
  const Json& bytes = pre.at("pretokenizers").at(1);
  if (!split.is_object() || split.value("type", "") != "Split" || !is_byte_level(bytes)) {
    r.unsupported(key, pre, "expected a Split then a ByteLevel");
  }
  check_byte_level(r, key + ".pretokenizers[1]", bytes);
  if (bytes.value("use_regex", true))
    r.unsupported(key + ".pretokenizers[1].use_regex", bytes.at("use_regex"),
                  "a second splitting pattern after the Split is not implemented");
  if (split.value("behavior", "") != "Isolated" || split.value("invert", false)) {
    r.unsupported(key + ".pretokenizers[0]", split,
                  "only an Isolated, not inverted, Split is implemented");
  }
  const Json pattern = split.value("pattern", Json::object());
  const std::string regex =
      pattern.contains("Regex") && pattern.at("Regex").is_string() ? pattern.at("Regex") : "";
  if (regex == kLlama3Regex) return PretokenizePattern::Llama3;
  if (regex == kQwen2Regex) return PretokenizePattern::Qwen2;
  if (regex == kGpt2Regex) return PretokenizePattern::Gpt2;
  r.unsupported(key + ".pretokenizers[0].pattern", pattern,
                "not one of the patterns Triad implements (GPT-2's, LLaMA 3's, Qwen2's)");
}

std::vector<std::pair<std::string, std::string>> merges_of(const Reader& r, const Json& model) {
  std::vector<std::pair<std::string, std::string>> out;
  const Json merges = model.value("merges", Json::array());
  if (!merges.is_array()) r.bad("model.merges", "must be an array");
  out.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    // "left right" (the older form) or ["left", "right"].
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
          s.find(' ', sp + 1) != std::string::npos) {
        r.bad("model.merges[" + std::to_string(i) + "]", "(\"" + s + "\") is not 'left right'");
      }
      out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      r.bad("model.merges[" + std::to_string(i) + "]", "is neither 'left right' nor a pair");
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<BpeTokenizer> load_hf_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string file =
      fs::is_directory(path) ? (fs::path(path) / "tokenizer.json").string() : path;
  std::string text;
  try {
    text = io::read_text_file(file, "Hugging Face tokenizer");
  } catch (const ConfigError& e) {
    throw IoError(e.what());
  }
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    throw IoError(file + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw IoError(file + ": expected a JSON object");
  const Reader r(file);

  if (!root.contains("model") || !root.at("model").is_object()) r.bad("model", "is missing");
  const Json& model = root.at("model");
  const std::string type = model.value("type", "");
  if (type != "BPE") {
    r.unsupported("model.type", model.value("type", Json()),
                  "only byte-level BPE (GPT-2's, LLaMA 3's, Qwen's) is implemented");
  }
  if (model.value("byte_fallback", false))
    r.unsupported("model.byte_fallback", true, "SentencePiece-style byte fallback");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json v = model.value(key, Json());
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty()))
      r.unsupported(std::string("model.") + key, v, "word-piece markers are not implemented");
  }
  if (const Json d = model.value("dropout", Json()); !d.is_null() && d != 0.0)
    r.unsupported("model.dropout", d, "BPE dropout is for training tokenizers");

  BpeTokenizer::Settings s;
  s.ignore_merges = model.value("ignore_merges", false);
  const Json normalizer = root.value("normalizer", Json());
  if (!normalizer.is_null()) {
    if (!normalizer.is_object() || normalizer.value("type", "") != "NFC")
      r.unsupported("normalizer", normalizer, "only NFC (Qwen's) is implemented");
    s.nfc = true;
  }
  s.pattern = pattern_of(r, root.value("pre_tokenizer", Json()));
  const Json decoder = root.value("decoder", Json());
  if (!decoder.is_null() && !is_byte_level(decoder))
    r.unsupported("decoder", decoder, "expected ByteLevel");

  if (!model.contains("vocab") || !model.at("vocab").is_object())
    r.bad("model.vocab", "must map tokens to ids");
  std::map<std::string, int32_t> vocab;
  for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      r.bad("model.vocab", "entry '" + it.key() + "' has the id " + it.value().dump() +
                               ", expected an integer in [0, 2^31)");
    }
    vocab[it.key()] = it.value().get<int32_t>();
  }

  const Json added = root.value("added_tokens", Json::array());
  if (!added.is_array()) r.bad("added_tokens", "must be an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const Json& a = added[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a.at("id").is_number_integer() ||
        !a.contains("content") || !a.at("content").is_string()) {
      r.bad(key, "needs an integer id and a string content");
    }
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      if (a.value(flag, false))
        r.unsupported(key + "." + flag, true,
                      "added tokens that match whole words or absorb spaces are not implemented");
    }
    s.added_tokens[a.at("content").get<std::string>()] = a.at("id").get<int32_t>();
  }
  try {
    return std::make_unique<BpeTokenizer>(std::move(vocab), merges_of(r, model), std::move(s));
  } catch (const ValueError& e) {
    throw IoError(file + ": " + e.what());
  }
}

}  // namespace triad::data
