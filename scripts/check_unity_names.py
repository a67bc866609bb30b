#!/usr/bin/env python3
"""Names a unity build would join: helpers defined in anonymous namespaces
(functions, types, aliases, constants) that two sources of one target both
define.

A unity build compiles a target's sources several to a translation unit, so
their anonymous namespaces become one. Two definitions of one name then
either fail to compile (the same signature, a type twice) or, worse, form an
overload set, where a later file's call may take an earlier file's helper
without a word. Each such name must be unique across the target's sources.

Usage: check_unity_names.py SOURCE...   (exit 1, naming each clash and its
files, when a name is defined in two of them)
"""
import re
import sys

DECL_KEYWORDS = {"return", "if", "for", "while", "switch", "else", "do", "case", "throw",
                 "delete", "new", "sizeof", "static_assert", "operator", "decltype"}
TYPE_RE = re.compile(r"^(?:template\s*<.*>\s*)?(?:struct|class|union|enum(?:\s+class)?)\s+(\w+)")
ALIAS_RE = re.compile(r"^using\s+(\w+)\s*=\s*(.*?);?$")
USING_DECL_RE = re.compile(r"^using\s+(?!namespace\b)([\w:]*::(\w+))\s*;")
FUNC_RE = re.compile(r"^(?:template\s*<.*>\s*)?[\w:<>,*&\s]*?[\w>*&]\s+[*&]*(\w+)\s*\(")
VAR_RE = re.compile(r"^(?:static\s+|inline\s+)*(?:constexpr|const)\s+[\w:<>,\s*&]*?\b(\w+)\s*(?:=|\{|\[|;)")
VAR_LIST_RE = re.compile(r",\s*(\w+)\s*=")


def strip(text):
    """The source with comments, string and character literals blanked."""
    out = re.sub(r'R"(\w*)\((?:.|\n)*?\)\1"', '""', text)
    out = re.sub(r"//[^\n]*", "", out)
    out = re.sub(r"/\*(?:.|\n)*?\*/", lambda m: "\n" * m.group(0).count("\n"), out)
    out = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', out)
    return re.sub(r"'(?:\\.|[^'\\\n])*'", "''", out)


def anonymous_names(path):
    """The names a file declares directly inside an anonymous namespace, each
    with what it stands for: the file itself for a definition (two are never
    the same), the target of an alias or a using-declaration (two naming the
    same one are the same, and a unity build takes both)."""
    with open(path, encoding="utf-8") as f:
        lines = strip(f.read()).split("\n")
    names = {}
    scopes = []  # "anon", "named" or "block" for each open brace
    for line in lines:
        s = line.strip()
        if s and scopes and scopes[-1] == "anon" and not s.startswith(("#", "}")):
            first = s.split("(")[0].split()
            if not first or first[0] not in DECL_KEYWORDS:
                alias = ALIAS_RE.match(s)
                using = USING_DECL_RE.match(s)
                if alias:
                    names[alias.group(1)] = "= " + " ".join(alias.group(2).split())
                elif using:
                    # (Within namespace triad, triad::x and x name one thing.)
                    names[using.group(2)] = "using " + re.sub(r"^(::)?(triad::)?", "",
                                                              using.group(1))
                else:
                    for regex in (TYPE_RE, VAR_RE, FUNC_RE):
                        m = regex.match(s)
                        if m and m.group(1) not in DECL_KEYWORDS:
                            names[m.group(1)] = path
                            if regex is VAR_RE:
                                for n in VAR_LIST_RE.findall(s):
                                    names[n] = path
                            break
        for m in re.finditer(r"\bnamespace\s*([\w:]*)\s*\{|[{}]", line):
            tok = m.group(0)
            if tok == "}":
                if scopes:
                    scopes.pop()
            elif tok == "{":
                scopes.append("block")
            else:
                scopes.append("named" if m.group(1) else "anon")
    return names


def main(paths):
    where = {}  # name -> {what it stands for -> files}
    for path in paths:
        for name, meaning in anonymous_names(path).items():
            where.setdefault(name, {}).setdefault(meaning, []).append(path)
    clashes = {n: sorted(p for ps in m.values() for p in ps)
               for n, m in where.items() if len(m) > 1}
    for name in sorted(clashes):
        print(f"'{name}' is defined in anonymous namespaces of {len(clashes[name])} files: "
              + ", ".join(clashes[name]))
    if clashes:
        print(f"{len(clashes)} name(s) would meet in a unity build: give each file's helper "
              "a name of its own")
        return 1
    print(f"{len(paths)} files, {len(where)} names in anonymous namespaces, none defined twice")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
