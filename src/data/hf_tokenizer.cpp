// Hugging Face's tokenizer.json, read into a BpeTokenizer (the byte-level
// kind: GPT-2's, LLaMA 3's, Qwen2's, Qwen3's, Phi-4-mini's, Mistral NeMo's)
// or a MetaspaceBpeTokenizer (the SentencePiece kind: LLaMA 2's, Mistral's,
// Gemma's): every setting that changes how text becomes ids, or ids text,
// is honoured or refused by name.
#include <nlohmann/json.hpp>

#include <climits>
#include <filesystem>
#include <optional>

#include "triad/core/error.h"
#include "triad/data/tokenizer.h"
#include "triad/io/json_integer.h"
#include "triad/io/text_file.h"
#include "utf8.h"

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
const char* const kO200kRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kTekkenRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

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
  if (regex == kO200kRegex) return PretokenizePattern::O200k;
  if (regex == kTekkenRegex) return PretokenizePattern::Tekken;
  r.unsupported(key + ".pretokenizers[0].pattern", pattern,
                "not one of the patterns Triad implements (GPT-2's, LLaMA 3's, Qwen2's, "
                "GPT-4o's o200k, Mistral's Tekken)");
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

// A normaliser, pre-tokeniser or decoder: `j` itself, or each step of a
// Sequence (under `list`).
std::vector<std::pair<std::string, Json>> steps_of(const Reader& r, const std::string& key,
                                                   const Json& j, const char* list) {
  std::vector<std::pair<std::string, Json>> out;
  if (j.is_null()) return out;
  if (!j.is_object()) r.bad(key, "must be an object or null");
  if (j.value("type", "") != "Sequence") {
    out.emplace_back(key, j);
    return out;
  }
  const Json steps = j.value(list, Json());
  if (!steps.is_array()) r.bad(key + "." + list, "must be a list");
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string k = key + "." + list + "[" + std::to_string(i) + "]";
    if (!steps[i].is_object()) r.bad(k, "must be an object");
    out.emplace_back(k, steps[i]);
  }
  return out;
}

std::string string_at(const Reader& r, const std::string& key, const Json& j, const char* field) {
  if (!j.contains(field) || !j.at(field).is_string()) r.bad(key + "." + field, "must be a string");
  return j.at(field).get<std::string>();
}

// A Replace step's literal pattern ({"String": ...}; a Regex is refused).
std::string replace_pattern(const Reader& r, const std::string& key, const Json& j) {
  const Json pattern = j.value("pattern", Json());
  if (pattern.is_object() && pattern.contains("String") && pattern.at("String").is_string() &&
      !pattern.at("String").get<std::string>().empty())
    return pattern.at("String").get<std::string>();
  r.unsupported(key + ".pattern", pattern,
                "only a literal, non-empty String pattern is implemented");
}

using Prepend = MetaspaceBpeTokenizer::Prepend;

// Metaspace's prepend_scheme, or its older add_prefix_space.
Prepend prepend_scheme(const Reader& r, const std::string& key, const Json& j) {
  if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
    const Json& v = j.at("prepend_scheme");
    const std::string scheme = v.is_string() ? v.get<std::string>() : "";
    if (scheme == "always") return Prepend::Always;
    if (scheme == "first") return Prepend::First;
    if (scheme == "never") return Prepend::Never;
    r.bad(key + ".prepend_scheme", "(" + v.dump() + ") must be \"always\", \"first\" or \"never\"");
  }
  return j.value("add_prefix_space", true) ? Prepend::Always : Prepend::Never;
}

std::string metaspace_replacement(const Reader& r, const std::string& key, const Json& j) {
  const std::string rep =
      j.contains("replacement") ? string_at(r, key, j, "replacement") : "\xE2\x96\x81";
  size_t len = 0;
  if (rep.empty() || (next_code_point(rep, 0, len), len != rep.size()))
    r.bad(key + ".replacement", "(\"" + rep + "\") must be one character");
  return rep;
}

