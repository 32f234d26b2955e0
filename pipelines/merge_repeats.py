#!/usr/bin/env python3
"""Merge R repeats of one generated Markdown section into one: `merge_repeats.py r1.md r2.md …`.

The repeats must be the same generator's output on repeated runs (pipelines/cluster-repro.sh's
rR/section.md): the same lines, tables and words, with different numbers. Per line, every number
that differs between the repeats is replaced by the median over the repeats and its range,
`12.6 (11.9–14.0)` (`2.45× (2.1–2.6×)`, `18 % (12–25 %)`, `-3 (-5 to 2)`), each value as its repeat printed it;
numbers equal in every repeat stay as they are. A ratio is thus the median of the ratios computed
within each repeat, not a ratio of medians. Table rows merge cell by cell, other lines sentence by
sentence; where the words differ (a verdict that goes one way in one repeat and the other way in
another), the variants are all printed with how many repeats each: `a (2 of 3 repeats) | b (1 of 3
repeats)`. Prints the merged section; a different number of lines or tables is one error line
naming the files and exit 2."""
import re
import sys

from spread import span  # pipelines/spread.py, beside this script

# A number as the generators print it, with its unit where the unit sticks to it (×, %).
NUM = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)(×|\s%)?(?!\w|\.\d)")


def value(tok):
    return float(tok.replace(",", ""))


def merge_numbers(parts):
    """parts: the same text from each repeat. The merged text, or None where the words differ."""
    splits = [NUM.split(p) for p in parts]
    # NUM has 2 groups: split gives [text, number, unit, text, number, unit, …, text]
    if len({len(s) for s in splits}) != 1:
        return None
    out = []
    n = len(splits[0])
    for i in range(n):
        col = [s[i] for s in splits]
        if i % 3 == 0:  # text between numbers
            if len(set(col)) != 1:
                return None
            out.append(col[0])
        elif i % 3 == 2:  # the unit of the number before it
            if len({c or "" for c in col}) != 1:
                return None
        else:
            unit = splits[0][i + 1] or ""
            if len(set(col)) == 1:
                out.append(col[0] + unit)
                continue
            srt = sorted(col, key=value)
            med = srt[(len(srt) - 1) // 2]
            u = unit.strip()
            sep = " " if unit.startswith(" ") else ""
            out.append(f"{med}{unit} {span(srt[0], srt[-1], sep + u)}")
    return "".join(out)


def variants(parts, r):
    seen = {}
    for p in parts:
        seen[p] = seen.get(p, 0) + 1
    return " | ".join(f"{p} ({c} of {r} repeats)" for p, c in seen.items())


def merge_line(lines):
    r = len(lines)
    if len(set(lines)) == 1:
        return lines[0]
    m = merge_numbers(lines)
    if m is not None:
        return m
    if all(ln.startswith("|") and ln.endswith("|") for ln in lines):
        cells = [[c.strip() for c in ln[1:-1].split("|")] for ln in lines]
        if len({len(c) for c in cells}) == 1:
            out = []
            for col in zip(*cells):
                mc = merge_numbers(list(col))
                out.append(mc if mc is not None else " / ".join(dict.fromkeys(col)))
            return "| " + " | ".join(out) + " |"
    # Sentence by sentence (". " ends one), the bullet's head kept.
    sents = [re.split(r"(?<=\.) (?=[A-Z(])", ln) for ln in lines]
    if len({len(s) for s in sents}) != 1:
        return variants(lines, r)
    out = []
    for col in zip(*sents):
        mc = merge_numbers(list(col)) if len(set(col)) > 1 else col[0]
        out.append(mc if mc is not None else variants(list(col), r))
    return " ".join(out)


def main(paths):
    texts = []
    for p in paths:
        try:
            texts.append(open(p, encoding="utf-8").read().split("\n"))
        except OSError as e:
            sys.exit(f"merge_repeats.py: {p}: {e.strerror}")
    if len({len(t) for t in texts}) != 1:
        print(f"merge_repeats.py: {', '.join(paths)}: the repeats have different numbers of lines "
              f"({', '.join(str(len(t)) for t in texts)}): not one generator's output", file=sys.stderr)
        sys.exit(2)
    print("\n".join(merge_line(list(ls)) for ls in zip(*texts)), end="")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: merge_repeats.py REPEAT.md [REPEAT.md …]")
    main(sys.argv[1:])
