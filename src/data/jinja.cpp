// Jinja for chat templates (include/triad/data/jinja.h): a lexer that
// applies transformers' whitespace settings, a recursive-descent parser
// with Jinja2's operator precedence, and a tree-walking renderer whose
// values follow Python's semantics (truth, str(), comparisons, slices).
#include "triad/data/jinja.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "ascii_space.h"
#include "triad/core/error.h"
#include "unicode_classes.h"
#include "utf8.h"

namespace triad::data::jinja {

using json = nlohmann::ordered_json;

namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw ValueError("chat template, line " + std::to_string(line) + ": " + what);
}

// What a template may not exceed. A chat template comes with a downloaded
// model, so whatever it holds ends in an error, never in a crash, a hang or
// all of memory. Real templates stay far inside these (a few levels of
// nesting, thousands of steps, kilobytes of text).
constexpr int kMaxNesting = 256;          // parser: brackets, operators, blocks inside each other
constexpr int kMaxExprDepth = 128;        // one expression's tree
constexpr int kMaxRenderDepth = 512;      // renderer: expressions and statements in progress
constexpr int kMaxCallDepth = 100;        // renderer: macro calls (and loop(...)) in progress
constexpr int kMaxDataDepth = 256;        // lists and dicts inside each other in a stored value
constexpr int64_t kMaxSteps = 2'000'000;  // expressions and statements run by one render
constexpr int64_t kMaxRange = 100000;     // range()'s items, as Jinja2's sandbox (MAX_RANGE)
constexpr size_t kMaxText = size_t{16} << 20;  // bytes in any string, the output included
constexpr size_t kMaxItems = size_t{1} << 20;  // items in any list or dict

// Counts one level of recursion in `depth` while alive; past `limit`, an
// error saying what nests too deeply.
class Nest {
 public:
  Nest(int& depth, int limit, int line, const char* what) : depth_(depth) {
    if (++depth_ > limit) {
      --depth_;
      fail(line, std::string(what) + " nest more than " + std::to_string(limit) + " levels deep");
    }
  }
  ~Nest() { --depth_; }
  Nest(const Nest&) = delete;
  Nest& operator=(const Nest&) = delete;

 private:
  int& depth_;
};

// ---------------------------------------------------------------- lexing

enum class Tok { Name, String, Int, Float, Op, End };

struct Token {
  Tok kind = Tok::End;
  std::string text;  // a name, an operator, or a string literal's value
  int line = 0;
  int64_t integer = 0;
  double number = 0;
};

// The template cut into text and tags, whitespace control applied.
struct Chunk {
  enum Kind { Text, Output, Statement } kind = Text;
  std::string text;
  std::vector<Token> tokens;  // ending with an End token
  int line = 0;
};

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {}

  std::vector<Chunk> run() {
    bool strip_next = false, trim_next = false;
    while (pos_ < s_.size()) {
      size_t open = s_.find('{', pos_);
      while (open != std::string::npos && open + 1 < s_.size() && s_[open + 1] != '{' &&
             s_[open + 1] != '%' && s_[open + 1] != '#') {
        open = s_.find('{', open + 1);
      }
      if (open != std::string::npos && open + 1 >= s_.size()) open = std::string::npos;
      std::string text =
          s_.substr(pos_, open == std::string::npos ? std::string::npos : open - pos_);
      const int text_line = line_;
      count_lines(pos_, open == std::string::npos ? s_.size() : open);
      if (strip_next) {
        size_t first = 0;
        while (first < text.size() && is_ascii_space(text[first])) ++first;
        text.erase(0, first);
      } else if (trim_next) {
        if (text.rfind("\r\n", 0) == 0) {
          text.erase(0, 2);
        } else if (!text.empty() && text[0] == '\n') {
          text.erase(0, 1);
        }
      }
      strip_next = trim_next = false;
      if (open == std::string::npos) {
        push_text(std::move(text), text_line);
        break;
      }
      const char kind = s_[open + 1];
      size_t p = open + 2;
      const bool minus = p < s_.size() && s_[p] == '-', plus = p < s_.size() && s_[p] == '+';
      if (minus || plus) ++p;
      if (minus) {
        while (!text.empty() && is_ascii_space(text.back())) text.pop_back();
      } else if (!plus && kind != '{') {
        // lstrip_blocks: spaces and tabs from the line's start to a block
        // or comment tag go (judged on the source, before any trimming).
        size_t b = open;
        while (b > 0 && (s_[b - 1] == ' ' || s_[b - 1] == '\t')) --b;
        if (b == 0 || s_[b - 1] == '\n') text.erase(text.size() - std::min(text.size(), open - b));
      }
      push_text(std::move(text), text_line);
      pos_ = p;
      if (kind == '#') {
        const size_t close = s_.find("#}", pos_);
        if (close == std::string::npos) fail(line_, "a comment {# is never closed");
        count_lines(pos_, close);
        strip_next = close > pos_ && s_[close - 1] == '-';
        trim_next = !strip_next;
        pos_ = close + 2;
        continue;
      }
      Chunk c;
      c.kind = kind == '{' ? Chunk::Output : Chunk::Statement;
      c.line = line_;
      const std::string closer = kind == '{' ? "}}" : "%}";
      while (true) {
        skip_space();
        if (pos_ >= s_.size())
          fail(c.line, std::string("a tag opened with {") + kind + " is never closed");
        if (s_.compare(pos_, 2, closer) == 0) {
          pos_ += 2;
          trim_next = kind == '%';
          break;
        }
        if ((s_[pos_] == '-' || s_[pos_] == '+') && s_.compare(pos_ + 1, 2, closer) == 0) {
          strip_next = s_[pos_] == '-';
          trim_next = false;
          pos_ += 3;
          break;
        }
        c.tokens.push_back(token());
      }
      Token end;
      end.line = line_;
      c.tokens.push_back(end);
      chunks_.push_back(std::move(c));
    }
    return std::move(chunks_);
  }

 private:
  void push_text(std::string text, int line) {
    if (text.empty()) return;
    Chunk c;
    c.kind = Chunk::Text;
    c.text = std::move(text);
    c.line = line;
    chunks_.push_back(std::move(c));
  }
  void count_lines(size_t from, size_t to) {
    line_ += static_cast<int>(std::count(s_.begin() + static_cast<std::ptrdiff_t>(from),
                                         s_.begin() + static_cast<std::ptrdiff_t>(to), '\n'));
  }
  void skip_space() {
    while (pos_ < s_.size() && is_ascii_space(s_[pos_])) {
      if (s_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }

  Token token() {
    Token t;
    t.line = line_;
    const char c = s_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
        ++e;
      t.kind = Tok::Name;
      t.text = s_.substr(pos_, e - pos_);
      pos_ = e;
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos_;
      bool real = false;
      while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
      if (e + 1 < s_.size() && s_[e] == '.' &&
          std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
        real = true;
        ++e;
        while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
      }
      if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
        size_t x = e + 1;
        if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
        if (x < s_.size() && std::isdigit(static_cast<unsigned char>(s_[x]))) {
          real = true;
          e = x;
          while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
        }
      }
      t.text = s_.substr(pos_, e - pos_);
      if (real) {
        t.kind = Tok::Float;
        t.number = std::strtod(t.text.c_str(), nullptr);
      } else {
        t.kind = Tok::Int;
        errno = 0;
        t.integer = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(t.line, "the integer " + t.text + " does not fit in 64 bits");
      }
      pos_ = e;
      return t;
    }
    if (c == '\'' || c == '"') {
      t.kind = Tok::String;
      size_t e = pos_ + 1;
      while (true) {
        if (e >= s_.size()) fail(t.line, "a string literal is never closed");
        const char ch = s_[e];
        if (ch == c) break;
        if (ch == '\\' && e + 1 < s_.size()) {
          const char n = s_[e + 1];
          e += 2;
          switch (n) {
            case 'n':
              t.text += '\n';
              break;
            case 't':
              t.text += '\t';
              break;
            case 'r':
              t.text += '\r';
              break;
            case '0':
              t.text += '\0';
              break;
            case '\\':
              t.text += '\\';
              break;
            case '\'':
              t.text += '\'';
              break;
            case '"':
              t.text += '"';
              break;
            case '\n':
              ++line_;
              break;
            case 'x':
            case 'u': {
              const size_t digits = n == 'x' ? 2 : 4;
              if (e + digits > s_.size()) fail(t.line, "a string literal's escape is cut short");
              const auto cp =
                  static_cast<uint32_t>(std::strtoul(s_.substr(e, digits).c_str(), nullptr, 16));
              t.text += utf8(cp);
              e += digits;
              break;
            }
            default:
              t.text += '\\';
              t.text += n;
          }
          continue;
        }
        if (ch == '\n') ++line_;
        t.text += ch;
        ++e;
      }
      pos_ = e + 1;
      return t;
    }
    static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : kOps) {
      if (s_.compare(pos_, 2, op) == 0) {
        t.kind = Tok::Op;
        t.text = op;
        pos_ += 2;
        return t;
      }
    }
    if (std::string("+-*/%~<>()[]{}.,:|=").find(c) != std::string::npos) {
      t.kind = Tok::Op;
      t.text = std::string(1, c);
      ++pos_;
      return t;
    }
    fail(line_, std::string("unexpected character '") + c + "'");
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Chunk> chunks_;
};

// ---------------------------------------------------------------- syntax

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum Kind {
    Literal,
    Var,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Unary,
    Binary,
    Cond,
    List,
    Tuple,
    Dict,
    Compare
  };
  Kind kind = Literal;
  int line = 0;
  json value;        // Literal
  std::string name;  // Var, Attr, Filter, Test; the operator of Unary and Binary
  // Operands: Attr, Item, Slice, Filter, Test: the subject first; Call: the
  // callee first; Cond: then, condition, else (or null); Dict: keys and
  // values in turn. Slice: subject, start, stop, step (each may be null).
  std::vector<ExprP> args;
  std::vector<std::pair<std::string, ExprP>> kwargs;  // Call, Filter, Test
  bool negated = false;                               // Test: `is not`
  std::vector<std::string> ops;                       // Compare: the operators between its operands

  Expr() = default;
  Expr(const Expr&) = delete;
  Expr& operator=(const Expr&) = delete;
  // Frees the operands a level at a time rather than recursively, so that
  // no tree is too deep to free (a long chain `a + b + c + ...` is as deep
  // as it is long).
  ~Expr() {
    std::vector<ExprP> pending;
    auto detach = [&](Expr& e) {
      for (ExprP& a : e.args) {
        if (a) pending.push_back(std::move(a));
      }
      for (auto& kv : e.kwargs) {
        if (kv.second) pending.push_back(std::move(kv.second));
      }
    };
    detach(*this);
    while (!pending.empty()) {
      ExprP e = std::move(pending.back());
      pending.pop_back();
      detach(*e);
    }
  }
};

// The depth of e's tree (iteratively), or an error past kMaxExprDepth.
void check_depth(const Expr* root) {
  if (!root) return;
  std::vector<std::pair<const Expr*, int>> pending{{root, 1}};
  while (!pending.empty()) {
    const auto [e, depth] = pending.back();
    pending.pop_back();
    if (depth > kMaxExprDepth) {
      fail(e->line,
           "an expression nests more than " + std::to_string(kMaxExprDepth) + " operations deep");
    }
    for (const ExprP& a : e->args) {
      if (a) pending.emplace_back(a.get(), depth + 1);
    }
    for (const auto& kv : e->kwargs) {
      if (kv.second) pending.emplace_back(kv.second.get(), depth + 1);
    }
  }
}

