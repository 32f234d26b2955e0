//! Every example command line gradkit shows a user is run here, so that none can rot:
//!
//! - the `Examples:` / `Example:` sections of every tool's `--help` and of each subcommand's
//!   `--help` (the text clap prints, wrapped as a user sees it: a line wrapped in the middle
//!   of a command fails here as it would when pasted);
//! - the ```sh blocks of README.md and docs/*.md, and the `$ ` lines of their ```console
//!   transcripts.
//!
//! Each source (one tool's help pages, one Markdown file) runs in a fresh temporary directory,
//! its commands in order, so earlier ones create the files later ones read. The directory
//! starts with a few fixtures an example may read without making them (`trace.parquet`, a
//! small dense 4-rank trace; PyTorch/NumPy dumps for `gradtrace import`: `dumps/`,
//! `step*_rank*.safetensors`, `grads.npz`; and `rank0.parquet`, `rank1.parquet`). The six
//! binaries are found next to this one (`target/release/` under `make test`) and put first on
//! PATH, and `$B` names their directory (README's `B=target/release` is not run).
//!
//! A command is skipped when it needs what a test machine may lack or must not do: `mpirun`,
//! `make`, the namespace cluster, `torchrun` (PyTorch), Python where the project's venv
//! (`make deps`) is missing — or when its line carries the marker comment `# untested: <why>`.
//! `python -m …`/`python -c …` run the venv's Python, with the repository's package (python/) on
//! PYTHONPATH; `python SCRIPT.py` (a script of the user's) is skipped. Every other command must exit 0 (with `pipefail`, so every stage of a
//! pipeline counts) and must not write Parquet to stdout (`PAR1` at the start of stdout: a
//! user's terminal would have refused it).
//!
//! Sizes are shrunk so the whole test takes seconds, not the minutes the examples take at
//! their real sizes: `--steps N` past 3 becomes 3 + N/100 (so 300 → 6, and a resumed run with
//! a larger --steps still trains further), `--scale` ≤ 0.01, `--vocab` ≤ 2000, `--tokens` ≤ 20000,
//! `--iters` ≤ 2, `--sizes` → 1K:16K. The command run is printed next to the one shown when
//! they differ.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOOLS: [&str; 6] = [
    "gradtrace",
    "gradselect",
    "gradpartition",
    "gradallreduce",
    "gradtrain",
    "gradreport",
];

/// One command as shown (`shown`, possibly several lines joined by `\` or a shell construct)
/// and where it was found.
#[derive(Clone, Debug)]
struct Example {
    source: String,
    shown: String,
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_gradreport"))
        .parent()
        .expect("the binary has a directory")
        .to_path_buf()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

fn help(tool: &str, sub: Option<&str>) -> String {
    let mut c = Command::new(bin_dir().join(tool));
    c.args(sub).arg("--help");
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
    assert!(out.status.success(), "{tool} {sub:?} --help failed");
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands listed under `Commands:` (without `help`).
fn subcommands(top: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut inside = false;
    for line in top.lines() {
        if line.trim_end() == "Commands:" {
            inside = true;
            continue;
        }
        if inside {
            if !line.starts_with("  ") {
                break;
            }
            // A long description wraps onto lines indented past the name column.
            if line.starts_with("   ") {
                continue;
            }
            if let Some(name) = line.split_whitespace().next() {
                if name != "help" {
                    v.push(name.to_string());
                }
            }
        }
    }
    v
}

/// The example lines of one help page: what follows `Examples:` or `Example:` (a line of its
/// own, not indented), up to the next line that is not indented.
fn help_example_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim_end();
        if t == "Examples:" || t == "Example:" {
            inside = true;
            continue;
        }
        if inside {
            if !t.is_empty() && !t.starts_with(' ') {
                inside = false;
                continue;
            }
            out.push(t.trim().to_string());
        }
    }
    out
}