// The SentencePiece kind's normaliser, pre-tokeniser, model flags and
// decoder (the vocabulary, merges and added tokens are read by the caller).
MetaspaceBpeTokenizer::Settings metaspace_settings(const Reader& r, const Json& root,
                                                   const Json& model) {
  MetaspaceBpeTokenizer::Settings s;
  using Normalize = MetaspaceBpeTokenizer::NormalizeStep;
  for (const auto& [key, step] :
       steps_of(r, "normalizer", root.value("normalizer", Json()), "normalizers")) {
    const std::string type = step.value("type", "");
    if (type == "Prepend") {
      s.normalizer.push_back({Normalize::Kind::Prepend, "", string_at(r, key, step, "prepend")});
    } else if (type == "Replace") {
      s.normalizer.push_back({Normalize::Kind::Replace, replace_pattern(r, key, step),
                              string_at(r, key, step, "content")});
    } else if (type == "NFC") {
      s.normalizer.push_back({Normalize::Kind::Nfc, "", ""});
    } else {
      r.unsupported(key, step, "of the normalisers only Prepend, Replace and NFC are implemented");
    }
  }
  const Json pre = root.value("pre_tokenizer", Json());
  if (pre.is_object() && pre.value("type", "") == "Split") {
    // A literal Split (Gemma's); a regular expression's is refused.
    s.split_pattern = replace_pattern(r, "pre_tokenizer", pre);
    using B = MetaspaceBpeTokenizer::Settings::SplitBehavior;
    const std::string behavior = pre.value("behavior", "");
    s.split_behavior = behavior == "Removed"              ? B::Removed
                       : behavior == "Isolated"           ? B::Isolated
                       : behavior == "Contiguous"         ? B::Contiguous
                       : behavior == "MergedWithPrevious" ? B::MergedWithPrevious
                       : behavior == "MergedWithNext"     ? B::MergedWithNext
                                                          : B::None;
    if (s.split_behavior == B::None)
      r.bad("pre_tokenizer.behavior", "(\"" + behavior + "\") is not one of Hugging Face's");
    if (pre.value("invert", false))
      r.unsupported("pre_tokenizer.invert", true, "an inverted Split is not implemented");
  } else if (!pre.is_null()) {
    if (!pre.is_object() || pre.value("type", "") != "Metaspace") {
      r.unsupported("pre_tokenizer", pre,
                    "with a SentencePiece-style model (byte fallback, or no byte-level "
                    "pre-tokeniser) only Metaspace, a literal Split or none is implemented");
    }
    s.metaspace = true;
    s.replacement = metaspace_replacement(r, "pre_tokenizer", pre);
    s.prepend = prepend_scheme(r, "pre_tokenizer", pre);
    s.split = pre.value("split", true);
  }
  s.byte_fallback = model.value("byte_fallback", false);
  s.fuse_unk = model.value("fuse_unk", false);
  s.ignore_merges = model.value("ignore_merges", false);
  using Decode = MetaspaceBpeTokenizer::DecodeStep;
  for (const auto& [key, step] :
       steps_of(r, "decoder", root.value("decoder", Json()), "decoders")) {
    const std::string type = step.value("type", "");
    Decode d{};
    if (type == "Replace") {
      d.kind = Decode::Kind::Replace;
      d.from = replace_pattern(r, key, step);
      d.to = string_at(r, key, step, "content");
    } else if (type == "ByteFallback") {
      d.kind = Decode::Kind::ByteFallback;
    } else if (type == "Fuse") {
      d.kind = Decode::Kind::Fuse;
    } else if (type == "Strip") {
      d.kind = Decode::Kind::Strip;
      d.from = string_at(r, key, step, "content");
      size_t len = 0;
      if (d.from.empty() || (next_code_point(d.from, 0, len), len != d.from.size()))
        r.bad(key + ".content", "must be one character");
      for (const char* count : {"start", "stop"}) {
        const Json v = step.value(count, Json(0));
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
          r.bad(key + "." + count, "(" + v.dump() + ") must be a count");
        (std::string(count) == "start" ? d.start : d.stop) = v.get<int>();
      }
    } else if (type == "Metaspace") {
      d.kind = Decode::Kind::Metaspace;
      d.from = metaspace_replacement(r, key, step);
      d.prepend = prepend_scheme(r, key, step);
    } else {
      r.unsupported(key, step,
                    "with a SentencePiece-style model only the Replace, ByteFallback, Fuse, Strip "
                    "and Metaspace decoders are implemented");
    }
    s.decoder.push_back(d);
  }
  return s;
}