// The name a {% filter %} block's text is bound to while its filters run
// (no template can write it).
const char* const kBlockText = "\x01block";

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum Kind {
    Text,
    Output,
    If,
    For,
    Set,
    SetBlock,
    Macro,
    Break,
    Continue,
    Generation,
    FilterBlock,
    CallBlock
  };
  Kind kind = Text;
  int line = 0;
  std::string text;  // Text
  ExprP expr;        // Output; For: the iterable; Set: the value
  // If: each (condition, body) in turn, the else branch's condition null.
  std::vector<std::pair<ExprP, Body>> branches;
  // For: the loop variables; Set: the names (or a namespace, then `attr`);
  // SetBlock and Macro: the name; CallBlock: "caller".
  std::vector<std::string> targets;
  std::string attr;
  // For's `if`; FilterBlock: the filters, applied to the variable kBlockText.
  ExprP filter;
  Body body, else_body;                               // For; SetBlock; Macro; the blocks
  std::vector<std::pair<std::string, ExprP>> params;  // Macro, CallBlock: defaults may be null
  bool recursive = false;                             // For: loop(items) runs the body on them
  // Macro: its body names `varargs` or `kwargs`, so it takes extra
  // positional arguments, or keyword arguments it has no parameter for.
  bool varargs = false, kwargs = false;
};

class Cursor {
 public:
  explicit Cursor(const std::vector<Token>& t) : t_(t) {}
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Op && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Name && peek(ahead).text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek().line, std::string("expected '") + op + "', got " + what());
  }
  std::string expect_name() {
    if (peek().kind != Tok::Name) fail(peek().line, "expected a name, got " + what());
    return next().text;
  }
  void expect_end() {
    if (peek().kind != Tok::End) fail(peek().line, "unexpected " + what() + " at the tag's end");
  }
  std::string what() const {
    const Token& t = peek();
    switch (t.kind) {
      case Tok::End:
        return "the end of the tag";
      case Tok::String:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }

 private:
  const std::vector<Token>& t_;
  size_t i_ = 0;
};

ExprP make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

ExprP binary(std::string op, ExprP a, ExprP b) {
  auto e = make(Expr::Binary, a->line);
  e->name = std::move(op);
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return e;
}

class ExprParser {
 public:
  explicit ExprParser(Cursor& c) : c_(c) {}

  ExprP expression() {
    const Nest nest(nesting_, kMaxNesting, c_.peek().line, "expressions");
    ExprP a = logic_or();
    while (c_.is_name("if")) {
      const int line = c_.next().line;
      auto e = make(Expr::Cond, line);
      e->args.push_back(std::move(a));
      e->args.push_back(logic_or());
      e->args.push_back(c_.accept_name("else") ? expression() : nullptr);
      a = std::move(e);
    }
    return a;
  }
  // An expression without a conditional (a for loop's iterable).
  ExprP logic_or() {
    ExprP a = logic_and();
    while (c_.accept_name("or")) a = binary("or", std::move(a), logic_and());
    return a;
  }

