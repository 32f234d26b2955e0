#!/usr/bin/env python3
"""The shape of the code, checked (docs/CONTRIBUTING.md, "Shape of the code"):

1. no function in lib/ or tools/ longer than 80 lines, except those listed in
   pipelines/shape-allow.txt (each with why; the list may only shrink);
2. no import cycle between the modules of one crate (`crate::a` used in module b and
   `crate::b` in module a, or a longer loop), the crate root aside.

Exit 1 with one line per finding. Stdlib only; run by `make test`."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX = 80
FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')


def blank(text):
    """The text with string, char and comment contents blanked (newlines kept), so that the
    braces left are the code's."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == 'r' and re.match(r'r#*"', text[i:i + 8]) and not (i and (text[i - 1].isalnum() or text[i - 1] == '_')):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            j += 1
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == "'":
            m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", text[i:])
            if m:
                out.append(' ' * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def strip(line):
    return line


def functions(path):
    """(name, first line, length) of every function with a body in a Rust file."""
    text = open(path, encoding='utf-8').read()
    lines = text.split('\n')
    code = blank(text).split('\n')
    out = []
    for i, line in enumerate(lines):
        m = FN.match(code[i])
        if not m or code[i].rstrip().endswith(';'):
            continue
        depth, started, j = 0, False, i
        while j < len(code):
            for ch in code[j]:
                if ch == '{':
                    depth += 1
                    started = True
                elif ch == '}':
                    depth -= 1
            if started and depth <= 0:
                break
            if not started and code[j].rstrip().endswith(';'):
                break
            j += 1
        if started:
            out.append((m.group(7), i + 1, j - i + 1))
    return out


def rust_files(top):
    for dp, dn, fn in os.walk(top):
        dn[:] = [d for d in dn if d not in ('target', 'tests', 'benches', 'examples')]
        for f in sorted(fn):
            if f.endswith('.rs'):
                yield os.path.join(dp, f)


def module_of(crate_src, path):
    rel = os.path.relpath(path, crate_src)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ('mod', 'lib', 'main'):
        parts = parts[:-1]
    return '::'.join(parts)


def cycles(crate_src):
    """Module → modules it names through `crate::` (first path segment below the root, or the
    whole path for nested modules), and the cycles among them."""
    mods = {}
    for path in rust_files(crate_src):
        mods[module_of(crate_src, path)] = open(path, encoding='utf-8').read()
    top = {m.split('::')[0] for m in mods if m}
    edges = {}
    for m, text in mods.items():
        if not m:
            continue
        src = m.split('::')[0]
        code = blank(text)
        used = set(re.findall(r'crate::(\w+)', code))
        for grp in re.findall(r'crate::\{([^}]*)\}', code):
            used |= set(re.findall(r'(\w+)', grp))
        for u in used:
            if u in top and u != src:
                edges.setdefault(src, set()).add(u)
    found = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            if a < b and a in edges.get(b, set()):
                found.append(f'{a} <-> {b}')
    return found


def findings(root):
    allow = {}
    allow_path = os.path.join(root, 'pipelines', 'shape-allow.txt')
    for line in (open(allow_path, encoding='utf-8') if os.path.exists(allow_path) else []):
        line = line.split('#')[0].strip()
        if line:
            allow[line.split()[0]] = True
    bad = []
    seen = set()
    for top in ('lib', 'tools'):
        if not os.path.isdir(os.path.join(root, top)):
            continue
        for crate in sorted(os.listdir(os.path.join(root, top))):
            src = os.path.join(root, top, crate, 'src')
            if not os.path.isdir(src):
                continue
            for path in rust_files(src):
                rel = os.path.relpath(path, root)
                for name, line, n in functions(path):
                    key = f'{rel}::{name}'
                    if n > MAX:
                        seen.add(key)
                        if key not in allow:
                            bad.append(f'{rel}:{line}: fn {name} is {n} lines (at most {MAX}: split it)')
            for c in cycles(src):
                bad.append(f'{top}/{crate}: modules import each other: {c}')
    for key in sorted(set(allow) - seen):
        bad.append(f'pipelines/shape-allow.txt: {key} is no longer over {MAX} lines: remove it from the list')
    return bad


def self_test():
    """The check finds what it is for: a planted long function, a planted cycle, braces in
    strings and comments not counted."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, 'lib', 'x', 'src')
        os.makedirs(src)
        long_fn = 'fn long() {\n' + '    let _ = 1;\n' * 80 + '}\n'
        short = 'fn short() {\n    let s = "}}}}";\n    // }\n    let c = \'{\';\n}\n'
        open(os.path.join(src, 'a.rs'), 'w').write('use crate::b::f;\n' + long_fn + short)
        open(os.path.join(src, 'b.rs'), 'w').write('pub fn f() {\n    crate::a::g();\n}\n')
        got = findings(d)
        assert any('fn long is 82 lines' in g for g in got), got
        assert any('a <-> b' in g for g in got), got
        assert not any('short' in g for g in got), got
        assert len(got) == 2, got


def main():
    self_test()
    bad = findings(ROOT)
    for b in bad:
        print(b)
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
