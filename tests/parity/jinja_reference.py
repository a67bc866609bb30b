#!/usr/bin/env python3
"""Reference for Triad's Jinja (src/data/jinja.cpp): Jinja2 itself (Debian:
python3-jinja2), set up as transformers sets it up to run chat templates —
a sandbox with trim_blocks and lstrip_blocks, loop controls, a
{% generation %} block that writes its body, raise_exception,
strftime_now and a tojson that keeps non-ASCII text. Chat templates in the
style of the common model families, and one that exercises the rest of
the language, are rendered for several conversations and settings.
Writes OUT_DIR/cases.json:
[{"name": ..., "template": ..., "context": {...}, "output": ...} or
 {..., "error": ...} where Jinja2 raised].

usage: jinja_reference.py OUT_DIR
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """transformers' {% generation %}: its body, as it is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


TEMPLATES = {
    # Qwen2.5's kind: a default system message, tools, tool calls and results.
    "chatml_tools": """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions.\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
""",
    # LLaMA 3.1's kind: a dated system header, content trimmed.
    "llama3": """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
""",
    # Gemma 3's kind: the system text before the first user turn, roles that
    # must alternate, content as a string or a list of parts.
    "gemma": """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
""",
    # Mistral's kind: [INST] blocks, the system message folded into the first.
    "mistral": """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
""",
    # Phi-3's kind: no whitespace control at all (trim_blocks does the work).
    "phi3": """{% for message in messages %}
{% if message['role'] == 'system' %}
{{'<|system|>
' + message['content'] + '<|end|>
'}}
{% elif message['role'] == 'user' %}
{{'<|user|>
' + message['content'] + '<|end|>
'}}
{% elif message['role'] == 'assistant' %}
{{'<|assistant|>
' + message['content'] + '<|end|>
'}}
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %}""",
    # Phi-4-mini's kind: one line, the role in the tag, a system message's
    # tools (when present and not None) between tool tags.
    "phi4_mini": "{% for message in messages %}{% if message['role'] == 'system' and "
                 "'tools' in message and message['tools'] is not none %}{{ '<|' + "
                 "message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] "
                 "+ '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
                 "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if "
                 "add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}"
                 "{% endif %}",
    # Qwen3's kind: a namespace found by a reversed loop, thinking blocks
    # split off the content, enable_thinking.
    "qwen3": """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "system" %}
        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
""",
    # transformers' {% generation %} around what the assistant writes.
    "generation": """{% for m in messages %}
<|{{ m.role }}|>
{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|end|>{% endgeneration %}
{% else %}{{ m.content }}<|end|>
{% endif %}
{% endfor %}""",
    # The rest of the language.
    "features": """{# a comment #}
{%- macro greet(name, punct='!') -%}
Hello, {{ name | capitalize }}{{ punct }}
{%- endmacro -%}
{{ greet('ada') }} {{ greet(name='bob', punct='?') }}
{% set xs = [3, 1, 2] %}
sorted={{ xs | sort | join(',') }} rev={{ xs | sort(reverse=true) | list }} len={{ xs | length }}
sum={{ xs | sum }} max={{ xs | max }} min={{ xs | min }} first={{ xs | first }} last={{ xs | last }}
slice={{ xs[1:] }} {{ xs[::-1] }} {{ xs[-1] }} {{ 'héllo'[1:3] }} {{ 'abc'[::-1] }}
math={{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 * 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-7 }}
concat={{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2] }}
cmp={{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} {{ 'x' in 'xyz' }} {{ 2 not in xs }} {{ 'k' in {'k': 1} }}
logic={{ none or 'dflt' }} {{ 0 and 'never' }} {{ not none }} {{ 'y' if xs else 'n' }} [{{ 'y' if not xs }}]
tests={{ xs is sequence }} {{ 'a' is string }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ none is none }} {{ undefined_thing is defined }} {{ 1 is number }} {{ {} is mapping }} {{ 3 is sameas 3 }}
{% for k, v in data | dictsort %}{{ k }}={{ v }}{{ ', ' if not loop.last }}{% endfor %}

{% for k, v in data.items() %}[{{ loop.index }}/{{ loop.length }} {{ k }}:{{ v }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}]{% endfor %}

{% for x in range(10) if x is odd %}{% if x > 6 %}{% break %}{% endif %}{% if x == 3 %}{% continue %}{% endif %}{{ x }}({{ loop.revindex }}){% endfor %}

{% for x in [] %}never{% else %}empty loop{% endfor %}

{% for row in people | selectattr('age', 'gt', 30) %}{{ row.name }};{% endfor %} {{ people | map(attribute='name') | join('+') }} {{ people | rejectattr('age', 'gt', 30) | map(attribute='name') | list }}
{{ people | selectattr('admin') | map(attribute='name') | first }} {{ ['a', 'b', 'a'] | unique | list }} {{ [1, 2, 3] | select('odd') | list }}
{% set ns = namespace(total=0, names=[]) %}{% for p in people %}{% set ns.total = ns.total + p.age %}{% set ns.names = ns.names + [p.name | upper] %}{% endfor %}total={{ ns.total }} {{ ns.names }}
{% set block %}  inner {{ 1 + 1 }}  {% endset %}[{{ block }}] [{{ block | trim }}]
{{ data | tojson }} {{ people[0] | tojson(indent=2) }} {{ {'b': 1, 'a': [1, 2.5, none, true, 'ü"\\n']} | tojson(sort_keys=true) }}
{{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith(('x', 'lo')) }}
{{ 'hello world'.title() }}|{{ 'ABC'.lower() }}|{{ 'a-b-c'.replace('-', '+') }}|{{ 'banana'.count('a') }}|{{ 'banana'.find('n') }}|{{ '-'.join(['x', 'y']) }}|{{ {'a': 1}.get('a') }}|{{ {'a': 1}.get('z', 'none') }}
{{ 'text' | replace('t', 'T') }} {{ 'a\\nb' | indent(2) }} {{ 'a\\nb' | indent(2, true) }} {{ 3.7 | int }} {{ '12' | int + 1 }} {{ 2 | float }} {{ -3 | abs }} {{ 2.567 | round(1) }} {{ 'abc' | reverse }}
{{ undefined_thing | default('fallback') }} {{ '' | default('empty', true) }} {{ none | default('kept') }} {{ xs | string }} {{ {'a': 'b'} }} {{ none }} {{ true }} {{ [1, 'two', none] }}
{{ '%s has %d items, %.2f%% (%5s|%-4d|%03d|%x|%r)' % ('cart', 3, 12.5, 'ab', 7, 7, 255, 'q') }} {{ '%s-%s' | format('a', none) }} {{ '%d' % 3.9 }}
{{ '[%-6s|%.2s|%5s|%05s|%3r]' % ('héé', 'ünï', 'ö', 'ñ', 'é') }} {{ ('%s' % ('x' * 700)) | length }} {{ ('%700d' % 1) | length }} {{ '%9.3f|%-8.2e|' % (3.14159, 31415.9) }}
{% for p in people %}[{{ loop.cycle('odd', 'even') }} {{ loop.depth }}{{ loop.depth0 }} {{ loop.previtem.name if loop.previtem is defined }}]{% endfor %} {{ 'a{}b{}{x}{{c}}'.format(1, none, x='y') }} {{ '{1}{0}'.format('a', 2) }}
{{ '<b class="q">Tom & Jerry\\'s</b>' | e }} {{ 4 | escape }} {{ 'héllo wörld, 42_x “q” — go' | wordcount }}
{% filter upper %}loud {{ people | length }}{% endfilter %} {% filter replace('a', 'o') | trim %}  banana  {% endfilter %}
{% macro box(title, width=2) %}<{{ title }}:{{ width }}{% if caller is defined %}|{{ caller() }}{% endif %}>{% endmacro %}{{ box('plain') }} {% call box('t', 3) %}inside {{ 1 + 1 }}{% endcall %} {% macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}{% call(x, i) each(['p', 'q']) %}{{ i }}={{ x }};{% endcall %}
{% macro va(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{% for k, v in kwargs | dictsort %};{{ k }}={{ v }}{% endfor %}{% endmacro %}{{ va(1) }} {{ va(1, 3, 4, 'five') }} {{ va(1, z=0, b=9, y='x') }} [{{ 'ab' | center(7) }}|{{ 'ab' | center(6) }}|{{ 'héé' | center(8) }}|{{ 'long' | center(2) }}] {{ range(7) | batch(3) | list }} {{ range(7) | batch(3, 'x') | list }} {{ range(7) | slice(3) | list }} {{ range(8) | slice(3, 0) | list }} {{ (1, 'a') }} {{ (1,) }} {{ () }}
{% for n in [{'name': 'a', 'kids': [{'name': 'b', 'kids': []}, {'name': 'c', 'kids': [{'name': 'd'}]}]}, {'name': 'e'}] recursive %}({{ n.name }}{{ loop.depth }}/{{ loop.index }}{% if n.kids is defined %}[{{ loop(n.kids) }}]{% endif %}){% else %}none{% endfor %} {{ undefined_thing is iterable }} {{ undefined_thing is sequence }} {{ undefined_thing is mapping }}
{{ "it's" }} {{ 'say "hi"' }} {{ ['it\\'s'] }} {{ (1, 2) | list }} {{ dict(a=1, b='x') }} {{ 'x' 'y' }}
{%- if true %}
    left alone
{%+ endif %}
    {% if true %}indented block tag{% endif %}
{{- '  stripped both sides  ' -}}
  {#- a stripping comment -#}
  end
""",
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

CONVERSATIONS = {
    "system_two_turns": [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "  And 3+3?  "},
        {"role": "assistant", "content": "6.\n"},
    ],
    "one_turn": [
        {"role": "user", "content": "Say café, naïve, 日本語 and ✓."},
        {"role": "assistant", "content": "café, naïve, 日本語, ✓"},
    ],
    "open_question": [
        {"role": "user", "content": "Hello?"},
    ],
    "tools": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "21 degrees and sunny."},
    ],
    "thinking": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<think>\nlet me see\n</think>\n\nBecause."},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "<think>checking</think>Yes.",
         "reasoning_content": "I checked twice."},
    ],
    "parts": [
        {"role": "user", "content": [{"type": "text", "text": " Describe "},
                                     {"type": "image"}, {"type": "text", "text": "this."}]},
        {"role": "assistant", "content": "A cat."},
    ],
    "not_alternating": [
        {"role": "user", "content": "One."},
        {"role": "user", "content": "Two."},
    ],
    # Phi-4-mini's way of offering tools: a JSON string on the system
    # message (None: none).
    "system_tools": [
        {"role": "system", "content": "Call tools when they help.",
         "tools": "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"string\"}}]"},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "system", "content": "Be brief.", "tools": None},
    ],
}