 private:
  ExprP logic_and() {
    ExprP a = logic_not();
    while (c_.accept_name("and")) a = binary("and", std::move(a), logic_not());
    return a;
  }
  ExprP logic_not() {
    if (c_.is_name("not")) {
      const Nest nest(nesting_, kMaxNesting, c_.peek().line, "expressions");
      auto e = make(Expr::Unary, c_.next().line);
      e->name = "not";
      e->args.push_back(logic_not());
      return e;
    }
    return compare();
  }
  // a op b op c ...: chained as Python chains them (a op b and b op c),
  // each operand evaluated once.
  ExprP compare() {
    ExprP first = sum();
    ExprP chain;
    while (true) {
      std::string op;
      const Token& t = c_.peek();
      if (t.kind == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                t.text == ">" || t.text == "<=" || t.text == ">=")) {
        op = c_.next().text;
      } else if (c_.is_name("in")) {
        c_.next();
        op = "in";
      } else if (c_.is_name("not") && c_.is_name("in", 1)) {
        c_.next();
        c_.next();
        op = "not in";
      } else {
        return chain ? std::move(chain) : std::move(first);
      }
      if (!chain) {
        chain = make(Expr::Compare, first->line);
        chain->args.push_back(std::move(first));
      }
      chain->ops.push_back(op);
      chain->args.push_back(sum());
    }
  }
  ExprP sum() {
    ExprP a = concat();
    while (c_.is_op("+") || c_.is_op("-")) {
      const std::string op = c_.next().text;
      a = binary(op, std::move(a), concat());
    }
    return a;
  }
  ExprP concat() {
    ExprP a = product();
    while (c_.accept_op("~")) a = binary("~", std::move(a), product());
    return a;
  }
  ExprP product() {
    ExprP a = power();
    while (c_.is_op("*") || c_.is_op("/") || c_.is_op("//") || c_.is_op("%")) {
      const std::string op = c_.next().text;
      a = binary(op, std::move(a), power());
    }
    return a;
  }
  ExprP power() {
    ExprP a = unary(true);
    while (c_.accept_op("**")) a = binary("**", std::move(a), unary(true));
    return a;
  }
  ExprP unary(bool with_filters) {
    ExprP e;
    if (c_.is_op("-") || c_.is_op("+")) {
      const Nest nest(nesting_, kMaxNesting, c_.peek().line, "expressions");
      const Token& t = c_.next();
      e = make(Expr::Unary, t.line);
      e->name = t.text;
      e->args.push_back(unary(false));
    } else {
      e = postfix(primary());
    }
    return with_filters ? filters(std::move(e)) : std::move(e);
  }
  ExprP primary() {
    const Token t = c_.next();
    switch (t.kind) {
      case Tok::Name: {
        auto e = make(Expr::Literal, t.line);
        if (t.text == "true" || t.text == "True") {
          e->value = true;
        } else if (t.text == "false" || t.text == "False") {
          e->value = false;
        } else if (t.text == "none" || t.text == "None") {
          e->value = nullptr;
        } else {
          e->kind = Expr::Var;
          e->name = t.text;
        }
        return e;
      }
      case Tok::String: {
        auto e = make(Expr::Literal, t.line);
        std::string s = t.text;
        while (c_.peek().kind == Tok::String) s += c_.next().text;  // adjacent literals join
        e->value = s;
        return e;
      }
      case Tok::Int: {
        auto e = make(Expr::Literal, t.line);
        e->value = t.integer;
        return e;
      }
      case Tok::Float: {
        auto e = make(Expr::Literal, t.line);
        e->value = t.number;
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          if (c_.accept_op(")")) return make(Expr::Tuple, t.line);
          ExprP first = expression();
          if (!c_.is_op(",")) {
            c_.expect_op(")");
            return first;
          }
          auto e = make(Expr::Tuple, t.line);
          e->args.push_back(std::move(first));
          while (c_.accept_op(",") && !c_.is_op(")")) e->args.push_back(expression());
          c_.expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = make(Expr::List, t.line);
          while (!c_.is_op("]")) {
            e->args.push_back(expression());
            if (!c_.accept_op(",")) break;
          }
          c_.expect_op("]");
          return e;
        }
        if (t.text == "{") {
          auto e = make(Expr::Dict, t.line);
          while (!c_.is_op("}")) {
            e->args.push_back(expression());
            c_.expect_op(":");
            e->args.push_back(expression());
            if (!c_.accept_op(",")) break;
          }
          c_.expect_op("}");
          return e;
        }
        break;
      case Tok::End:
        fail(t.line, "an expression is missing");
    }
    fail(t.line, "unexpected '" + t.text + "'");
  }

 public:
  // A call's arguments after its '(', up to and past the ')'.
  void call_args(Expr& e) {
    while (!c_.is_op(")")) {
      if (c_.peek().kind == Tok::Name && c_.is_op("=", 1)) {
        std::string key = c_.next().text;
        c_.next();
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        e.args.push_back(expression());
      }
      if (!c_.accept_op(",")) break;
    }
    c_.expect_op(")");
  }
  ExprP postfix(ExprP e) {
    while (true) {
      if (c_.is_op(".")) {
        const int line = c_.next().line;
        auto a = make(Expr::Attr, line);
        const Token& t = c_.next();
        if (t.kind != Tok::Name && t.kind != Tok::Int) fail(line, "expected a name after '.'");
        a->name = t.text;
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (c_.is_op("[")) {
        const int line = c_.next().line;
        ExprP start, stop, step;
        bool slice = false;
        if (!c_.is_op(":")) start = expression();
        if (c_.accept_op(":")) {
          slice = true;
          if (!c_.is_op(":") && !c_.is_op("]")) stop = expression();
          if (c_.accept_op(":") && !c_.is_op("]")) step = expression();
        }
        c_.expect_op("]");
        auto a = make(slice ? Expr::Slice : Expr::Item, line);
        a->args.push_back(std::move(e));
        a->args.push_back(std::move(start));
        if (slice) {
          a->args.push_back(std::move(stop));
          a->args.push_back(std::move(step));
        }
        e = std::move(a);
      } else if (c_.is_op("(")) {
        const int line = c_.next().line;
        auto a = make(Expr::Call, line);
        a->args.push_back(std::move(e));
        call_args(*a);
        e = std::move(a);
      } else {
        return e;
      }
    }
  }
  ExprP filters(ExprP e) {
    while (true) {
      if (c_.is_op("|")) {
        const int line = c_.next().line;
        auto f = make(Expr::Filter, line);
        f->name = c_.expect_name();
        f->args.push_back(std::move(e));
        if (c_.accept_op("(")) call_args(*f);
        e = std::move(f);
      } else if (c_.is_name("is")) {
        const int line = c_.next().line;
        auto t = make(Expr::Test, line);
        t->negated = c_.accept_name("not");
        const Token& name = c_.next();
        if (name.kind != Tok::Name &&
            !(name.kind == Tok::Op && (name.text == "==" || name.text == "!=")))
          fail(line, "expected a test's name after 'is'");
        t->name = name.text;
        t->args.push_back(std::move(e));
        if (c_.accept_op("(")) {
          call_args(*t);
        } else {
          const Token& n = c_.peek();
          static const std::set<std::string> kStop = {"and", "or", "else", "if", "is", "not", "in"};
          if (n.kind == Tok::String || n.kind == Tok::Int || n.kind == Tok::Float ||
              (n.kind == Tok::Name && !kStop.count(n.text)) || c_.is_op("[") || c_.is_op("{")) {
            t->args.push_back(postfix(primary()));
          }
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

 private:
  Cursor& c_;
  int nesting_ = 0;
};

// The expressions a node holds (not its body's), each within kMaxExprDepth.
void check_depth(const Node& n) {
  check_depth(n.expr.get());
  check_depth(n.filter.get());
  for (const auto& branch : n.branches) check_depth(branch.first.get());
  for (const auto& param : n.params) check_depth(param.second.get());
}

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  Body program() {
    std::string stopped;
    Body b = body({}, &stopped);
    return b;
  }

 private:
  // Nodes up to a statement whose keyword is in `stops` (left unread, its
  // keyword in *stopped) or the end of the template.
  Body body(const std::set<std::string>& stops, std::string* stopped) {
    const Nest nest(blocks_, kMaxNesting, at_ > 0 ? chunks_[at_ - 1].line : 1, "blocks");
    Body out;
    while (at_ < chunks_.size()) {
      Chunk& c = chunks_[at_];
      if (c.kind == Chunk::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Text;
        n->line = c.line;
        n->text = c.text;
        out.push_back(std::move(n));
        ++at_;
        continue;
      }
      Cursor cur(c.tokens);
      if (c.kind == Chunk::Output) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Output;
        n->line = c.line;
        n->expr = ExprParser(cur).expression();
        cur.expect_end();
        check_depth(*n);
        out.push_back(std::move(n));
        ++at_;
        continue;
      }
      const std::string keyword = cur.peek().kind == Tok::Name ? cur.peek().text : "";
      if (stops.count(keyword)) {
        *stopped = keyword;
        return out;
      }
      ++at_;
      cur.next();
      statement(keyword, c.line, cur, out);
    }
    if (!stops.empty()) {
      std::string closer;
      for (const std::string& s : stops) {
        if (s.rfind("end", 0) == 0) closer = s;
      }
      fail(chunks_.empty() ? 1 : chunks_.back().line,
           "the template ends before the {% " + closer + " %} it needs");
    }
    return out;
  }

  // The statement chunk at at_ - 1, its keyword read.
  void statement(const std::string& keyword, int line, Cursor& cur, Body& out) {
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string stopped;
    if (keyword == "if") {
      n->kind = Node::If;
      ExprP cond = ExprParser(cur).expression();
      cur.expect_end();
      while (true) {
        Body b = body({"elif", "else", "endif"}, &stopped);
        n->branches.emplace_back(std::move(cond), std::move(b));
        Cursor next(chunks_[at_].tokens);
        next.next();
        ++at_;
        if (stopped == "elif") {
          cond = ExprParser(next).expression();
          next.expect_end();
          continue;
        }
        next.expect_end();
        if (stopped == "else") {
          Body e = body({"endif"}, &stopped);
          n->branches.emplace_back(nullptr, std::move(e));
          Cursor end(chunks_[at_].tokens);
          end.next();
          end.expect_end();
          ++at_;
        }
        break;
      }
    } else if (keyword == "for") {
      n->kind = Node::For;
      n->targets.push_back(cur.expect_name());
      while (cur.accept_op(",")) n->targets.push_back(cur.expect_name());
      if (!cur.accept_name("in")) fail(line, "expected 'in' in a for loop");
      ExprParser p(cur);
      n->expr = p.logic_or();
      if (cur.accept_name("if")) n->filter = ExprParser(cur).logic_or();
      n->recursive = cur.accept_name("recursive");
      cur.expect_end();
      n->body = body({"else", "endfor"}, &stopped);
      close(stopped == "else" ? "else" : "endfor");
      if (stopped == "else") {
        n->else_body = body({"endfor"}, &stopped);
        close("endfor");
      }
    } else if (keyword == "set") {
      std::string first = cur.expect_name();
      if (cur.accept_op(".")) {
        n->attr = cur.expect_name();
      }
      n->targets.push_back(std::move(first));
      while (n->attr.empty() && cur.accept_op(",")) n->targets.push_back(cur.expect_name());
      if (cur.accept_op("=")) {
        n->kind = Node::Set;
        n->expr = ExprParser(cur).expression();
        cur.expect_end();
      } else {
        if (n->targets.size() != 1 || !n->attr.empty())
          fail(line, "a block set takes one plain name");
        if (cur.is_op("|")) fail(line, "filters on a block set are not supported");
        cur.expect_end();
        n->kind = Node::SetBlock;
        n->body = body({"endset"}, &stopped);
        close("endset");
      }
    } else if (keyword == "macro") {
      n->kind = Node::Macro;
      n->targets.push_back(cur.expect_name());
      cur.expect_op("(");
      params(cur, *n);
      cur.expect_end();
      const size_t from = at_;
      n->body = body({"endmacro"}, &stopped);
      // Jinja2's rule: a macro collects extra arguments in `varargs` and
      // `kwargs` only when its body names them (not as an attribute).
      for (size_t i = from; i < at_; ++i) {
        const std::vector<Token>& tokens = chunks_[i].tokens;
        for (size_t t = 0; t < tokens.size(); ++t) {
          if (tokens[t].kind != Tok::Name ||
              (t > 0 && tokens[t - 1].kind == Tok::Op && tokens[t - 1].text == "."))
            continue;
          n->varargs |= tokens[t].text == "varargs";
          n->kwargs |= tokens[t].text == "kwargs";
        }
      }
      close("endmacro");
    } else if (keyword == "call") {
      // {% call(params) macro(args) %}body{% endcall %}: the body is the
      // macro `caller` while the call runs.
      n->kind = Node::CallBlock;
      n->targets.push_back("caller");
      if (cur.accept_op("(")) params(cur, *n);
      n->expr = ExprParser(cur).expression();
      if (n->expr->kind != Expr::Call) fail(line, "{% call %} takes a call of a macro");
      cur.expect_end();
      n->body = body({"endcall"}, &stopped);
      close("endcall");
    } else if (keyword == "filter") {
      // {% filter f(args) | g %}body{% endfilter %}: the body's text through
      // the filters.
      n->kind = Node::FilterBlock;
      auto text = make(Expr::Var, line);
      text->name = kBlockText;
      auto first = make(Expr::Filter, line);
      first->name = cur.expect_name();
      first->args.push_back(std::move(text));
      ExprParser p(cur);
      if (cur.accept_op("(")) p.call_args(*first);
      n->filter = p.filters(std::move(first));
      cur.expect_end();
      n->body = body({"endfilter"}, &stopped);
      close("endfilter");
    } else if (keyword == "break" || keyword == "continue") {
      n->kind = keyword == "break" ? Node::Break : Node::Continue;
      cur.expect_end();
    } else if (keyword == "generation") {
      // transformers' marker of what the assistant writes: its body, its
      // place in the output recorded.
      n->kind = Node::Generation;
      cur.expect_end();
      n->body = body({"endgeneration"}, &stopped);
      close("endgeneration");
      has_generation_ = true;
    } else if (keyword.empty()) {
      fail(line, "a statement tag without a keyword");
    } else {
      fail(line, "the tag '" + keyword + "' is not supported");
    }
    check_depth(*n);
    out.push_back(std::move(n));
  }

  // A macro's or a call block's parameters, up to and past the ')'.
  static void params(Cursor& cur, Node& n) {
    while (!cur.is_op(")")) {
      std::string param = cur.expect_name();
      ExprP def;
      if (cur.accept_op("=")) def = ExprParser(cur).expression();
      n.params.emplace_back(std::move(param), std::move(def));
      if (!cur.accept_op(",")) break;
    }
    cur.expect_op(")");
  }

  // Reads the closing statement at at_ (its keyword `what`, nothing after).
  void close(const char* what) {
    Cursor end(chunks_[at_].tokens);
    if (!end.accept_name(what)) fail(chunks_[at_].line, std::string("expected ") + what);
    end.expect_end();
    ++at_;
  }

  std::vector<Chunk> chunks_;
  size_t at_ = 0;
  int blocks_ = 0;

 public:
  bool has_generation_ = false;
};

}  // namespace

struct Template::Program {
  Body body;
  bool has_generation = false;
};

// ---------------------------------------------------------------- values

namespace {

struct Value {
  enum class Kind { Undefined, Data, Namespace, Macro, Builtin, Method };
  Kind kind = Kind::Undefined;
  json data;                     // Data
  std::shared_ptr<json> object;  // Namespace: its attributes (shared: `set ns.x` is seen by all)
  const Node* macro = nullptr;   // Macro
  std::string name;              // Builtin, Method; Undefined: what was looked up
  std::shared_ptr<Value> self;   // Method: its object
  // Data: a for loop's `loop` (which also has cycle(), and is callable when
  // the loop is recursive: `macro` is then its node).
  bool loop = false;
  // Data: an array that is a tuple (a tuple literal, a macro's varargs),
  // which Python writes in parentheses. (Only the value itself: a tuple
  // inside a list or dict is written as a list.)
  bool tuple = false;

  static Value of(json j) {
    if (j.is_string() && j.get_ref<const std::string&>().size() > kMaxText) {
      throw ValueError(
          "chat template: a string of " + std::to_string(j.get_ref<const std::string&>().size()) +
          " bytes, more than the " + std::to_string(kMaxText) + " a template may make");
    }
    if ((j.is_array() || j.is_object()) && j.size() > kMaxItems) {
      throw ValueError("chat template: a list or dict of " + std::to_string(j.size()) +
                       " items, more than the " + std::to_string(kMaxItems) +
                       " a template may make");
    }
    Value v;
    v.kind = Kind::Data;
    v.data = std::move(j);
    return v;
  }
  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  bool defined() const { return kind != Kind::Undefined; }
  bool is_data() const { return kind == Kind::Data; }
};

// Python's repr of a float: the shortest digits that read back the same,
// positional for exponents -4..15, scientific otherwise.
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  const std::string sci = buf;
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (std::isdigit(static_cast<unsigned char>(sci[i]))) digits += sci[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const std::string sign = d < 0 ? "-" : "";
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
            digits.substr(static_cast<size_t>(exp + 1));
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  char ex[16];
  std::snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + mant + ex;
}

std::string py_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string py_repr(const json& v);

// Python's str() of a value (what {{ }} writes).
std::string py_str(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "None";
    case json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case json::value_t::number_integer:
      return std::to_string(v.get<int64_t>());
    case json::value_t::number_unsigned:
      return std::to_string(v.get<uint64_t>());
    case json::value_t::number_float:
      return py_float(v.get<double>());
    case json::value_t::string:
      return v.get<std::string>();
    default:
      return py_repr(v);
  }
}

std::string py_repr(const json& v) {
  if (v.is_string()) return py_repr_string(v.get<std::string>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + py_repr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out += (first ? "" : ", ") + py_repr_string(it.key()) + ": " + py_repr(it.value());
      first = false;
    }
    return out + "}";
  }
  return py_str(v);
}

std::string str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::Data:
      if (v.tuple && v.data.is_array()) {
        std::string out = "(";
        for (size_t i = 0; i < v.data.size(); ++i) out += (i ? ", " : "") + py_repr(v.data[i]);
        return out + (v.data.size() == 1 ? ",)" : ")");
      }
      return py_str(v.data);
    case Value::Kind::Namespace:
      return "<Namespace " + py_repr(*v.object) + ">";
    default:
      return "<function " + v.name + ">";
  }
}

bool truthy(const Value& v) {
  if (v.kind != Value::Kind::Data) return v.kind != Value::Kind::Undefined;
  const json& d = v.data;
  switch (d.type()) {
    case json::value_t::null:
      return false;
    case json::value_t::boolean:
      return d.get<bool>();
    case json::value_t::number_integer:
      return d.get<int64_t>() != 0;
    case json::value_t::number_unsigned:
      return d.get<uint64_t>() != 0;
    case json::value_t::number_float:
      return d.get<double>() != 0.0;
    case json::value_t::string:
      return !d.get_ref<const std::string&>().empty();
    default:
      return !d.empty();
  }
}

// A UTF-8 string's code points, each as its bytes (Python indexes those).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0, n = 0; i < s.size(); i += n) {
    next_code_point(s, i, n);
    out.push_back(s.substr(i, n));
  }
  return out;
}

bool is_int(const json& v) {
  return v.is_number_integer();
}  // unsigned included
bool is_num(const json& v) {
  return v.is_number();
}

// 64-bit integer arithmetic, or an error where Python's integers would grow
// past 64 bits (Triad's template integers do not).
int64_t int_op(char op, int64_t a, int64_t b, int line) {
  int64_t r = 0;
  bool over = false;
  switch (op) {
    case '+':
      over = __builtin_add_overflow(a, b, &r);
      break;
    case '-':
      over = __builtin_sub_overflow(a, b, &r);
      break;
    default:
      over = __builtin_mul_overflow(a, b, &r);
      break;
  }
  if (over) {
    fail(line, std::to_string(a) + " " + op + " " + std::to_string(b) + " does not fit in 64 bits");
  }
  return r;
}

