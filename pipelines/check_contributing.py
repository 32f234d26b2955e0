#!/usr/bin/env python3
"""docs/CONTRIBUTING.md's walk-through, executed (`make check-contributing`, run by make test).

The page's worked example adds a toy sparse allreduce, `topk-ring`. Each step that changes
the tree is a fenced block preceded by a marker comment:

    <!-- walkthrough: create PATH -->                 the block is the whole new file
    <!-- walkthrough: insert PATH before "TEXT" -->   the block goes above the one line that
    <!-- walkthrough: insert PATH after "TEXT" -->    starts with TEXT (after: below it)

This script applies them, exactly as written, to a copy of the tree (the tracked and
untracked-but-not-ignored files, kept in target/contributing-tree so a second run compiles
only what changed), counts the files the walk-through touches (at most MAX_FILES), then in
the copy checks the formatting and runs the collectives' tests (the algorithm list, the
docs table, the traffic and conservation properties over every sparse algorithm) and the new
test file. The copy builds in this checkout's target directory, so the dependencies are
not compiled again; its own crates get another version (VERSION), so their artifacts never
take the place of this checkout's (cargo names a workspace crate's artifacts by its name and
version, not by its path).

Exit 1 with the reason on any failure: a marker whose anchor is missing or not unique, more
files than MAX_FILES, a formatting difference, a test that fails. Stdlib only."""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "CONTRIBUTING.md")
COPY = os.path.join(ROOT, "target", "contributing-tree")
MAX_FILES = 4
VERSION = "0.1.0-walkthrough"
OPT_LEVEL = 1
MARK = re.compile(r'<!-- walkthrough: (create|insert) (\S+)(?: (before|after) "(.*)")? -->')


def fail(msg):
    print(f"check-contributing: {msg}", file=sys.stderr)
    sys.exit(1)


def steps(text):
    """The (action, path, where, anchor, block) of every marker, in page order."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = MARK.search(line)
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        if j == len(lines):
            fail(f"docs/CONTRIBUTING.md:{i + 1}: a marker with no code block after it")
        indent = lines[j][: len(lines[j]) - len(lines[j].lstrip())]
        k = j + 1
        while k < len(lines) and lines[k].strip() != "```":
            k += 1
        block = [l[len(indent):] if l.startswith(indent) else l.lstrip() for l in lines[j + 1:k]]
        action, path, where, anchor = m.groups()
        if action == "insert" and not where:
            fail(f"docs/CONTRIBUTING.md:{i + 1}: insert needs before \"…\" or after \"…\"")
        out.append((action, path, where, anchor, "\n".join(block) + "\n", i + 1))
    return out


def copy_tree():
    """The tree as git sees it (tracked, and untracked files that are not ignored) in COPY,
    modification times kept so cargo compiles only what changed since the last run."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    files = {f for f in files if f and os.path.isfile(os.path.join(ROOT, f))}
    for dirpath, _, names in os.walk(COPY, topdown=False):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), COPY)
            if rel not in files:
                os.remove(os.path.join(dirpath, n))
        if dirpath != COPY and not os.listdir(dirpath):
            os.rmdir(dirpath)
    for f in sorted(files):
        src, dst = os.path.join(ROOT, f), os.path.join(COPY, f)
        s = os.stat(src)
        try:
            d = os.stat(dst)
            if d.st_size == s.st_size and int(d.st_mtime) == int(s.st_mtime):
                continue
        except FileNotFoundError:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)


def apply(step):
    action, path, where, anchor, block, at = step
    dst = os.path.join(COPY, path)
    if action == "create":
        if os.path.exists(dst):
            fail(f"docs/CONTRIBUTING.md:{at}: {path} exists already")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w") as f:
            f.write(block)
        return
    if not os.path.exists(dst):
        fail(f"docs/CONTRIBUTING.md:{at}: {path} does not exist")
    with open(dst) as f:
        lines = f.read().split("\n")
    hits = [i for i, l in enumerate(lines) if l.startswith(anchor)]
    if len(hits) != 1:
        fail(f"docs/CONTRIBUTING.md:{at}: {len(hits)} lines of {path} start with {anchor!r} (want 1)")
    i = hits[0] + (1 if where == "after" else 0)
    lines[i:i] = block.rstrip("\n").split("\n")
    with open(dst, "w") as f:
        f.write("\n".join(lines))
    # The copy's file is newer than the checkout's now: the next run copies it back.


def set_version():
    """The copy's workspace crates as VERSION (their `version.workspace = true`)."""
    path = os.path.join(COPY, "Cargo.toml")
    with open(path) as f:
        text = f.read()
    new, n = re.subn(r'(\[workspace\.package\]\s*\nversion\s*=\s*)"[^"]*"', r'\g<1>"' + VERSION + '"', text)
    if n != 1:
        fail("Cargo.toml: no [workspace.package] version to set")
    # The copy's own crates at opt-level 1: they compile in a third of release's time and
    # the tests run at nearly its speed; the dependencies keep release's (and its artifacts).
    crates = re.findall(r'^(gradkit-[a-z-]+) = \{ path', new, re.M)
    for c in crates:
        new += f'\n[profile.release.package.{c}]\nopt-level = {OPT_LEVEL}\n'
    with open(path, "w") as f:
        f.write(new)


def run(cmd, env=None):
    print("check-contributing: $ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=COPY, env=env)
    if r.returncode != 0:
        fail(f"`{' '.join(cmd)}` failed in {os.path.relpath(COPY, ROOT)} (exit {r.returncode})")


def main():
    with open(PAGE) as f:
        todo = steps(f.read())
    if not todo:
        fail("docs/CONTRIBUTING.md has no walkthrough markers")
    os.makedirs(COPY, exist_ok=True)
    copy_tree()
    for s in todo:
        apply(s)
    set_version()
    touched = sorted({s[1] for s in todo})
    print(f"check-contributing: the walk-through touches {len(touched)} files: {', '.join(touched)}")
    if len(touched) > MAX_FILES:
        fail(f"{len(touched)} files, more than {MAX_FILES}: {', '.join(touched)}")
    tests = [os.path.splitext(os.path.basename(p))[0] for p in touched
             if re.match(r"lib/collectives/tests/[^/]+\.rs$", p)]
    if not tests:
        fail("the walk-through adds no test file under lib/collectives/tests/")
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(ROOT, "target"))
    cargo = os.environ.get("CARGO", "cargo")
    run([cargo, "fmt", "--all", "--", "--check"], env)
    # Not --locked: the lock file records the workspace crates' versions (VERSION now); the
    # dependencies' stay as locked, and --offline fetches nothing.
    cmd = [cargo, "test", "--release", "--offline", "--workspace", "--test", "collectives"]
    for t in tests:
        cmd += ["--test", t]
    run(cmd, env)
    print("check-contributing: the walk-through builds and its tests pass")


if __name__ == "__main__":
    main()