/// Joins lines into commands: a line ending in `\`, `|`, `&&` or `||` continues on the next,
/// and so does an open `for`/`while`/`if` (until its `done`/`fi`). Comment lines between
/// commands and blank lines are dropped.
fn commands(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    for line in lines {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if !cur.is_empty() {
            cur.push('\n');
        }
        cur.push_str(t);
        let first = t.split_whitespace().next().unwrap_or("");
        if matches!(first, "for" | "while" | "until" | "if") {
            depth += 1;
        }
        if matches!(first, "done" | "fi" | "done;" | "fi;") {
            depth -= 1;
        }
        let code = strip_comment(t);
        let open = code.ends_with('\\')
            || code.ends_with('|')
            || code.ends_with("&&")
            || code.ends_with("||");
        if depth <= 0 && !open {
            out.push(std::mem::take(&mut cur));
            depth = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A line without its trailing `# comment` (a `#` after a blank, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].trim_end(),
            _ => {}
        }
        prev = c;
    }
    line.trim_end()
}

/// The example lines of a Markdown file: the lines of ```sh/```bash blocks, and the `$ `
/// lines (with their continuations) of ```console blocks.
fn markdown_example_lines(text: &str) -> Vec<String> {
    #[derive(PartialEq)]
    enum Block {
        None,
        Shell,
        Console,
        Other,
    }
    let mut block = Block::None;
    let mut out = Vec::new();
    let mut continuing = false;
    for line in text.lines() {
        let t = line.trim_end();
        if let Some(info) = t.trim_start().strip_prefix("```") {
            block = match (&block, info.trim()) {
                (Block::None, "sh" | "bash" | "shell") => Block::Shell,
                (Block::None, "console") => Block::Console,
                (Block::None, _) => Block::Other,
                _ => {
                    // A block ends: so does any command in it.
                    out.push(String::new());
                    Block::None
                }
            };
            continuing = false;
            continue;
        }
        match block {
            Block::Shell => out.push(t.to_string()),
            Block::Console => {
                if let Some(cmd) = t.strip_prefix("$ ") {
                    out.push(cmd.to_string());
                    continuing = strip_comment(cmd).ends_with('\\');
                } else if continuing {
                    out.push(t.to_string());
                    continuing = strip_comment(t).ends_with('\\');
                } else {
                    out.push(String::new());
                }
            }
            _ => {}
        }
    }
    out
}

/// Why a command is not run, if it is not.
fn skip_reason(cmd: &str) -> Option<&'static str> {
    let words: Vec<&str> = cmd
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | '|' | '(' | ')'))
        .collect();
    if cmd.contains("# untested") {
        return Some("marked `# untested`");
    }
    if words.contains(&"make") {
        return Some("runs make");
    }
    if words.contains(&"mpirun") {
        return Some("needs mpirun");
    }
    if cmd.contains("cluster") {
        return Some("needs the namespace cluster (root)");
    }
    if words.contains(&"torchrun") {
        return Some("needs PyTorch");
    }
    if cmd.contains("python") {
        if venv_bin().is_none() {
            return Some("needs Python: the project's venv (make deps)");
        }
        // `python -m MODULE` and `python -c CODE` run; `python SCRIPT.py` is the user's own.
        let runs_module = words
            .windows(2)
            .all(|w| !w[0].starts_with("python") || matches!(w[1], "-m" | "-c"));
        if !runs_module {
            return Some("runs a Python script of the user's");
        }
    }
    // `B=target/release`: $B is set to the binaries' directory instead.
    let t = cmd.trim();
    if !t.contains(' ') && t.split_once('=').is_some_and(|(v, _)| v == "B") {
        return Some("sets $B (set by the test)");
    }
    None
}

/// The project's venv (`make deps`): `python` in a documented command runs there, with the
/// repository's Python package (python/) importable.
fn venv_bin() -> Option<PathBuf> {
    let bin = repo_root().join(".venv/bin");
    bin.join("python").is_file().then_some(bin)
}

/// `--steps N` past 3 becomes 3 + N/100: small, and a larger N stays larger (a run resumed
/// with a larger --steps trains further).
fn shrink_steps(n: f64) -> f64 {
    if n <= 3.0 {
        n
    } else {
        (3.0 + (n / 100.0).floor()).min(n)
    }
}