// -a, or an error for the one int64 that has no negation.
int64_t negated(int64_t a, int line) {
  if (a == INT64_MIN) fail(line, "-(" + std::to_string(a) + ") does not fit in 64 bits");
  return -a;
}

// base ** exp (exp >= 0) exactly, by squaring, or an error past 64 bits.
int64_t int_pow(int64_t base, int64_t exp, int line) {
  int64_t power = 1, b = base;
  for (int64_t e = exp; e > 0; e >>= 1) {
    if (((e & 1) && __builtin_mul_overflow(power, b, &power)) ||
        (e > 1 && __builtin_mul_overflow(b, b, &b))) {
      fail(line, std::to_string(base) + " ** " + std::to_string(exp) + " does not fit in 64 bits");
    }
  }
  return power;
}

// A whole number as an int64, or an error naming `what` (a float past
// 64 bits, NaN or infinity cannot be one).
int64_t float_to_int(double d, int line, const std::string& what) {
  if (!(d > -9.2233720368547758e18 && d < 9.2233720368547758e18))
    fail(line, what + " (" + py_float(d) + ") does not fit in a 64-bit integer");
  return static_cast<int64_t>(d);
}
double num(const json& v) {
  return v.get<double>();
}

bool equal(const Value& a, const Value& b) {
  if (!a.is_data() || !b.is_data()) {
    if (a.kind != b.kind) return false;
    if (a.kind == Value::Kind::Namespace) return a.object == b.object;
    return a.kind == Value::Kind::Undefined || a.name == b.name;
  }
  if (is_num(a.data) && is_num(b.data)) return num(a.data) == num(b.data);
  return a.data == b.data;
}

int64_t index_of(int64_t i, int64_t n) {
  return i < 0 ? i + n : i;
}

// Python's slice indices over n items.
std::vector<int64_t> slice_indices(const json& start, const json& stop, const json& step, int64_t n,
                                   int line) {
  for (const json* v : {&start, &stop, &step}) {
    if (!v->is_null() && !is_int(*v))
      fail(line, "slice indices must be integers or none, not " + v->dump());
  }
  const int64_t st = step.is_null() ? 1 : step.get<int64_t>();
  if (st == 0) fail(line, "a slice's step cannot be zero");
  auto clamp = [&](const json& v, int64_t dflt) {
    if (v.is_null()) return dflt;
    int64_t i = v.get<int64_t>();
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t a = clamp(start, st > 0 ? 0 : n - 1);
  const int64_t b = clamp(stop, st > 0 ? n : -1);
  std::vector<int64_t> out;
  // (a and b lie in [-1, n]: each step is taken only when it stays short of b.)
  for (int64_t i = a; st > 0 ? i < b : i > b;) {
    out.push_back(i);
    if (st > 0 ? b - i <= st : i - b - 1 <= -(st + 1)) break;  // (no -st: it may overflow)
    i += st;
  }
  return out;
}

std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t a = 0, b = s.size();
  if (left) {
    while (a < b && chars.find(s[a]) != std::string::npos) ++a;
  }
  if (right) {
    while (b > a && chars.find(s[b - 1]) != std::string::npos) --b;
  }
  return s.substr(a, b - a);
}

json split(const std::string& s, const json& sep, int64_t maxsplit) {
  json out = json::array();
  if (sep.is_null()) {  // runs of whitespace, none at the ends
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_ascii_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(strip(s.substr(i), kAsciiSpaces, false, true));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_ascii_space(s[j])) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep.get_ref<const std::string&>();
  if (d.empty()) throw ValueError("empty separator");
  size_t i = 0;
  while (true) {
    const size_t j = s.find(d, i);
    if (j == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(s.substr(i));
      return out;
    }
    out.push_back(s.substr(i, j - i));
    i = j + d.size();
  }
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = u < 0x80;  // (a non-ASCII byte is taken as part of a word)
    }
  }
  return out;
}
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t i = 0;
  int64_t done = 0;
  while (true) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos || (count >= 0 && done == count)) {
      out += s.substr(i);
      return out;
    }
    out += s.substr(i, j - i) + to;
    i = j + from.size();
    ++done;
  }
}

void dump(const json& v, int indent, bool sort_keys, int depth, std::string& out) {
  switch (v.type()) {
    case json::value_t::null:
      out += "null";
      return;
    case json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case json::value_t::number_float: {
      const double d = v.get<double>();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : py_float(d);
      return;
    }
    case json::value_t::string: {
      out += '"';
      for (unsigned char c : v.get_ref<const std::string&>()) {
        switch (c) {
          case '"':
            out += "\\\"";
            break;
          case '\\':
            out += "\\\\";
            break;
          case '\n':
            out += "\\n";
            break;
          case '\r':
            out += "\\r";
            break;
          case '\t':
            out += "\\t";
            break;
          case '\b':
            out += "\\b";
            break;
          case '\f':
            out += "\\f";
            break;
          default:
            if (c < 0x20) {
              char b[8];
              std::snprintf(b, sizeof b, "\\u%04x", c);
              out += b;
            } else {
              out += static_cast<char>(c);
            }
        }
      }
      out += '"';
      return;
    }
    case json::value_t::array:
    case json::value_t::object: {
      const bool arr = v.is_array();
      if (v.empty()) {
        out += arr ? "[]" : "{}";
        return;
      }
      out += arr ? '[' : '{';
      const uint64_t width = indent >= 0 ? uint64_t(indent) * uint64_t(depth + 1) : 0;
      if (width > kMaxText || out.size() + width * v.size() > kMaxText) {
        throw ValueError("chat template: tojson's text would be longer than " +
                         std::to_string(kMaxText) + " bytes");
      }
      const std::string pad = indent >= 0 ? "\n" + std::string(width, ' ') : "";
      std::vector<std::pair<std::string, const json*>> items;
      if (arr) {
        for (const json& x : v) items.emplace_back("", &x);
      } else {
        for (auto it = v.begin(); it != v.end(); ++it) items.emplace_back(it.key(), &it.value());
        if (sort_keys)
          std::stable_sort(items.begin(), items.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        out += pad;
        if (!arr) {
          dump(json(items[i].first), indent, sort_keys, depth + 1, out);
          out += ": ";
        }
        dump(*items[i].second, indent, sort_keys, depth + 1, out);
      }
      if (indent >= 0) out += "\n" + std::string(uint64_t(indent) * uint64_t(depth), ' ');
      out += arr ? ']' : '}';
      return;
    }
    default:
      out += py_str(v);
  }
}

// printf's conversion `spec` of one value, however long it comes out.
template <class T>
std::string c_format(const std::string& spec, T value) {
  const int n = std::snprintf(nullptr, 0, spec.c_str(), value);
  if (n < 0) throw ValueError("cannot format with '" + spec + "'");
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, spec.c_str(), value);
  return out;
}

// A %s conversion's text: Python cuts it to the precision and pads it to the
// width in code points (left-justified under the '-' flag; '0' pads with
// spaces), not in bytes.
std::string pad_text(const std::string& text, bool left, size_t width, size_t precision) {
  std::string cut;
  size_t points = 0;
  for (size_t b = 0; b < text.size(); ++b) {
    const bool starts = (static_cast<unsigned char>(text[b]) & 0xC0) != 0x80;
    if (starts && points == precision) break;
    points += starts;
    cut += text[b];
  }
  if (points >= width) return cut;
  const std::string fill(width - points, ' ');
  return left ? cut + fill : fill + cut;
}

// Python's `format % args`: %s, %r, %d / %i, %f / %e / %g, %x and %%, with
// flags (-, 0, +, space), a width and a precision.
std::string percent_format(const std::string& format, const json& args, int line) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    // Flags, width and precision: kept as printf's spec for numbers, read
    // for text.
    size_t j = i + 1;
    std::string spec = "%";
    bool left = false;
    while (j < format.size() && std::string("-0+ #").find(format[j]) != std::string::npos) {
      left |= format[j] == '-';
      spec += format[j++];
    }
    auto digits = [&](size_t& value) {
      value = 0;
      for (; j < format.size() && std::isdigit(static_cast<unsigned char>(format[j])); ++j) {
        value = value * 10 + static_cast<size_t>(format[j] - '0');
        spec += format[j];
        if (value > kMaxText) fail(line, "a % conversion's width or precision is too large");
      }
    };
    size_t width = 0, precision = std::string::npos;
    digits(width);
    if (j < format.size() && format[j] == '.') {
      spec += format[j++];
      digits(precision);
    }
    if (j >= format.size()) fail(line, "a format ends inside a % conversion");
    const char conv = format[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) fail(line, "not enough arguments for the format string");
    const json& a = args[next++];
    switch (conv) {
      case 's':
      case 'r':
        out += pad_text(conv == 's' ? py_str(a) : py_repr(a), left, width, precision);
        break;
      case 'd':
      case 'i':
      case 'x':
        if (!is_num(a)) fail(line, std::string("%") + conv + " needs a number, got " + py_repr(a));
        out += c_format(spec + "ll" + (conv == 'x' ? 'x' : 'd'),
                        static_cast<long long>(is_int(a) ? a.get<int64_t>() : std::trunc(num(a))));
        break;
      case 'f':
      case 'e':
      case 'g':
        if (!is_num(a)) fail(line, std::string("%") + conv + " needs a number, got " + py_repr(a));
        out += c_format(spec + conv, num(a));
        break;
      default:
        fail(line, std::string("the format conversion %") + conv + " is not supported");
    }
  }
  if (next != args.size()) fail(line, "not all arguments converted during string formatting");
  return out;
}

