// Jinja for chat templates (data/jinja.h): what a template writes, and the
// errors that name what is wrong and where. (tests/parity/jinja_* compare
// whole chat templates with Jinja2 itself.)
#include "triad/data/jinja.h"

#include <gtest/gtest.h>

#include "support/expect_error.h"

namespace triad::data::jinja {
namespace {

using nlohmann::ordered_json;
using triad::testing::expect_error;

std::string render(const std::string& source,
                   const ordered_json& context = ordered_json::object()) {
  return Template(source).render(context);
}

TEST(Jinja, WritesTextExpressionsAndStatementsWithTransformersWhitespace) {
  const ordered_json ctx = {
      {"messages",
       {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "hello"}}}}};
  // trim_blocks drops the newline after a block tag; lstrip_blocks the
  // indentation before one.
  EXPECT_EQ(render("{% for m in messages %}\n  {% if m.role == 'user' %}\nU:{{ m.content }}\n  "
                   "{% else %}\nA:{{ m.content }}\n  {% endif %}\n{% endfor %}\n",
                   ctx),
            "U:hi\nA:hello\n");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("{{ x }}|{{ x.y is defined }}", {{"x", {{"z", 1}}}}), "{'z': 1}|False");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ 1e16 }}"),
            "True False -4 3.5 1e+16");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i "
                   "%}{% endfor %}{{ ns.n }}"),
            "6");
  // A variable set in a loop stays in it.
  EXPECT_EQ(render("{% set v = 1 %}{% for i in [2] %}{% set v = i %}{% endfor %}{{ v }}"), "1");
  EXPECT_EQ(render("{{ 'x' }}\n"), "x");  // the source's final newline is dropped
  EXPECT_EQ(to_json({{"a", {1, 2.5, nullptr}}, {"b", "é\n"}}),
            R"({"a": [1, 2.5, null], "b": "é\n"})");
  EXPECT_EQ(to_json({{"b", 1}, {"a", {true}}}, 1, true), "{\n \"a\": [\n  true\n ],\n \"b\": 1\n}");
}

// Python's % formatting pads and cuts text by code points, and nothing it
// writes is cut short.
TEST(Jinja, PercentFormattingCountsCodePointsAndHasNoLengthLimit) {
  EXPECT_EQ(render("[{{ '%-6s|%.2s|%5s|%3r' % ('h\u00e9\u00e9', '\u00fcn\u00ef', '\u00f6', "
                   "'\u00e9') }}]"),
            "[h\u00e9\u00e9   |\u00fcn|    \u00f6|'\u00e9']");
  EXPECT_EQ(render("{{ '<%s>' % x }}", {{"x", std::string(3000, 'x')}}),
            "<" + std::string(3000, 'x') + ">");
  EXPECT_EQ(render("{{ ('%900d' % 7) | length }} {{ '%9.3f|' % 3.14159 }}"), "900     3.142|");
}