// The tokenizer `root` (the parsed file) describes.
std::unique_ptr<Tokenizer> read_hf_tokenizer(const Reader& r, const Json& root,
                                             const std::string& file) {
  if (!root.contains("model") || !root.at("model").is_object()) r.bad("model", "is missing");
  const Json& model = root.at("model");
  const std::string type = model.value("type", "");
  if (type != "BPE") {
    r.unsupported("model.type", model.value("type", Json()),
                  "only BPE (byte-level: GPT-2's, LLaMA 3's, Qwen's; SentencePiece-style: "
                  "LLaMA 2's, Mistral's, Gemma's) is implemented");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json v = model.value(key, Json());
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty()))
      r.unsupported(std::string("model.") + key, v, "word-piece markers are not implemented");
  }
  if (const Json d = model.value("dropout", Json()); !d.is_null() && d != 0.0)
    r.unsupported("model.dropout", d, "BPE dropout is for training tokenizers");

  // The SentencePiece kind: byte fallback, or spaces written as ▁ (no
  // pre-tokeniser, or Metaspace) rather than bytes mapped to characters.
  const Json pre = root.value("pre_tokenizer", Json());
  const bool sentencepiece_kind = model.value("byte_fallback", false) || pre.is_null() ||
                                  (pre.is_object() && pre.value("type", "") == "Metaspace");
  std::optional<MetaspaceBpeTokenizer::Settings> metaspace;
  BpeTokenizer::Settings s;
  if (sentencepiece_kind) {
    metaspace = metaspace_settings(r, root, model);
  } else {
    s.ignore_merges = model.value("ignore_merges", false);
    const Json normalizer = root.value("normalizer", Json());
    if (!normalizer.is_null()) {
      if (!normalizer.is_object() || normalizer.value("type", "") != "NFC")
        r.unsupported("normalizer", normalizer, "only NFC (Qwen's) is implemented");
      s.nfc = true;
    }
    s.pattern = pattern_of(r, pre);
    const Json decoder = root.value("decoder", Json());
    if (!decoder.is_null() && !is_byte_level(decoder))
      r.unsupported("decoder", decoder, "expected ByteLevel");
  }

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
  if (metaspace) {
    const Json unk = model.value("unk_token", Json());
    if (!unk.is_null()) {
      if (!unk.is_string()) r.bad("model.unk_token", "must be a string or null");
      const auto it = vocab.find(unk.get<std::string>());
      if (it == vocab.end())
        r.bad("model.unk_token", "('" + unk.get<std::string>() + "') is not in the vocabulary");
      metaspace->unk_id = it->second;
    }
  }

  std::map<std::string, int32_t> added_tokens;
  const Json added = root.value("added_tokens", Json::array());
  if (!added.is_array()) r.bad("added_tokens", "must be an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const Json& a = added[i];
    const std::string key = "added_tokens[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("id") || !a.at("id").is_number_integer() ||
        !a.contains("content") || !a.at("content").is_string()) {
      r.bad(key, "needs an integer id and a string content");
    }
    if (const auto id = io::json_integer(a.at("id")); !id || *id < 0 || *id > INT32_MAX)
      r.bad(key + ".id", "(" + a.at("id").dump() + ") must be an id in [0, 2^31)");
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      if (a.value(flag, false))
        r.unsupported(key + "." + flag, true,
                      "added tokens that match whole words or absorb spaces are not implemented");
    }
    const std::string content = a.at("content").get<std::string>();
    // A normalized token is matched in the normalised text: the same as in
    // the raw text only where the normaliser leaves it as it is.
    if (metaspace && !metaspace->normalizer.empty() &&
        a.value("normalized", !a.value("special", false))) {
      MetaspaceBpeTokenizer::Settings plain;
      plain.normalizer = metaspace->normalizer;
      const MetaspaceBpeTokenizer probe({}, {}, plain);
      if (probe.words(content, false) != std::vector<std::string>{content}) {
        r.unsupported(key + ".normalized", true,
                      "an added token matched in normalised text that the normaliser changes ('" +
                          content + "' becomes '" + probe.words(content, false).front() +
                          "') is not implemented");
      }
    }
    added_tokens[content] = a.at("id").get<int32_t>();
  }
  try {
    if (metaspace) {
      metaspace->added_tokens = std::move(added_tokens);
      return std::make_unique<MetaspaceBpeTokenizer>(std::move(vocab), merges_of(r, model),
                                                     std::move(*metaspace));
    }
    s.added_tokens = std::move(added_tokens);
    return std::make_unique<BpeTokenizer>(std::move(vocab), merges_of(r, model), std::move(s));
  } catch (const ValueError& e) {
    throw IoError(file + ": " + e.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string file =
      io::is_directory(path) ? (fs::path(path) / "tokenizer.json").string() : path;
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
  try {
    return read_hf_tokenizer(r, root, file);
  } catch (const Json::exception& e) {
    // A field of the wrong type where a default was taken (a null flag).
    throw IoError(file + ": " + e.what());
  }
}

}  // namespace triad::data