def cases():
    env = environment()
    out = []
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    for name, source in TEMPLATES.items():
        if name == "features":
            contexts = [("features", {
                "data": {"b": 2, "a": 1, "c": "three"},
                "people": [{"name": "ann", "age": 31, "admin": False},
                           {"name": "bo", "age": 25, "admin": True},
                           {"name": "cy", "age": 40}]})]
        else:
            contexts = []
            for conv, messages in CONVERSATIONS.items():
                for gen in (False, True):
                    ctx = dict(special, messages=messages, add_generation_prompt=gen)
                    if conv == "tools":
                        ctx["tools"] = TOOLS
                    contexts.append((f"{conv}{'+gen' if gen else ''}", ctx))
            if name == "qwen3":
                contexts.append(("one_turn+gen+no_thinking",
                                 dict(special, messages=CONVERSATIONS["one_turn"],
                                      add_generation_prompt=True, enable_thinking=False)))
            if name == "llama3":
                contexts.append(("dated", dict(special, messages=CONVERSATIONS["one_turn"],
                                               date_string="1 Jan 2026")))
        for label, ctx in contexts:
            case = {"name": f"{name}/{label}", "template": source, "context": ctx}
            try:
                case["output"] = env.from_string(source).render(**ctx)
            except Exception as e:  # noqa: BLE001 (any error: Triad must fail too)
                case["error"] = str(e)
            out.append(case)
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases(), f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