/// Shrinks sizes: `--flag N` with N above `max` becomes `max` (see the module doc), `--steps`
/// as [`shrink_steps`] says, `--sizes` to 1K:16K.
fn shrink(cmd: &str) -> String {
    let caps: &[(&str, f64)] = &[
        ("--steps", f64::NAN),
        ("--scale", 0.01),
        ("--vocab", 2000.0),
        ("--tokens", 20000.0),
        ("--iters", 2.0),
    ];
    let mut out = String::new();
    let mut words = cmd.split_inclusive(char::is_whitespace).peekable();
    while let Some(w) = words.next() {
        out.push_str(w);
        let flag = w.trim_end();
        let cap = caps.iter().find(|(f, _)| *f == flag).map(|c| c.1);
        let sizes = flag == "--sizes";
        if cap.is_none() && !sizes {
            continue;
        }
        let Some(v) = words.next() else { break };
        let (value, ws) = v.split_at(v.trim_end().len());
        let new = match (cap, value.parse::<f64>()) {
            (Some(c), Ok(x)) if c.is_nan() => shrink_steps(x).to_string(),
            (Some(c), Ok(x)) if x > c => c.to_string(),
            (None, _) => "1K:16K".to_string(),
            _ => value.to_string(),
        };
        out.push_str(&new);
        out.push_str(ws);
    }
    out
}

/// A tiny safetensors file: one F32 tensor per name, shape [len].
fn safetensors(tensors: &[(&str, Vec<f32>)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut off = 0usize;
    for (i, (name, v)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{off},{}]}}",
            v.len(),
            off + 4 * v.len()
        ));
        off += 4 * v.len();
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    for (_, v) in tensors {
        for x in v {
            b.extend_from_slice(&x.to_le_bytes());
        }
    }
    b
}

/// A .npy file of one f32 vector.
fn npy(v: &[f32]) -> Vec<u8> {
    let mut h = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        v.len()
    );
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// An uncompressed zip (what numpy.savez writes): the .npz of `files`.
fn npz(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in files {
        let (crc, size, offset) = (crc32(data), data.len() as u32, out.len() as u32);
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&0u16.to_le_bytes()); // stored
            v.extend_from_slice(&0u32.to_le_bytes()); // time, date
            v.extend_from_slice(&crc.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // version made by
        common(&mut central);
        central.extend_from_slice(&[0u8; 6]); // comment len, disk, internal attrs
        central.extend_from_slice(&0u32.to_le_bytes()); // external attrs
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let (cd_off, cd_len) = (out.len() as u32, central.len() as u32);
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    let n = files.len() as u16;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&cd_len.to_le_bytes());
    out.extend_from_slice(&cd_off.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// The files an example may read without making them (see the module doc).
fn fixtures(dir: &Path) {
    let run = |args: &[&str]| {
        let st = Command::new(bin_dir().join(args[0]))
            .args(&args[1..])
            .current_dir(dir)
            .stdin(Stdio::null())
            .status()
            .expect("run a fixture command");
        assert!(st.success(), "fixture command failed: {}", args.join(" "));
    };
    run(&[
        "gradtrace",
        "synthetic",
        "--shape",
        "mlp",
        "--scale",
        "0.1",
        "--ranks",
        "4",
        "--steps",
        "3",
        "--seed",
        "1",
        "-q",
        "-o",
        "trace.parquet",
    ]);
    let grad = |step: usize, rank: usize, n: usize, salt: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + step * 3 + rank) % 11) as f32 * 0.01 - 0.05 + salt)
            .collect()
    };
    std::fs::create_dir_all(dir.join("dumps")).unwrap();
    for step in 0..2 {
        for rank in 0..2 {
            let st = safetensors(&[
                ("fc.weight", grad(step, rank, 32, 0.0)),
                ("fc.bias", grad(step, rank, 4, 0.001)),
            ]);
            let name = format!("step{step}_rank{rank}.safetensors");
            std::fs::write(dir.join("dumps").join(&name), &st).unwrap();
            std::fs::write(dir.join(&name), &st).unwrap();
        }
    }
    let z = npz(&[
        ("fc.weight.npy", npy(&grad(0, 0, 32, 0.0))),
        ("fc.bias.npy", npy(&grad(0, 0, 4, 0.001))),
    ]);
    std::fs::write(dir.join("grads.npz"), z).unwrap();
    for rank in 0..2 {
        let files: Vec<String> = (0..2)
            .map(|s| format!("dumps/step{s}_rank{rank}.safetensors"))
            .collect();
        let mut args = vec!["gradtrace", "import"];
        args.extend(files.iter().map(String::as_str));
        let out = format!("rank{rank}.parquet");
        args.extend(["-o", &out]);
        run(&args);
    }
}

