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


def strip(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split('//')[0]


def functions(path):
    """(name, first line, length) of every function with a body in a Rust file."""
    lines = open(path, encoding='utf-8').read().split('\n')
    raw = False
    out = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m or line.rstrip().endswith(';'):
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            s = strip(lines[j])
            # raw strings (help text) hold braces: skip to their end
            if 'r#"' in lines[j] and '"#' not in lines[j].split('r#"', 1)[1]:
                raw = True
            if raw:
                if '"#' in lines[j] and 'r#"' not in lines[j].split('"#')[-2:][0]:
                    raw = False
                j += 1
                continue
            for ch in s:
                if ch == '{':
                    depth += 1
                    started = True
                elif ch == '}':
                    depth -= 1
            if started and depth <= 0:
                break
            if not started and s.rstrip().endswith(';'):
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
        code = '\n'.join(strip(l) for l in text.split('\n') if not l.strip().startswith('//'))
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


def main():
    allow = {}
    allow_path = os.path.join(ROOT, 'pipelines', 'shape-allow.txt')
    for line in open(allow_path, encoding='utf-8'):
        line = line.split('#')[0].strip()
        if line:
            allow[line.split()[0]] = True
    bad = []
    seen = set()
    for top in ('lib', 'tools'):
        for crate in sorted(os.listdir(os.path.join(ROOT, top))):
            src = os.path.join(ROOT, top, crate, 'src')
            if not os.path.isdir(src):
                continue
            for path in rust_files(src):
                rel = os.path.relpath(path, ROOT)
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
    for b in bad:
        print(b)
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
