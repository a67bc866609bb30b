#pragma once

// Jinja, as far as chat templates use it. Hugging Face keeps each model's
// chat template as a Jinja program (tokenizer_config.json's chat_template)
// and runs it with Jinja2 in a sandbox set up by transformers: trim_blocks
// and lstrip_blocks on, {% break %} and {% continue %}, the {% generation
// %} block (it marks what the assistant writes), and three additions of its
// own — raise_exception(message), strftime_now(format) and a tojson filter
// that keeps non-ASCII text as it is. A Template here runs such a program
// the same way, with Jinja2's (and Python's) semantics for what it
// supports:
//   - text, {{ expressions }}, {# comments #}, whitespace control (- and +);
//   - if / elif / else, for (with else, an `if` filter, unpacking,
//     recursive loops calling loop(items), and
//     loop.index, index0, revindex, revindex0, first, last, length,
//     previtem, nextitem, depth, depth0, cycle(...)), set (of a name,
//     several names, a namespace's attribute, or a block), macro with
//     defaults (and `varargs` and `kwargs` for the arguments beyond its
//     parameters, when its body names them), call blocks (with
//     parameters: the macro's caller(...)), filter blocks, break,
//     continue, generation;
//   - literals (strings, numbers, lists, tuples, dicts, true / false /
//     none in either case), attribute and item access, slices, calls,
//     and arithmetic, comparison (chained), `in`, `~`, Python's `%`
//     formatting, logic and conditional expressions with Jinja's
//     precedence;
//   - the filters and tests chat templates use (listed in jinja.cpp), the
//     methods of strings (strip, split, startswith, format with {}, {0}
//     and {name} fields, ...), dicts (items, get, ...) and the globals
//     range, namespace, dict, raise_exception and strftime_now. `escape`
//     (`e`) writes plain escaped text: a Markup string's escaping of what
//     is later added to it with `+` is not reproduced, and a tuple
//     inside a list or dict is written as a list.
// Anything else is a ValueError that names it and the line it is on, as
// are errors while rendering (an undefined name's attribute, a
// raise_exception call, a type that does not fit an operator). A template
// comes with a downloaded model, so it runs within limits (jinja.cpp:
// 64-bit integers, the sandbox's range() of 100000 items, nesting, steps
// and sizes): past one, a ValueError names it, never a crash or a hang.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace triad::data::jinja {

class Template {
 public:
  // Parses `source` (ValueError naming the line of what does not parse).
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // The text the program writes for `context` (a JSON object whose keys
  // are the program's variables). `generation`: where to put the byte
  // ranges of the output that {% generation %} blocks wrote (transformers'
  // assistant mask), in order.
  std::string render(const nlohmann::ordered_json& context,
                     std::vector<std::pair<size_t, size_t>>* generation = nullptr) const;
  // Whether the program marks what the assistant writes ({% generation %}).
  bool has_generation() const;

  struct Program;

 private:
  std::unique_ptr<Program> program_;
};

// A value as Python's json.dumps writes it with transformers' settings
// (ensure_ascii off; ", " and ": " between items, or "," and a newline
// with `indent` >= 0 spaces per level): what the tojson filter writes.
std::string to_json(const nlohmann::ordered_json& value, int indent = -1, bool sort_keys = false);

}  // namespace triad::data::jinja