/// Runs one command with bash in `dir`; Err(report) unless it exits 0 within the limit and
/// keeps Parquet off stdout.
fn run_example(dir: &Path, ex: &Example, cmd: &str) -> Result<Duration, String> {
    let bin = bin_dir();
    let venv = venv_bin().map(|v| format!("{}:", v.display()));
    let path = format!(
        "{}:{}{}",
        bin.display(),
        venv.unwrap_or_default(),
        std::env::var("PATH").unwrap_or_default()
    );
    let stdout_file = dir.join(".example-stdout");
    let stderr_file = dir.join(".example-stderr");
    let mut child = {
        use std::os::unix::process::CommandExt;
        Command::new("bash")
            .args(["-o", "pipefail", "-c", cmd])
            .current_dir(dir)
            .env("PATH", path)
            .env("B", &bin)
            .env("PYTHONPATH", repo_root().join("python"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_file).unwrap())
            .stderr(std::fs::File::create(&stderr_file).unwrap())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start bash: {e}"))?
    };
    let t0 = Instant::now();
    let limit = Duration::from_secs(300);
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        if t0.elapsed() > limit {
            // The whole pipeline: bash leads its process group.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = t0.elapsed();
    let stdout = std::fs::read(&stdout_file).unwrap_or_default();
    let stderr =
        String::from_utf8_lossy(&std::fs::read(&stderr_file).unwrap_or_default()).into_owned();
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    let shown = if cmd == ex.shown {
        String::new()
    } else {
        format!(
            "\n  run as (sizes shrunk):\n    {}",
            cmd.replace('\n', "\n    ")
        )
    };
    let what = format!(
        "example from {}:\n    {}{shown}\n  in {}",
        ex.source,
        ex.shown.replace('\n', "\n    "),
        dir.display()
    );
    match status {
        None => Err(format!(
            "{what}\n  did not finish in {} s\n  stderr:\n{}",
            limit.as_secs(),
            tail(&stderr)
        )),
        Some(st) if !st.success() => Err(format!(
            "{what}\n  exited with {st}\n  stderr:\n{}",
            tail(&stderr)
        )),
        Some(_) if stdout.starts_with(b"PAR1") => Err(format!(
            "{what}\n  wrote Parquet to stdout: pasted in a terminal it would be refused (give -o FILE or pipe it)"
        )),
        Some(_) => Ok(elapsed),
    }
}

/// Every source with its examples, in order.
fn sources() -> Vec<(String, Vec<Example>)> {
    let mut v = Vec::new();
    let mk = |source: &str, lines: &[String]| -> Vec<Example> {
        commands(lines)
            .into_iter()
            .map(|shown| Example {
                source: source.to_string(),
                shown,
            })
            .collect()
    };
    for tool in TOOLS {
        let top = help(tool, None);
        let mut exs = mk(&format!("{tool} --help"), &help_example_lines(&top));
        for sub in subcommands(&top) {
            let text = help(tool, Some(&sub));
            exs.extend(mk(
                &format!("{tool} {sub} --help"),
                &help_example_lines(&text),
            ));
        }
        v.push((format!("{tool} --help"), exs));
    }
    let root = repo_root();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    for p in docs {
        let name = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        let exs = mk(&name, &markdown_example_lines(&text));
        v.push((name, exs));
    }
    v
}

/// What one source's examples gave: how many ran, the skipped ones, the failures, and the
/// log lines (printed in the sources' order once all have run).
#[derive(Default)]
struct SourceRun {
    ran: usize,
    skipped: Vec<String>,
    failures: Vec<String>,
    log: Vec<String>,
}

/// Runs one source's examples in order, in a directory of their own with the fixtures.
fn run_source(examples: &[Example]) -> SourceRun {
    let dir = tempfile::Builder::new()
        .prefix("gradkit-examples-")
        .tempdir()
        .expect("temp dir");
    fixtures(dir.path());
    let mut r = SourceRun::default();
    for ex in examples {
        if let Some(why) = skip_reason(&ex.shown) {
            r.skipped.push(format!(
                "{}: {} ({why})",
                ex.source,
                ex.shown.replace('\n', " ")
            ));
            continue;
        }
        let cmd = shrink(&ex.shown);
        r.ran += 1;
        match run_example(dir.path(), ex, &cmd) {
            Ok(d) => r.log.push(format!(
                "ok {:>6.2} s  {}: {}",
                d.as_secs_f64(),
                ex.source,
                ex.shown.lines().next().unwrap_or("")
            )),
            Err(report) => {
                r.log.push(format!("FAILED {report}"));
                r.failures.push(report);
            }
        }
    }
    r
}

#[test]
fn every_example_runs() {
    let bin = bin_dir();
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| !bin.join(t).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "missing binaries {missing:?} in {}: build them all first (cargo build --release --workspace, as `make test` does)",
        bin.display()
    );
    // Filter: GRADKIT_EXAMPLES=substring runs only the sources whose name contains it.
    let only = std::env::var("GRADKIT_EXAMPLES").ok();
    let todo: Vec<(String, Vec<Example>)> = sources()
        .into_iter()
        .filter(|(name, _)| only.as_deref().is_none_or(|o| name.contains(o)))
        .collect();
    let t0 = Instant::now();
    // The sources are independent (each its own directory and fixtures; its examples in
    // order): a few at a time, as most of an example's time is spent starting processes.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Vec<SourceRun> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((_, examples)) = todo.get(i) else {
                            break mine;
                        };
                        mine.push((i, run_source(examples)));
                    }
                })
            })
            .collect();
        let mut all: Vec<(usize, SourceRun)> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("examples worker"))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, r)| r).collect()
    });
    let (mut ran, mut skipped, mut failures) = (0, Vec::new(), Vec::new());
    for r in done {
        ran += r.ran;
        skipped.extend(r.skipped);
        failures.extend(r.failures);
        for line in r.log {
            eprintln!("{line}");
        }
    }
    eprintln!(
        "{ran} examples run in {:.1} s, {} skipped:",
        t0.elapsed().as_secs_f64(),
        skipped.len()
    );
    for s in &skipped {
        eprintln!("  skipped {s}");
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} examples failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    if only.is_none() {
        // The extraction itself must keep finding the examples (a changed help layout would
        // otherwise make this test pass vacuously).
        assert!(ran >= 40, "only {ran} examples found");
    }
}