TEST(Jinja, CallAndFilterBlocksLoopCycleStrFormatEscapeAndWordcount) {
  EXPECT_EQ(render("{% macro row(x) %}<{{ x }}|{{ caller(x * 2) }}>{% endmacro %}"
                   "{% call(y) row(3) %}got {{ y }}{% endcall %}"),
            "<3|got 6>");
  EXPECT_EQ(render("{% filter upper | replace('B', 'b') %}abc{{ 1 }}{% endfilter %}"), "AbC1");
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.cycle(1, 2) }}{{ loop.depth }}{% endfor %}"),
            "112111");
  EXPECT_EQ(render("{{ '{}-{x}-{{}}'.format(1, x='y') }} {{ '{1}{0}'.format('a', 'b') }}"),
            "1-y-{} ba");
  EXPECT_EQ(render("{{ '<a href=\"x\">&\\'</a>' | e }}"),
            "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(render("{{ 'h\u00e9llo, w_2 \u2014 ok' | wordcount }}"), "3");
  EXPECT_EQ(render("{% for n in tree recursive %}{{ n.id }}{{ loop.depth }}"
                   "{% if n.kids %}({{ loop(n.kids) }}){% endif %}{% endfor %}",
                   {{"tree", R"([{"id": "a", "kids": [{"id": "b", "kids": [{"id": "c"}]}]},
                                 {"id": "d"}])"_json}}),
            "a1(b2(c3))d1");
  expect_error([] { render("{% for x in [1] %}{{ loop([2]) }}{% endfor %}"); },
               {"loop() needs a loop declared recursive"});
  expect_error([] { render("{% call 'x' %}{% endcall %}"); }, {"{% call %} takes a call"});
  expect_error([] { render("{{ '{:>4}'.format(1) }}"); }, {"'{:>4}' is not supported"});
  expect_error([] { render("{{ '{} {}'.format(1) }}"); }, {"index 1 out of range"});
  expect_error([] { render("{% for x in [1] %}{{ loop.cycle() }}{% endfor %}"); },
               {"loop.cycle() takes at least one value"});
  expect_error([] { render("{% filter upper %}x"); }, {"{% endfilter %}"});
}

// A macro takes extra arguments only when its body names varargs or kwargs
// (Jinja2's rule); center, batch and slice as Jinja2's filters.
TEST(Jinja, MacroVarargsAndKwargsCenterBatchAndSlice) {
  EXPECT_EQ(render("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{% for k, v in kwargs | "
                   "dictsort %};{{ k }}={{ v }}{% endfor %}{% endmacro %}"
                   "{{ m(1) }} {{ m(1, 3, 4, 5) }} {{ m(1, z=0, b=9, y='x') }}"),
            "12() 13(4, 5) 19();y=x;z=0");
  EXPECT_EQ(render("{{ (1, 'a') }} {{ (1,) }} {{ () }} {{ (1, 2) | list }}"),
            "(1, 'a') (1,) () [1, 2]");
  EXPECT_EQ(render("{% macro m(a) %}{{ a }}{{ x.kwargs }}{% endmacro %}{{ m(1) }}",
                   {{"x", {{"kwargs", "!"}}}}),
            "1!");
  expect_error([] { render("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"); },
               {"macro 'm' takes not more than 1 argument(s)"});
  expect_error([] { render("{% macro m(a) %}{{ varargs }}{% endmacro %}{{ m(1, b=2) }}"); },
               {"macro 'm' takes no keyword argument 'b'"});
  // (an attribute named kwargs is not the macro's)
  expect_error([] { render("{% macro m(a) %}{{ a.kwargs }}{% endmacro %}{{ m({}, b=2) }}"); },
               {"macro 'm' takes no keyword argument 'b'"});
  expect_error([] { render("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, a=2) }}"); },
               {"macro 'm' got multiple values for argument 'a'"});
  EXPECT_EQ(render("[{{ 'ab' | center(7) }}|{{ 'ab' | center(6) }}|{{ 'abc' | center(6) }}|"
                   "{{ 'h\u00e9' | center(5) }}|{{ 'long' | center(2) }}]"),
            "[   ab  |  ab  | abc  |  h\u00e9 |long]");
  EXPECT_EQ(render("{{ range(7) | batch(3) | list }} {{ range(7) | batch(3, 'x') }} "
                   "{{ [] | batch(2) }}"),
            "[[0, 1, 2], [3, 4, 5], [6]] [[0, 1, 2], [3, 4, 5], [6, 'x', 'x']] []");
  EXPECT_EQ(render("{{ range(7) | slice(3) }} {{ range(8) | slice(3, 0) }} {{ [1] | slice(3) }}"),
            "[[0, 1, 2], [3, 4], [5, 6]] [[0, 1, 2], [3, 4, 5], [6, 7, 0]] [[1], [], []]");
  expect_error([] { render("{{ [1] | batch(0) }}"); },
               {"the filter 'batch' needs a count of at least 1"});
}

TEST(Jinja, ErrorsNameWhatIsWrongAndItsLine) {
  expect_error([] { Template("a\n{% if x %}b"); },
               {"line 2", "ends before the {% endif %} it needs"});
  expect_error([] { Template("{% include 'other' %}"); }, {"line 1", "'include' is not supported"});
  expect_error([] { Template("{{ x |}}"); }, {"expected a name"});
  expect_error([] { Template("{{ 'open }}"); }, {"string literal is never closed"});
  expect_error([] { Template("\n\n{{ x"); }, {"line 3", "never closed"});
  expect_error(
      [] {
        render("{{ x | frobnicate }}", {{"x", 1}});
      },
      {"the filter 'frobnicate' is not supported"});
  expect_error([] { render("\n{{ message.content }}"); },
               {"line 2", "'message' is undefined (reading its 'content')"});
  expect_error([] { render("{{ raise_exception('roles must alternate') }}"); },
               {"raised an error: roles must alternate"});
  expect_error(
      [] {
        render("{{ messages[0].role }}", {{"messages", ordered_json::array()}});
      },
      {"'element 0' is undefined (reading its 'role')"});
  expect_error([] { render("{{ 'a' + 1 }}"); }, {"unsupported operands for +"});
  expect_error([] { render("{{ 1 // 0 }}"); }, {"division by zero"});
  expect_error([] { render("{{ '%s %s' % 'one' }}"); }, {"not enough arguments"});
  expect_error([] { render("{{ '%q' | format(1) }}"); }, {"%q is not supported"});
  expect_error([] { render("{{ x }}", ordered_json::array()); }, {"must be a JSON object"});
}

// A chat template comes with a downloaded model: whatever it holds ends in
// an error naming what it passed, never in a crash, a hang or all of memory
// (tests/fuzz/ runs such templates under the sanitizers). Integers are
// 64-bit where Python's grow; range() is the sandbox's (100000 items).
TEST(Jinja, WhatATemplateCannotDoIsAnErrorNotACrash) {
  EXPECT_EQ(render("{{ 9223372036854775806 + 1 }} {{ 2 ** 62 }} {{ 3 ** 3 }} {{ 2 ** -1 }}"),
            "9223372036854775807 4611686018427387904 27 0.5");
  EXPECT_EQ(render("{{ -7 // -1 }} {{ -7 % -1 }} {{ (-9223372036854775807 - 1) % -1 }}"), "7 0 0");
  EXPECT_EQ(render("{{ [1, 2, 3, 4, 5][::9223372036854775807] }} "
                   "{{ [1, 2, 3, 4, 5][::-9223372036854775807 - 1] }} {{ [1, 2, 3][::-2] }}"),
            "[1] [5] [3, 1]");
  EXPECT_EQ(render("{{ range(100000) | length }} {{ range(5, -6, -3) | list }}"),
            "100000 [5, 2, -1, -4]");
  for (const char* overflow :
       {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 3037000500 * 3037000500 }}", "{{ (-9223372036854775807 - 1) // -1 }}",
        "{{ -(-9223372036854775807 - 1) }}", "{{ (-9223372036854775807 - 1) | abs }}",
        "{{ 2 ** 63 }}", "{{ [9223372036854775807, 1] | sum }}"}) {
    expect_error([&] { render(overflow); }, {"does not fit in 64 bits"});
  }
  expect_error([] { Template("{{ 99999999999999999999 }}"); },
               {"line 1", "the integer 99999999999999999999 does not fit in 64 bits"});
  expect_error([] { render("{{ 1e300 | int }}"); }, {"does not fit in a 64-bit integer"});
  expect_error([] { render("{% for i in range(10 ** 12) %}{% endfor %}"); },
               {"range() of more than 100000 items"});
  expect_error([] { render("{{ 5 is divisibleby 0 }}"); }, {"division by zero"});
  expect_error([] { render("{{ 'a' | center('wide') }}"); },
               {"center's width must be an integer, got 'wide'"});
  expect_error([] { render("{{ 'a' | center(10 ** 12) }}"); }, {"center's width is too large"});
  expect_error([] { render("{{ 'ab' * 10 ** 12 }}"); },
               {"repeated 1000000000000 times is too long"});
  expect_error([] { render("{{ '%99999999999d' % 1 }}"); }, {"width or precision is too large"});
  // Nesting: the parser's, an expression's tree, blocks, macro calls, data.
  const auto nested = [](const std::string& open, const std::string& middle,
                         const std::string& close, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += open;
    s += middle;
    for (int i = 0; i < n; ++i) s += close;
    return s;
  };
  EXPECT_EQ(render("{{ " + nested("(", "1", ")", 200) + " }}"), "1");
  expect_error([&] { Template("{{ " + nested("(", "1", ")", 300) + " }}"); },
               {"expressions nest more than 256 levels deep"});
  std::string sum = "1";
  for (int i = 0; i < 100; ++i) sum += " + 1";
  EXPECT_EQ(render("{{ " + sum + " }}"), "101");
  for (int i = 0; i < 50; ++i) sum += " + 1";
  expect_error([&] { Template("{{ " + sum + " }}"); },
               {"an expression nests more than 128 operations deep"});
  expect_error([&] { Template(nested("{% if true %}", "x", "{% endif %}", 300)); },
               {"blocks nest more than 256 levels deep"});
  expect_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); },
               {"macro calls nest more than 100 levels deep"});
  EXPECT_EQ(render("{% macro f(n) %}{{ n }}{% if n < 50 %}{{ f(n + 1) }}{% endif %}{% endmacro %}"
                   "{{ f(0) | length }}"),
            "92");  // 0..9 (10 digits) and 10..50 (41 x 2)
  expect_error([] { render("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}"); },
               {"recursive loops nest more than 100 levels deep"});
  expect_error(
      [] {
        render(
            "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}"
            "{% set ns.x = [ns.x] %}{% endfor %}");
      },
      {"nests lists and dicts more than 256 levels deep"});
  // Work and size: the steps a render takes, the text it makes.
  expect_error(
      [] {
        render(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
            "{% endfor %}");
      },
      {"the template runs more than 2000000 expressions and statements"});
  expect_error(
      [] {
        render(
            "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
      },
      {"more than the 16777216 a template may make"});
  expect_error([] { render("{{ [[1]] | tojson(indent=10000000) }}"); },
               {"tojson's text would be longer than"});
}

}  // namespace
}  // namespace triad::data::jinja