// ---------------------------------------------------------------- rendering

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  // spans: where the {% generation %} blocks' text lands in the output.
  Renderer(const json& context, std::vector<std::pair<size_t, size_t>>* spans) : spans_(spans) {
    scopes_.emplace_back();
    for (const char* builtin : {"range", "namespace", "dict", "raise_exception", "strftime_now"}) {
      Value v;
      v.kind = Value::Kind::Builtin;
      v.name = builtin;
      scopes_.back()[builtin] = v;
    }
    if (!context.is_object()) throw ValueError("a chat template's context must be a JSON object");
    for (auto it = context.begin(); it != context.end(); ++it)
      scopes_.back()[it.key()] = Value::of(it.value());
  }

  // The whole output: the one generation spans are measured in.
  Flow run_top(const Body& body, std::string& out) {
    top_ = &out;
    return run(body, out);
  }

  Flow run(const Body& body, std::string& out) {
    for (const NodeP& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  // One more expression or statement run, or `n` items gone through (or an
  // error past kMaxSteps).
  void step(int line, int64_t n = 1) {
    steps_ += n;
    if (steps_ > kMaxSteps) {
      fail(line, "the template runs more than " + std::to_string(kMaxSteps) +
                     " expressions and statements");
    }
  }
  // out += text, within kMaxText.
  static void append(std::string& out, const std::string& text, int line) {
    if (out.size() + text.size() > kMaxText) {
      fail(line, "the template writes more than " + std::to_string(kMaxText) + " bytes");
    }
    out += text;
  }
  // A value kept in a variable or namespace: nested no deeper than
  // kMaxDataDepth (printing and comparing values recurse through them).
  static void check_nesting(const json& v, int line) {
    if (deeper_than(v, kMaxDataDepth)) {
      fail(line, "a value nests lists and dicts more than " + std::to_string(kMaxDataDepth) +
                     " levels deep");
    }
  }
  static bool deeper_than(const json& v, int levels) {
    if (!v.is_array() && !v.is_object()) return false;
    if (levels == 0) return true;
    for (const json& x : v) {
      if (deeper_than(x, levels - 1)) return true;
    }
    return false;
  }

  Flow exec(const Node& n, std::string& out) {
    const Nest nest(depth_, kMaxRenderDepth, n.line, "expressions, blocks and macro calls");
    step(n.line);
    switch (n.kind) {
      case Node::Text:
        append(out, n.text, n.line);
        return Flow::Normal;
      case Node::Output:
        append(out, str(eval(*n.expr)), n.line);
        return Flow::Normal;
      case Node::If:
        for (const auto& [cond, body] : n.branches) {
          if (!cond || truthy(eval(*cond))) return run(body, out);
        }
        return Flow::Normal;
      case Node::For:
        return loop(n, out);
      case Node::Set: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value ns = lookup(n.targets[0]);
          if (ns.kind != Value::Kind::Namespace)
            fail(n.line, "cannot assign an attribute of '" + n.targets[0] + "', not a namespace");
          if (!v.is_data()) fail(n.line, "only data can be stored in a namespace");
          check_nesting(v.data, n.line);
          (*ns.object)[n.attr] = v.data;
        } else if (n.targets.size() == 1) {
          if (v.is_data()) check_nesting(v.data, n.line);
          scopes_.back()[n.targets[0]] = v;
        } else {
          unpack(n.targets, v, n.line);
        }
        return Flow::Normal;
      }
      case Node::SetBlock: {
        std::string text;
        run(n.body, text);
        scopes_.back()[n.targets[0]] = Value::of(text);
        return Flow::Normal;
      }
      case Node::Macro: {
        Value v;
        v.kind = Value::Kind::Macro;
        v.macro = &n;
        v.name = n.targets[0];
        scopes_.back()[n.targets[0]] = v;
        return Flow::Normal;
      }
      case Node::Break:
        return Flow::Break;
      case Node::Continue:
        return Flow::Continue;
      case Node::FilterBlock: {
        std::string text;
        const Flow f = run(n.body, text);
        scopes_.emplace_back();
        scopes_.back()[kBlockText] = Value::of(text);
        const Value v = eval(*n.filter);
        scopes_.pop_back();
        append(out, str(v), n.line);
        return f;
      }
      case Node::CallBlock: {
        Value caller;
        caller.kind = Value::Kind::Macro;
        caller.macro = &n;
        caller.name = "caller";
        scopes_.emplace_back();
        scopes_.back()["caller"] = caller;
        const Value v = eval(*n.expr);
        scopes_.pop_back();
        append(out, str(v), n.line);
        return Flow::Normal;
      }
      case Node::Generation: {
        const size_t start = out.size();
        const Flow f = run(n.body, out);
        if (spans_ && &out == top_ && out.size() > start) spans_->emplace_back(start, out.size());
        return f;
      }
    }
    return Flow::Normal;
  }

  void unpack(const std::vector<std::string>& names, const Value& v, int line) {
    if (!v.is_data() || !v.data.is_array() || v.data.size() != names.size()) {
      fail(line, "cannot unpack " + str(v) + " into " + std::to_string(names.size()) + " names");
    }
    for (size_t i = 0; i < names.size(); ++i) scopes_.back()[names[i]] = Value::of(v.data[i]);
  }

  std::vector<Value> items_of(const Value& v, int line) {
    std::vector<Value> out;
    if (v.kind == Value::Kind::Undefined) return out;
    if (!v.is_data()) fail(line, "'" + str(v) + "' cannot be iterated over");
    const json& d = v.data;
    step(line, d.is_string() ? int64_t(d.get_ref<const std::string&>().size()) : int64_t(d.size()));
    if (d.is_array()) {
      for (const json& x : d) out.push_back(Value::of(x));
    } else if (d.is_object()) {
      for (auto it = d.begin(); it != d.end(); ++it) out.push_back(Value::of(it.key()));
    } else if (d.is_string()) {
      for (std::string& c : code_points(d.get<std::string>())) out.push_back(Value::of(c));
    } else {
      fail(line, "'" + py_str(d) + "' cannot be iterated over");
    }
    return out;
  }

  void bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
    } else {
      unpack(n.targets, item, n.line);
    }
  }

  Flow loop(const Node& n, std::string& out) { return loop_over(n, eval(*n.expr), 1, out); }

  // The loop `n` over `seq` at `depth` (a recursive loop's loop(items) goes
  // one deeper).
  Flow loop_over(const Node& n, const Value& seq, int64_t depth, std::string& out) {
    scopes_.emplace_back();
    std::vector<Value> items = items_of(seq, n.line);
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        bind(n, item);
        if (truthy(eval(*n.filter))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      step(n.line, 10);  // (the loop variable's ten entries)
      json info = {{"index", i + 1},      {"index0", i},
                   {"revindex", len - i}, {"revindex0", len - i - 1},
                   {"first", i == 0},     {"last", i == len - 1},
                   {"length", len},       {"depth", depth},
                   {"depth0", depth - 1}};
      if (i > 0 && items[static_cast<size_t>(i - 1)].is_data())
        info["previtem"] = items[static_cast<size_t>(i - 1)].data;
      if (i + 1 < len && items[static_cast<size_t>(i + 1)].is_data())
        info["nextitem"] = items[static_cast<size_t>(i + 1)].data;
      Value loop_value = Value::of(std::move(info));
      loop_value.loop = true;
      if (n.recursive) loop_value.macro = &n;
      scopes_.back()["loop"] = std::move(loop_value);
      bind(n, items[static_cast<size_t>(i)]);
      if (run(n.body, out) == Flow::Break) break;
    }
    if (len == 0) run(n.else_body, out);
    scopes_.pop_back();
    return Flow::Normal;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined(name);
  }

  Value eval(const Expr& e) {
    const Nest nest(depth_, kMaxRenderDepth, e.line, "expressions, blocks and macro calls");
    step(e.line);
    switch (e.kind) {
      case Expr::Literal:
        return Value::of(e.value);
      case Expr::Var:
        return lookup(e.name);
      case Expr::List:
      case Expr::Tuple: {
        json a = json::array();
        for (const ExprP& x : e.args) a.push_back(data(eval(*x), x->line));
        Value v = Value::of(std::move(a));
        v.tuple = e.kind == Expr::Tuple;
        return v;
      }
      case Expr::Dict: {
        json o = json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          o[k.is_data() && k.data.is_string() ? k.data.get<std::string>() : str(k)] =
              data(eval(*e.args[i + 1]), e.line);
        }
        return Value::of(std::move(o));
      }
      case Expr::Attr:
        return attribute(eval(*e.args[0]), e.name, e.line);
      case Expr::Item: {
        const Value obj = eval(*e.args[0]);
        const Value key = eval(*e.args[1]);
        if (obj.is_data() && key.is_data() && key.data.is_string())
          return attribute(obj, key.data.get<std::string>(), e.line);
        return item(obj, key, e.line);
      }
      case Expr::Slice:
        return slice(e);
      case Expr::Call:
        return call(e);
      case Expr::Filter:
        return filter(e);
      case Expr::Test: {
        const bool r = test(e.name, eval(*e.args[0]), args_of(e, 1), e.line);
        return Value::of(e.negated ? !r : r);
      }
      case Expr::Unary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::of(!truthy(v));
        const json& d = data(v, e.line);
        if (!is_num(d)) fail(e.line, "bad operand for unary " + e.name + ": " + py_repr(d));
        if (e.name == "+") return v;
        return is_int(d) ? Value::of(negated(d.get<int64_t>(), e.line))
                         : Value::of(-d.get<double>());
      }
      case Expr::Binary:
        return binary_op(e);
      case Expr::Compare:
        return chain(e);
      case Expr::Cond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("");
    }
    fail(e.line, "unknown expression");
  }

  // An integer argument, or an error naming `what`.
  static int64_t integer(const Value& v, int line, const std::string& what) {
    const json& d = data(v, line);
    if (!is_int(d)) fail(line, what + " must be an integer, got " + py_repr(d));
    return d.get<int64_t>();
  }

  // A value as data, or an error for an undefined one (naming it).
  static const json& data(const Value& v, int line) {
    if (v.kind == Value::Kind::Undefined) fail(line, "'" + v.name + "' is undefined");
    if (v.kind == Value::Kind::Namespace) return *v.object;
    if (!v.is_data()) fail(line, "'" + v.name + "' is a function, not a value");
    return v.data;
  }

  static const std::set<std::string>& methods(const json& d) {
    static const std::set<std::string> kString = {
        "strip", "lstrip", "rstrip", "split",      "startswith", "endswith",
        "upper", "lower",  "title",  "capitalize", "replace",    "find",
        "count", "join",   "rsplit", "splitlines", "format"};
    static const std::set<std::string> kDict = {"items", "keys", "values", "get"};
    static const std::set<std::string> kNone;
    if (d.is_string()) return kString;
    if (d.is_object()) return kDict;
    return kNone;
  }

  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Value::Kind::Undefined) {
      fail(line, "'" + obj.name + "' is undefined (reading its '" + name + "')");
    }
    if (obj.kind == Value::Kind::Namespace) {
      auto it = obj.object->find(name);
      return it == obj.object->end() ? Value::undefined(name) : Value::of(*it);
    }
    if (!obj.is_data()) return Value::undefined(name);
    const json& d = obj.data;
    if (d.is_object()) {
      auto it = d.find(name);
      if (it != d.end()) return Value::of(*it);
    }
    if (methods(d).count(name) || (obj.loop && name == "cycle")) {
      Value m;
      m.kind = Value::Kind::Method;
      m.name = name;
      m.self = std::make_shared<Value>(obj);
      return m;
    }
    if (d.is_array() && !name.empty() && name.size() <= 18 &&
        name.find_first_not_of("0123456789") == std::string::npos)
      return item(obj, Value::of(std::stoll(name)), line);
    return Value::undefined(name);
  }

  Value item(const Value& obj, const Value& key, int line) {
    const json& d = data(obj, line);
    const json& k = data(key, line);
    if ((d.is_array() || d.is_string()) && is_int(k)) {
      if (d.is_array()) {
        const int64_t i = index_of(k.get<int64_t>(), static_cast<int64_t>(d.size()));
        if (i < 0 || i >= static_cast<int64_t>(d.size()))
          return Value::undefined("element " + std::to_string(k.get<int64_t>()));
        return Value::of(d[static_cast<size_t>(i)]);
      }
      const auto cps = code_points(d.get<std::string>());
      const int64_t i = index_of(k.get<int64_t>(), static_cast<int64_t>(cps.size()));
      if (i < 0 || i >= static_cast<int64_t>(cps.size()))
        return Value::undefined("element " + std::to_string(k.get<int64_t>()));
      return Value::of(cps[static_cast<size_t>(i)]);
    }
    if (d.is_object()) {
      auto it = d.find(py_str(k));
      return it == d.end() ? Value::undefined(py_str(k)) : Value::of(*it);
    }
    return Value::undefined(py_str(k));
  }

  Value slice(const Expr& e) {
    const Value subject = eval(*e.args[0]);
    const json& d = data(subject, e.line);
    auto bound = [&](const ExprP& x) { return x ? data(eval(*x), e.line) : json(nullptr); };
    const json a = bound(e.args[1]), b = bound(e.args[2]), c = bound(e.args[3]);
    for (const json* j : {&a, &b, &c}) {
      if (!j->is_null() && !is_int(*j)) fail(e.line, "slice indices must be integers");
    }
    if (d.is_array()) {
      json out = json::array();
      for (int64_t i : slice_indices(a, b, c, static_cast<int64_t>(d.size()), e.line))
        out.push_back(d[static_cast<size_t>(i)]);
      return Value::of(std::move(out));
    }
    if (d.is_string()) {
      const auto cps = code_points(d.get<std::string>());
      std::string out;
      for (int64_t i : slice_indices(a, b, c, static_cast<int64_t>(cps.size()), e.line))
        out += cps[static_cast<size_t>(i)];
      return Value::of(out);
    }
    fail(e.line, "cannot slice " + py_repr(d));
  }

  std::vector<Value> args_of(const Expr& e, size_t from) {
    std::vector<Value> out;
    for (size_t i = from; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
    return out;
  }
  std::map<std::string, Value> kwargs_of(const Expr& e) {
    std::map<std::string, Value> out;
    for (const auto& [k, v] : e.kwargs) out[k] = eval(*v);
    return out;
  }

  // An argument by position or keyword, or its default.
  static Value arg(const std::vector<Value>& args, const std::map<std::string, Value>& kw,
                   size_t pos, const char* name, Value dflt = Value::undefined("")) {
    if (pos < args.size()) return args[pos];
    auto it = kw.find(name);
    return it == kw.end() ? dflt : it->second;
  }

  Value call(const Expr& e) {
    const Value callee = eval(*e.args[0]);
    const std::vector<Value> args = args_of(e, 1);
    const std::map<std::string, Value> kw = kwargs_of(e);
    if (callee.loop) {
      if (callee.macro == nullptr) fail(e.line, "loop() needs a loop declared recursive");
      if (args.size() != 1 || !kw.empty()) fail(e.line, "loop() takes the items to loop over");
      std::string text;
      const Nest nest(calls_, kMaxCallDepth, e.line, "recursive loops");
      loop_over(*callee.macro, args[0], callee.data.at("depth").get<int64_t>() + 1, text);
      return Value::of(text);
    }
    switch (callee.kind) {
      case Value::Kind::Builtin:
        return builtin(callee.name, args, kw, e.line);
      case Value::Kind::Method:
        return method(*callee.self, callee.name, args, kw, e.line);
      case Value::Kind::Macro:
        return call_macro(*callee.macro, args, kw, e.line);
      case Value::Kind::Undefined:
        fail(e.line, "'" + callee.name + "' is undefined");
      default:
        fail(e.line, "'" + str(callee) + "' is not callable");
    }
  }

  Value call_macro(const Node& m, const std::vector<Value>& args,
                   const std::map<std::string, Value>& kw, int line) {
    const std::string& macro = m.targets[0];
    if (args.size() > m.params.size() && !m.varargs)
      fail(line, "macro '" + macro + "' takes not more than " + std::to_string(m.params.size()) +
                     " argument(s)");
    std::map<std::string, Value> scope;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      if (i < args.size()) {
        if (kw.count(name))
          fail(line, "macro '" + macro + "' got multiple values for argument '" + name + "'");
        scope[name] = args[i];
      } else if (kw.count(name)) {
        scope[name] = kw.at(name);
      } else {
        scope[name] = def ? eval(*def) : Value::undefined(name);
      }
    }
    // The rest: extra positional arguments, and keywords no parameter takes.
    json extra = json::array(), named = json::object();
    for (size_t i = m.params.size(); i < args.size(); ++i) extra.push_back(data(args[i], line));
    for (const auto& [name, value] : kw) {
      if (scope.count(name)) continue;
      if (!m.kwargs) fail(line, "macro '" + macro + "' takes no keyword argument '" + name + "'");
      named[name] = data(value, line);
    }
    if (m.varargs) {
      scope["varargs"] = Value::of(std::move(extra));
      scope["varargs"].tuple = true;
    }
    if (m.kwargs) scope["kwargs"] = Value::of(std::move(named));
    const Nest nest(calls_, kMaxCallDepth, line, "macro calls");
    scopes_.push_back(std::move(scope));
    std::string out;
    run(m.body, out);
    scopes_.pop_back();
    return Value::of(out);
  }

  // Python's str.format with {}, {0} and {name} fields ({{ and }} for
  // braces); conversions, attributes, indices and format specs are refused.
  std::string str_format(const json& format, const std::vector<Value>& args,
                         const std::map<std::string, Value>& kw, int line) {
    const std::string f = format.get<std::string>();
    std::string out;
    size_t automatic = 0;
    bool numbered = false;
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] == '}') {
        if (i + 1 < f.size() && f[i + 1] == '}') {
          out += '}';
          ++i;
          continue;
        }
        fail(line, "single '}' encountered in format string");
      }
      if (f[i] != '{') {
        out += f[i];
        continue;
      }
      if (i + 1 < f.size() && f[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      const size_t close = f.find('}', i);
      if (close == std::string::npos) fail(line, "single '{' encountered in format string");
      const std::string field = f.substr(i + 1, close - i - 1);
      i = close;
      if (field.find_first_of(":!.[") != std::string::npos)
        fail(line, "the format field '{" + field + "}' is not supported (plain {}, {0} or {name})");
      if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
        size_t index = automatic;
        if (field.empty()) {
          if (numbered) fail(line, "cannot switch from manual field numbering to automatic");
          ++automatic;
        } else {
          if (automatic > 0) fail(line, "cannot switch from automatic field numbering to manual");
          numbered = true;
          if (field.size() > 9 || field.find_first_not_of("0123456789") != std::string::npos)
            fail(line, "format: the field '{" + field + "}' is not an index it has");
          index = static_cast<size_t>(std::stoul(field));
        }
        if (index >= args.size())
          fail(line, "format: replacement index " + std::to_string(index) + " out of range");
        out += str(args[index]);
      } else {
        auto it = kw.find(field);
        if (it == kw.end()) fail(line, "format: no argument named '" + field + "'");
        out += str(it->second);
      }
    }
    return out;
  }

  Value builtin(const std::string& name, const std::vector<Value>& args,
                const std::map<std::string, Value>& kw, int line) {
    if (name == "range") {
      if (args.empty() || args.size() > 3) fail(line, "range takes 1 to 3 arguments");
      std::vector<int64_t> a;
      for (const Value& v : args) {
        const json& d = data(v, line);
        if (!is_int(d)) fail(line, "range takes integers");
        a.push_back(d.get<int64_t>());
      }
      const int64_t start = a.size() > 1 ? a[0] : 0, stop = a.size() > 1 ? a[1] : a[0],
                    by_step = a.size() > 2 ? a[2] : 1;
      if (by_step == 0) fail(line, "range's step cannot be zero");
      // Its length as Python counts it (in 128 bits: no overflow), at most
      // kMaxRange as in the sandbox transformers runs templates in.
      const __int128 span = by_step > 0 ? __int128{stop} - start : __int128{start} - stop;
      const __int128 by = by_step > 0 ? __int128{by_step} : -__int128{by_step};
      const __int128 count = span <= 0 ? 0 : (span + by - 1) / by;
      if (count > kMaxRange) {
        fail(line, "range() of more than " + std::to_string(kMaxRange) +
                       " items (the limit of the sandbox chat templates run in)");
      }
      step(line, static_cast<int64_t>(count));
      json out = json::array();
      for (int64_t k = 0; k < static_cast<int64_t>(count); ++k)
        out.push_back(static_cast<int64_t>(start + __int128{k} * by_step));
      return Value::of(std::move(out));
    }
    if (name == "namespace" || name == "dict") {
      json o = json::object();
      for (const Value& v : args) {
        const json& d = data(v, line);
        if (!d.is_object()) fail(line, name + "() takes keyword arguments or a dict");
        for (auto it = d.begin(); it != d.end(); ++it) o[it.key()] = it.value();
      }
      for (const auto& [k, v] : kw) o[k] = data(v, line);
      if (name == "dict") return Value::of(std::move(o));
      Value ns;
      ns.kind = Value::Kind::Namespace;
      ns.object = std::make_shared<json>(std::move(o));
      return ns;
    }
    if (name == "raise_exception") {
      fail(line, "the template raised an error: " + (args.empty() ? "" : str(args[0])));
    }
    if (name == "strftime_now") {
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::string fmt = args.empty() ? "" : str(args[0]);
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value::of(std::string(buf, n));
    }
    fail(line, "unknown function '" + name + "'");
  }

  Value method(const Value& self, const std::string& name, const std::vector<Value>& args,
               const std::map<std::string, Value>& kw, int line) {
    const json& d = self.data;
    if (self.loop && name == "cycle") {
      // loop.cycle(a, b, ...): the argument at the iteration's index, in turn.
      if (args.empty()) fail(line, "loop.cycle() takes at least one value");
      return args[static_cast<size_t>(d.at("index0").get<int64_t>()) % args.size()];
    }
    if (d.is_string() && name == "format") return Value::of(str_format(d, args, kw, line));
    if (!kw.empty()) fail(line, name + "() takes no keyword arguments");
    auto a = [&](size_t i) -> const json& {
      if (i >= args.size()) fail(line, name + "() needs more arguments");
      return data(args[i], line);
    };
    auto string_arg = [&](size_t i) -> std::string {
      const json& v = a(i);
      if (!v.is_string()) fail(line, name + "() takes a string, got " + py_repr(v));
      return v.get<std::string>();
    };
    if (d.is_object()) {
      if (name == "items") {
        json out = json::array();
        for (auto it = d.begin(); it != d.end(); ++it)
          out.push_back(json::array({it.key(), it.value()}));
        return Value::of(std::move(out));
      }
      if (name == "keys" || name == "values") {
        json out = json::array();
        for (auto it = d.begin(); it != d.end(); ++it)
          out.push_back(name == "keys" ? json(it.key()) : it.value());
        return Value::of(std::move(out));
      }
      // get
      if (args.empty()) fail(line, "get() takes a key");
      auto it = d.find(py_str(a(0)));
      if (it != d.end()) return Value::of(*it);
      return args.size() > 1 ? args[1] : Value::of(nullptr);
    }
    const std::string& s = d.get_ref<const std::string&>();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const std::string chars = args.empty() || (args[0].is_data() && args[0].data.is_null())
                                    ? kAsciiSpaces
                                    : string_arg(0);
      return Value::of(strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      const json sep = args.empty() ? json(nullptr) : a(0);
      if (!sep.is_null() && !sep.is_string()) fail(line, name + "() takes a string separator");
      const int64_t maxsplit = args.size() > 1 ? integer(args[1], line, "maxsplit") : -1;
      if (name == "rsplit" && maxsplit >= 0) fail(line, "rsplit with a maximum is not supported");
      return Value::of(split(s, sep, maxsplit));
    }
    if (name == "startswith" || name == "endswith") {
      std::vector<std::string> options;
      const json& x = a(0);
      if (x.is_array()) {
        for (const json& o : x) options.push_back(o.get<std::string>());
      } else {
        options.push_back(string_arg(0));
      }
      for (const std::string& o : options) {
        const bool hit =
            name == "startswith"
                ? s.compare(0, o.size(), o) == 0
                : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
        if (hit) return Value::of(true);
      }
      return Value::of(false);
    }
    if (name == "upper") return Value::of(upper(s));
    if (name == "lower") return Value::of(lower(s));
    if (name == "title") return Value::of(title(s));
    if (name == "capitalize") return Value::of(capitalize(s));
    if (name == "replace") {
      const int64_t count = args.size() > 2 ? integer(args[2], line, "replace's count") : -1;
      return Value::of(replace_all(s, string_arg(0), string_arg(1), count));
    }
    if (name == "find") {
      const size_t at = s.find(string_arg(0));
      return Value::of(at == std::string::npos
                           ? int64_t{-1}
                           : static_cast<int64_t>(code_points(s.substr(0, at)).size()));
    }
    if (name == "count") {
      const std::string sub = string_arg(0);
      int64_t n = 0;
      if (sub.empty()) return Value::of(static_cast<int64_t>(code_points(s).size()) + 1);
      for (size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + sub.size())) ++n;
      return Value::of(n);
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      if (args.empty()) fail(line, "join() needs the items to join");
      for (const Value& v : items_of(args[0], line)) {
        out += (first ? "" : s) + str(v);
        first = false;
      }
      return Value::of(out);
    }
    // splitlines
    json out = json::array();
    size_t i = 0;
    while (i < s.size()) {
      size_t j = s.find_first_of("\r\n", i);
      if (j == std::string::npos) {
        out.push_back(s.substr(i));
        break;
      }
      out.push_back(s.substr(i, j - i));
      i = j + (s.compare(j, 2, "\r\n") == 0 ? 2 : 1);
    }
    return Value::of(std::move(out));
  }

  bool test(const std::string& name, const Value& v, const std::vector<Value>& args, int line) {
    const bool dat = v.is_data();
    const json& d = v.data;
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return dat && d.is_null();
    if (name == "boolean") return dat && d.is_boolean();
    if (name == "true") return dat && d.is_boolean() && d.get<bool>();
    if (name == "false") return dat && d.is_boolean() && !d.get<bool>();
    if (name == "string") return dat && d.is_string();
    if (name == "number") return dat && d.is_number();
    if (name == "integer") return dat && d.is_number_integer();
    if (name == "float") return dat && d.is_number_float();
    if (name == "mapping") return (dat && d.is_object()) || v.kind == Value::Kind::Namespace;
    // (Jinja's undefined is an empty sequence.)
    if (name == "sequence" || name == "iterable")
      return !v.defined() || (dat && (d.is_array() || d.is_string() || d.is_object()));
    if (name == "callable")
      return v.kind == Value::Kind::Macro || v.kind == Value::Kind::Builtin ||
             v.kind == Value::Kind::Method;
    if (name == "lower") return dat && d.is_string() && lower(d.get<std::string>()) == d;
    if (name == "upper") return dat && d.is_string() && upper(d.get<std::string>()) == d;
    if (name == "odd" || name == "even" || name == "divisibleby") {
      const json& x = data(v, line);
      if (!is_int(x)) fail(line, "the test '" + name + "' takes an integer");
      if (name == "divisibleby" && args.empty()) fail(line, "divisibleby needs a number");
      const int64_t by = name == "divisibleby" ? integer(args[0], line, "divisibleby's number") : 2;
      if (by == 0) fail(line, "division by zero");
      // (By -1 too: INT64_MIN % -1 would overflow.)
      const int64_t r = by == -1 ? 0 : ((x.get<int64_t>() % by) + by) % by;
      return name == "odd" ? r == 1 : r == 0;
    }
    if (args.empty()) fail(line, "unknown test '" + name + "'");
    const Value& o = args[0];
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, o);
    if (name == "ne" || name == "!=") return !equal(v, o);
    if (name == "sameas") return equal(v, o) && (!dat || d.type() == o.data.type());
    if (name == "in") return contains(o, v, line);
    if (name == "lt" || name == "le" || name == "gt" || name == "ge") {
      const int c = compare(v, o, line);
      return name == "lt" ? c < 0 : name == "le" ? c <= 0 : name == "gt" ? c > 0 : c >= 0;
    }
    fail(line, "unknown test '" + name + "'");
  }

  bool contains(const Value& container, const Value& x, int line) {
    const json& c = data(container, line);
    if (c.is_string()) {
      const json& s = data(x, line);
      if (!s.is_string()) fail(line, "'in <string>' needs a string on its left");
      return c.get_ref<const std::string&>().find(s.get<std::string>()) != std::string::npos;
    }
    if (c.is_object()) return x.is_data() && c.contains(py_str(x.data));
    if (c.is_array()) {
      for (const json& e : c) {
        if (equal(Value::of(e), x)) return true;
      }
      return false;
    }
    fail(line, "'in' needs a string, list or dict on its right, got " + py_repr(c));
  }

  int compare(const Value& a, const Value& b, int line) {
    const json& x = data(a, line);
    const json& y = data(b, line);
    if (is_num(x) && is_num(y)) return num(x) < num(y) ? -1 : num(x) > num(y) ? 1 : 0;
    if (x.is_string() && y.is_string()) return x.get<std::string>().compare(y.get<std::string>());
    if (x.is_array() && y.is_array()) {
      for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
        const int c = compare(Value::of(x[i]), Value::of(y[i]), line);
        if (c != 0) return c;
      }
      return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    fail(line, "cannot compare " + py_repr(x) + " with " + py_repr(y));
  }

  bool compare_op(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in") return contains(b, a, line);
    if (op == "not in") return !contains(b, a, line);
    const int c = compare(a, b, line);
    return op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
  }

  Value chain(const Expr& e) {
    Value left = eval(*e.args[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1]);
      if (!compare_op(e.ops[i], left, right, e.line)) return Value::of(false);
      left = std::move(right);
    }
    return Value::of(true);
  }

  Value binary_op(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
    if (op == "~") return Value::of(str(a) + str(b));
    const json& x = data(a, e.line);
    const json& y = data(b, e.line);
    if (op == "+") {
      if (x.is_string() && y.is_string())
        return Value::of(x.get<std::string>() + y.get<std::string>());
      if (x.is_array() && y.is_array()) {
        json out = x;
        for (const json& v : y) out.push_back(v);
        return Value::of(std::move(out));
      }
    }
    if (op == "%" && x.is_string()) {  // Python's printf-style formatting
      return Value::of(
          percent_format(x.get<std::string>(), y.is_array() ? y : json::array({y}), e.line));
    }
    if (op == "*" && ((x.is_string() && is_int(y)) || (is_int(x) && y.is_string()))) {
      const std::string& s =
          x.is_string() ? x.get_ref<const std::string&>() : y.get_ref<const std::string&>();
      const int64_t times = (is_int(y) ? y : x).get<int64_t>();
      if (times > 0 && s.size() > kMaxText / static_cast<uint64_t>(times))
        fail(e.line, "a string repeated " + std::to_string(times) + " times is too long");
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += s;
      return Value::of(out);
    }
    if (!is_num(x) || !is_num(y) || x.is_boolean() || y.is_boolean()) {
      fail(e.line, "unsupported operands for " + op + ": " + py_repr(x) + " and " + py_repr(y));
    }
    const bool ints = is_int(x) && is_int(y);
    if (ints && op != "/" && op != "**") {
      const int64_t i = x.get<int64_t>(), j = y.get<int64_t>();
      if (op == "+" || op == "-" || op == "*") return Value::of(int_op(op[0], i, j, e.line));
      if (j == 0) fail(e.line, "division by zero");
      if (j == -1) return Value::of(op == "//" ? negated(i, e.line) : int64_t{0});
      const int64_t q = i / j - ((i % j != 0) && ((i < 0) != (j < 0)) ? 1 : 0);  // floor
      if (op == "//") return Value::of(q);
      if (op == "%") return Value::of(i - q * j);
    }
    const double i = num(x), j = num(y);
    if (op == "+") return Value::of(i + j);
    if (op == "-") return Value::of(i - j);
    if (op == "*") return Value::of(i * j);
    if (op == "**") {
      if (ints && y.get<int64_t>() >= 0)
        return Value::of(int_pow(x.get<int64_t>(), y.get<int64_t>(), e.line));
      return Value::of(std::pow(i, j));
    }
    if (j == 0) fail(e.line, "division by zero");
    if (op == "/") return Value::of(i / j);
    if (op == "//") return Value::of(std::floor(i / j));
    return Value::of(i - std::floor(i / j) * j);  // %
  }

  Value filter(const Expr& e) {
    // (Counted here too: map's filters run without eval.)
    const Nest nest(depth_, kMaxRenderDepth, e.line, "expressions, blocks and macro calls");
    step(e.line);
    const std::string& name = e.name;
    const Value v = eval(*e.args[0]);
    const std::vector<Value> args = args_of(e, 1);
    const std::map<std::string, Value> kw = kwargs_of(e);
    const int line = e.line;
    static const std::set<std::string> kFilters = {
        "default", "d",      "length",     "count",     "safe",    "string",     "trim",
        "upper",   "lower",  "capitalize", "title",     "replace", "tojson",     "indent",
        "int",     "float",  "abs",        "round",     "items",   "dictsort",   "list",
        "first",   "last",   "reverse",    "join",      "unique",  "sum",        "max",
        "min",     "sort",   "map",        "select",    "reject",  "selectattr", "rejectattr",
        "format",  "escape", "e",          "wordcount", "center",  "batch",      "slice"};
    if (!kFilters.count(name)) fail(line, "the filter '" + name + "' is not supported");
    if (name == "default" || name == "d") {
      const Value dflt = arg(args, kw, 0, "default_value", Value::of(""));
      const bool boolean = truthy(arg(args, kw, 1, "boolean", Value::of(false)));
      return (!v.defined() || (boolean && !truthy(v))) ? dflt : v;
    }
    if (name == "length" || name == "count") {
      if (!v.defined()) return Value::of(int64_t{0});
      const json& d = data(v, line);
      if (d.is_string())
        return Value::of(static_cast<int64_t>(code_points(d.get<std::string>()).size()));
      if (d.is_array() || d.is_object()) return Value::of(static_cast<int64_t>(d.size()));
      fail(line, "object of type " + py_repr(d) + " has no length");
    }
    if (name == "safe") return v;
    if (name == "escape" || name == "e") {
      // markupsafe's five characters. (The result is plain text here: a
      // Markup string's own escaping of what is later added to it is not
      // reproduced.)
      std::string out;
      for (char c : str(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::of(out);
    }
    if (name == "wordcount") {
      // Runs of Python's \w: letters, numbers and '_'.
      const std::string text = str(v);
      int64_t words = 0;
      bool in_word = false;
      for (size_t i = 0; i < text.size();) {
        size_t len = 1;
        const uint32_t cp = next_code_point(text, i, len);
        const bool word = cp == '_' || unicode::is_letter(cp) || unicode::is_number(cp);
        words += word && !in_word;
        in_word = word;
        i += len;
      }
      return Value::of(words);
    }
    if (name == "center") {
      // Python's str.center: by code points, an odd margin's extra space on
      // the left when the width is odd.
      const std::string text = str(v);
      const int64_t width =
          integer(arg(args, kw, 0, "width", Value::of(int64_t{80})), line, "center's width");
      if (width > static_cast<int64_t>(kMaxText)) fail(line, "center's width is too large");
      const auto length = static_cast<int64_t>(code_points(text).size());
      if (width <= length) return Value::of(text);
      const int64_t margin = width - length, left = margin / 2 + (margin & width & 1);
      return Value::of(std::string(static_cast<size_t>(left), ' ') + text +
                       std::string(static_cast<size_t>(margin - left), ' '));
    }
    if (name == "format") {
      if (!kw.empty()) fail(line, "format with keyword arguments is not supported");
      json list = json::array();
      for (const Value& a : args) list.push_back(data(a, line));
      return Value::of(percent_format(str(v), list, line));
    }
    if (name == "string") return Value::of(str(v));
    if (name == "trim") {
      const Value chars = arg(args, kw, 0, "chars");
      return Value::of(strip(str(v),
                             chars.defined() && chars.is_data() && chars.data.is_string()
                                 ? chars.data.get<std::string>()
                                 : kAsciiSpaces,
                             true, true));
    }
    if (name == "upper") return Value::of(upper(str(v)));
    if (name == "lower") return Value::of(lower(str(v)));
    if (name == "capitalize") return Value::of(capitalize(str(v)));
    if (name == "title") return Value::of(title(str(v)));
    if (name == "replace") {
      const Value count = arg(args, kw, 2, "count");
      if (args.size() < 2) fail(line, "replace needs the old and the new text");
      return Value::of(replace_all(str(v), str(args[0]), str(args[1]),
                                   count.defined() ? integer(count, line, "replace's count") : -1));
    }
    if (name == "tojson") {
      const Value indent = arg(args, kw, 99, "indent");
      const Value ascii = arg(args, kw, 99, "ensure_ascii", Value::of(false));
      if (truthy(ascii)) fail(line, "tojson(ensure_ascii=true) is not supported");
      // (As Python's json.dumps: a negative indent is none, newlines only.)
      const int64_t ind = indent.defined() && indent.is_data() && !indent.data.is_null()
                              ? std::max<int64_t>(0, integer(indent, line, "tojson's indent"))
                              : -1;
      if (ind > static_cast<int64_t>(kMaxText)) fail(line, "tojson's indent is too large");
      return Value::of(
          to_json(data(v, line), static_cast<int>(ind), truthy(arg(args, kw, 99, "sort_keys"))));
    }
    if (name == "indent") {
      const Value w = arg(args, kw, 0, "width", Value::of(int64_t{4}));
      const bool first = truthy(arg(args, kw, 1, "first", Value::of(false)));
      const bool blank = truthy(arg(args, kw, 2, "blank", Value::of(false)));
      const int64_t spaces =
          w.is_data() && w.data.is_string() ? 0 : integer(w, line, "indent's width");
      if (spaces > static_cast<int64_t>(kMaxText)) fail(line, "indent's width is too large");
      const std::string pad =
          w.is_data() && w.data.is_string()
              ? w.data.get<std::string>()
              : std::string(static_cast<size_t>(std::max<int64_t>(0, spaces)), ' ');
      const std::string s = str(v);
      std::string out;
      size_t i = 0;
      bool first_line = true;
      while (i <= s.size()) {
        size_t j = s.find('\n', i);
        const std::string ln = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
        const bool pad_it = (first_line ? first : true) && (blank || !ln.empty());
        out += (pad_it ? pad : "") + ln;
        if (j == std::string::npos) break;
        out += '\n';
        i = j + 1;
        first_line = false;
      }
      return Value::of(out);
    }
    if (name == "int") {
      const json& d = data(v, line);
      if (d.is_string()) {
        try {
          return Value::of(static_cast<int64_t>(std::stoll(d.get<std::string>())));
        } catch (const std::exception&) {
          return arg(args, kw, 0, "default", Value::of(int64_t{0}));
        }
      }
      if (is_int(d)) return Value::of(d.get<int64_t>());
      if (is_num(d)) return Value::of(float_to_int(num(d), line, "int"));
      return arg(args, kw, 0, "default", Value::of(int64_t{0}));
    }
    if (name == "float") {
      const json& d = data(v, line);
      if (is_num(d)) return Value::of(num(d));
      try {
        return Value::of(std::stod(py_str(d)));
      } catch (const std::exception&) {
        return arg(args, kw, 0, "default", Value::of(0.0));
      }
    }
    if (name == "abs") {
      const json& d = data(v, line);
      if (is_int(d)) {
        const int64_t i = d.get<int64_t>();
        return Value::of(i < 0 ? negated(i, line) : i);
      }
      return Value::of(std::fabs(num(d)));
    }
    if (name == "round") {
      const int64_t p =
          integer(arg(args, kw, 0, "precision", Value::of(int64_t{0})), line, "round's precision");
      const double f = std::pow(10.0, static_cast<double>(p));
      return Value::of(std::round(num(data(v, line)) * f) / f);
    }
    if (name == "items") {
      if (!v.defined()) return Value::of(json::array());
      return method(Value::of(data(v, line)), "items", {}, {}, line);
    }
    if (name == "dictsort") {
      Value items = method(Value::of(data(v, line)), "items", {}, {}, line);
      std::stable_sort(items.data.begin(), items.data.end(), [](const json& a, const json& b) {
        return lower(py_str(a[0])) < lower(py_str(b[0]));
      });
      return items;
    }
    // Filters over a sequence.
    std::vector<Value> items = items_of(v, line);
    if (name == "list") {
      json out = json::array();
      for (const Value& x : items) out.push_back(data(x, line));
      return Value::of(std::move(out));
    }
    if (name == "first") return items.empty() ? Value::undefined("first") : items.front();
    if (name == "last") return items.empty() ? Value::undefined("last") : items.back();
    if (name == "reverse") {
      if (v.is_data() && v.data.is_string()) {
        std::string out;
        for (auto it = items.rbegin(); it != items.rend(); ++it) out += it->data.get<std::string>();
        return Value::of(out);
      }
      json out = json::array();
      for (auto it = items.rbegin(); it != items.rend(); ++it) out.push_back(it->data);
      return Value::of(std::move(out));
    }
    if (name == "join") {
      const std::string sep = args.empty() && !kw.count("d") ? "" : str(arg(args, kw, 0, "d"));
      const Value attr = arg(args, kw, 1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        out +=
            (i ? sep : "") + str(attr.defined() ? attribute(items[i], str(attr), line) : items[i]);
      }
      return Value::of(out);
    }
    if (name == "batch" || name == "slice") {
      // batch: lists of `n` items, the last one filled up to `n` when a fill
      // is given. slice: `n` lists, the first (size mod n) one item longer,
      // the others filled by one when a fill is given (Jinja2's rules).
      const Value count = arg(args, kw, 0, name == "batch" ? "linecount" : "slices");
      if (!count.defined() || !is_int(data(count, line)) || data(count, line).get<int64_t>() < 1)
        fail(line, "the filter '" + name + "' needs a count of at least 1");
      if (data(count, line).get<int64_t>() > static_cast<int64_t>(kMaxItems))
        fail(line,
             "the filter '" + name + "' takes a count of at most " + std::to_string(kMaxItems));
      const auto n = static_cast<size_t>(data(count, line).get<int64_t>());
      const Value fill = arg(args, kw, 1, "fill_with");
      const bool filled = fill.defined() && !(fill.is_data() && fill.data.is_null());
      json out = json::array();
      if (name == "batch") {
        for (size_t i = 0; i < items.size(); i += n) {
          json part = json::array();
          for (size_t j = i; j < std::min(i + n, items.size()); ++j)
            part.push_back(data(items[j], line));
          while (filled && part.size() < n) part.push_back(data(fill, line));
          out.push_back(std::move(part));
        }
      } else {
        const size_t per = items.size() / n, longer = items.size() % n;
        size_t at = 0;
        for (size_t k = 0; k < n; ++k) {
          json part = json::array();
          const size_t size = per + (k < longer ? 1 : 0);
          for (size_t j = at; j < at + size; ++j) part.push_back(data(items[j], line));
          at += size;
          if (filled && k >= longer) part.push_back(data(fill, line));
          out.push_back(std::move(part));
        }
      }
      return Value::of(std::move(out));
    }
    if (name == "unique") {
      json out = json::array();
      for (const Value& x : items) {
        bool seen = false;
        for (const json& y : out) seen = seen || equal(Value::of(y), x);
        if (!seen) out.push_back(x.data);
      }
      return Value::of(std::move(out));
    }
    if (name == "sum") {
      Value total = arg(args, kw, 1, "start", Value::of(int64_t{0}));
      const Value attr = arg(args, kw, 0, "attribute");
      for (const Value& x : items) {
        const Value y = attr.defined() ? attribute(x, str(attr), line) : x;
        const json& a = data(total, line);
        const json& b = data(y, line);
        if (!is_num(a) || !is_num(b))
          fail(line, "sum: unsupported operands " + py_repr(a) + " and " + py_repr(b));
        total = is_int(a) && is_int(b)
                    ? Value::of(int_op('+', a.get<int64_t>(), b.get<int64_t>(), line))
                    : Value::of(num(a) + num(b));
      }
      return total;
    }
    if (name == "max" || name == "min" || name == "sort") {
      const Value attr = arg(args, kw, name == "sort" ? 2 : 1, "attribute");
      auto key = [&](const Value& x) { return attr.defined() ? attribute(x, str(attr), line) : x; };
      if (name == "sort") {
        const bool reverse = truthy(arg(args, kw, 0, "reverse", Value::of(false)));
        std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
          const int c = compare(key(a), key(b), line);
          return reverse ? c > 0 : c < 0;
        });
        json out = json::array();
        for (const Value& x : items) out.push_back(x.data);
        return Value::of(std::move(out));
      }
      if (items.empty()) return Value::undefined(name);
      Value best = items[0];
      for (const Value& x : items) {
        const int c = compare(key(x), key(best), line);
        if (name == "max" ? c > 0 : c < 0) best = x;
      }
      return best;
    }
    if (name == "map") {
      json out = json::array();
      const Value attr = arg(args, kw, 99, "attribute");
      for (const Value& x : items) {
        if (attr.defined()) {
          Value y = attribute(x, str(attr), line);
          if (!y.defined() && kw.count("default")) y = kw.at("default");
          out.push_back(data(y, line));
        } else {
          if (args.empty()) fail(line, "map needs a filter's name or attribute=");
          Expr call;
          call.kind = Expr::Filter;
          call.line = line;
          call.name = str(args[0]);
          auto subject = make(Expr::Literal, line);
          subject->value = data(x, line);
          call.args.push_back(std::move(subject));
          for (size_t i = 1; i < args.size(); ++i) {
            auto lit = make(Expr::Literal, line);
            lit->value = data(args[i], line);
            call.args.push_back(std::move(lit));
          }
          out.push_back(data(filter(call), line));
        }
      }
      return Value::of(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool attr = name == "selectattr" || name == "rejectattr";
      const bool keep = name == "select" || name == "selectattr";
      const size_t t = attr ? 1 : 0;  // where the test's name is
      json out = json::array();
      for (const Value& x : items) {
        if (attr && args.empty()) fail(line, name + " needs an attribute's name");
        const Value subject = attr ? attribute(x, str(args[0]), line) : x;
        const bool r =
            args.size() > t
                ? test(str(args[t]), subject,
                       std::vector<Value>(args.begin() + static_cast<std::ptrdiff_t>(t + 1),
                                          args.end()),
                       line)
                : truthy(subject);
        if (r == keep) out.push_back(data(x, line));
      }
      return Value::of(std::move(out));
    }
    fail(line, "the filter '" + name + "' is not supported");
  }

  std::vector<std::map<std::string, Value>> scopes_;
  std::vector<std::pair<size_t, size_t>>* spans_ = nullptr;
  const std::string* top_ = nullptr;
  int depth_ = 0;      // expressions and statements in progress
  int calls_ = 0;      // macro calls and loop(...) in progress
  int64_t steps_ = 0;  // expressions and statements run
};

}  // namespace

std::string to_json(const json& value, int indent, bool sort_keys) {
  std::string out;
  dump(value, indent, sort_keys, 0, out);
  return out;
}

Template::Template(const std::string& source) : program_(std::make_unique<Program>()) {
  // Jinja2 drops the source's one final newline (keep_trailing_newline off).
  std::string s = source;
  if (s.size() >= 2 && s.compare(s.size() - 2, 2, "\r\n") == 0) {
    s.resize(s.size() - 2);
  } else if (!s.empty() && s.back() == '\n') {
    s.pop_back();
  }
  Parser parser(Lexer(s).run());
  program_->body = parser.program();
  program_->has_generation = parser.has_generation_;
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const json& context,
                             std::vector<std::pair<size_t, size_t>>* generation) const {
  Renderer r(context, generation);
  std::string out;
  try {
    r.run_top(program_->body, out);
  } catch (const nlohmann::json::exception& e) {
    // (A value of a type an operation does not take, where no check above
    // named it.)
    throw ValueError(std::string("chat template: ") + e.what());
  }
  return out;
}

bool Template::has_generation() const {
  return program_->has_generation;
}

}  // namespace triad::data::jinja