#[test]
fn extraction_rules() {
    let lines: Vec<String> = [
        "# a comment",
        "gradtrace synthetic --shape mlp \\",
        "  | gradtrace inspect",
        "",
        "for a in ring topka; do",
        "  echo $a",
        "done",
        "gradreport table m.parquet   # trailing comment",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = commands(&lines);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(c[0].ends_with("| gradtrace inspect"));
    assert!(c[1].starts_with("for") && c[1].ends_with("done"));
    assert_eq!(
        shrink("gradtrain --steps 300 --lr 0.1 --sizes 1K:64M --scale 0.005"),
        "gradtrain --steps 6 --lr 0.1 --sizes 1K:16K --scale 0.005"
    );
    let md = "```sh\na \\\n  b\n```\n```console\n$ c\nout\n$ d \\\n  e\n```\n```\nf\n```\n";
    assert_eq!(
        commands(&markdown_example_lines(md)),
        vec!["a \\\nb", "c", "d \\\ne"]
    );
    assert_eq!(skip_reason("mpirun -np 4 gradtrain"), Some("needs mpirun"));
    assert_eq!(
        skip_reason("torchrun --nproc-per-node 2 -m gradkit.ddp_example"),
        Some("needs PyTorch")
    );
    assert_eq!(
        skip_reason("B=target/release"),
        Some("sets $B (set by the test)")
    );
    assert_eq!(skip_reason("gradtrace inspect t.parquet"), None);
    if venv_bin().is_some() {
        assert_eq!(skip_reason("python -m gradkit.demo -o run"), None);
        assert_eq!(
            skip_reason("python make_table.py | gradtrace cat - -o t.parquet"),
            Some("runs a Python script of the user's")
        );
    }
    assert_eq!(
        strip_comment("gradtrace synthetic --layers 'a#b' # note"),
        "gradtrace synthetic --layers 'a#b'"
    );
}
