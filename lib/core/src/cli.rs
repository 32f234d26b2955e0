//! The CLI layer every tool shares: input/output arguments, error reporting and exit codes,
//! human tables (Markdown, CSV, JSON) and progress on stderr.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::io::{Input, Output, ReadOptions};
use crate::process::launcher_var;
pub use crate::process::{
    launcher, launcher_rank, note_fmt, register_launcher, under_mpi_launcher, Launcher,
};

/// Positional input and `-o` output, as every table-to-table tool takes them.
#[derive(clap::Args, Clone, Debug)]
pub struct IoArgs {
    /// Input table (Parquet); `-` or absent reads stdin
    #[arg(value_name = "IN")]
    pub input: Option<PathBuf>,
    /// Output table (Parquet); absent writes stdout when it is not a terminal
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Accept NaN/Inf gradient values instead of stopping with an error
    #[arg(long)]
    pub allow_nonfinite: bool,
    /// No progress or summary on stderr
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

impl IoArgs {
    pub fn input(&self) -> Result<Input> {
        Input::from_arg(self.input.as_deref())
    }
    pub fn output(&self) -> Result<Output> {
        Output::from_arg(self.output.as_deref())
    }
    pub fn read_options(&self) -> ReadOptions {
        ReadOptions {
            allow_nonfinite: self.allow_nonfinite,
        }
    }
}

/// What a run kept of each gradient, for its default name: a density or an exact k (the one
/// type, [`crate::keep`], with `--density`'s range check and the k rule).
pub use crate::keep::Keep;

/// A run's default name in the metrics (`--run` absent): the algorithm or method and, where
/// it selects, what it kept, so two runs that differ in density never share a name:
/// `oktopk-d0.01`, `topk-k1000`, `ring`.
pub fn default_run_name(what: &str, keep: Option<Keep>) -> String {
    match keep {
        None => what.to_string(),
        Some(Keep::Density(d)) => format!("{what}-d{d}"),
        Some(Keep::K(k)) => format!("{what}-k{k}"),
    }
}

/// Says once, on the I/O rank, that `flag` was given an old spelling that is still taken
/// (`--exchange dense` for `ring`): one name per algorithm across the tools.
pub fn note_old_spelling(flag: &str, old: &str, new: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if old == new || launcher_rank() != 0 {
        return;
    }
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|s| s == flag) {
        said.push(flag.to_string());
        crate::noteln!(
            "note: {flag} {old} is now spelled `{new}` (the same name in every tool and in the metrics' `algo` column); the old spelling is still accepted"
        );
    }
}

/// An error already reported: by the rank that saw it, in an agreement every rank took part
/// in (`World::agree`). The tool exits with `code` without printing anything more.
#[derive(Debug)]
pub struct Silent {
    pub code: u8,
}

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped: the error was reported by the rank that saw it")
    }
}

impl std::error::Error for Silent {}

/// The exit status an error ends the tool with: an agreed error's own, 1 for the rest
/// (usage errors exit 2 through clap before a tool's body runs).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    e.downcast_ref::<Silent>().map_or(1, |s| s.code)
}

/// For tools that work on one process (gradselect, gradpartition, gradreport, and gradtrace
/// but `model`): under `mpirun -np N` with N > 1, ranks other than 0 exit 0 at once and rank 0
/// does the work alone, with a note — instead of N processes racing to write the same files.
pub fn one_process_under_mpirun(tool: &str) {
    if !under_mpi_launcher() {
        return;
    }
    let size = launcher_var(&["OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"]).unwrap_or(1);
    let rank = launcher_rank();
    if size <= 1 {
        return;
    }
    if rank != 0 {
        std::process::exit(0);
    }
    report_line(&format!(
        "note: {tool} works on one process; under mpirun -np {size} rank 0 runs it and the other ranks exit"
    ));
}

/// Writes `error: MSG` (the context chain joined by `: `) to stderr in ONE write, so that no
/// other output (another rank's, mpirun's) can cut into it; errors writing it are ignored.
pub fn report(e: &anyhow::Error) {
    report_line(&format!("error: {}", chain_text(e)));
}

/// An error and its causes joined by `: `, leaving out a cause whose text the message before
/// it already holds (a context that quoted its source: `writing x: No space left on device
/// (os error 28)` above the I/O error itself).
pub fn chain_text(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    let mut prev = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !prev.is_empty() && prev.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
        prev = text;
    }
    msg
}

/// One line to stderr, written with a single `write` call.
pub fn report_line(line: &str) {
    let mut buf = line.replace('\n', " ");
    buf.push('\n');
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(buf.as_bytes());
    let _ = err.flush();
}

static PANIC_TEXT: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Replaces the panic hook: a panic's message and place are kept for [`run`] to report as one
/// `error:` line instead of a backtrace (set `GRADKIT_DEBUG=1` to get Rust's own report).
fn install_panic_hook() {
    if std::env::var_os("GRADKIT_DEBUG").is_some() {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            s.to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "unknown panic".to_string()
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("?");
        *PANIC_TEXT.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(format!("{msg} (thread {name}{at})"));
    }));
}

/// The message of the last panic seen by the hook of [`run`].
pub fn last_panic() -> Option<String> {
    PANIC_TEXT.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Runs a tool's body and ends the process the same way in every tool, in-process or under
/// mpirun (docs/RELIABILITY.md):
/// - success: exit 0 (under MPI after `MPI_Finalize`, which every rank reaches);
/// - an error: `error: …` with its context chain, one line, exit 1. Under MPI with more than
///   one rank, an error the other ranks agreed on ([`Silent`]) ends every rank with status 1
///   after the one message is out; any other error may leave ranks waiting for this one, so
///   after printing, the job is ended with `MPI_Abort`;
/// - a broken pipe on stdout (`| head`) is not an error of ours: exit 0;
/// - a panic (a bug) is reported like an error, `error: internal error: …`, never as a
///   backtrace, and ends an MPI job with `MPI_Abort`.
///
/// clap's own usage errors exit 2 before this is reached.
pub fn run(body: impl FnOnce() -> Result<()>) -> ExitCode {
    install_panic_hook();
    tune_allocator();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    // A signal's cleanup ends the process itself (128 + the signal), whatever the body saw.
    crate::paths::await_signal_exit();
    let mpi = launcher().copied();
    let finalize = || {
        if let Some(l) = mpi {
            (l.finalize)();
        }
    };
    let abort_job = |code: i32| {
        if let Some(l) = mpi.filter(|l| l.size > 1) {
            (l.abort)(code);
        }
    };
    match outcome {
        Ok(Ok(())) => {
            finalize();
            ExitCode::SUCCESS
        }
        Ok(Err(e)) if e.is::<Silent>() => {
            finalize();
            ExitCode::from(exit_code(&e))
        }
        Ok(Err(e)) if e.chain().any(is_broken_pipe) => {
            // The reader went away (`| head`): not an error of ours.
            finalize();
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            report(&e);
            let code = exit_code(&e);
            abort_job(code.into());
            finalize();
            ExitCode::from(code)
        }
        Err(_) => {
            let what = last_panic().unwrap_or_else(|| "a panic".into());
            report_line(&format!(
                "error: internal error (a bug in gradkit; please report it): {what}"
            ));
            abort_job(1);
            ExitCode::from(1)
        }
    }
}

/// One glibc malloc arena for the whole process (`mallopt(M_ARENA_MAX, 1)`), unless
/// `MALLOC_ARENA_MAX` is set. [`run`] calls it before the tool starts a thread.
///
/// With glibc's default (up to 8 arenas per core) every reader, encoder and rank thread gets an
/// arena of its own; a step-sized buffer freed in one arena is not reused by the next thread's
/// allocation, which faults in fresh pages instead, and freed arena memory stays as peak RSS.
/// Measured side by side on one binary (`MALLOC_ARENA_MAX=1` vs `8`, three interleaved runs,
/// a 401 MB vgg16 trace, docs/MEMORY.md): peak RSS of `gradtrace cat` 156–159 → 130–148 MB,
/// gradselect topk 197–204 → 179–187 MB, `gradallreduce --algo ring --ranks 4` 250 → 210–216 MB,
/// the ring 0.84–0.91 s against 0.71–0.86 s and the others as fast; `gradtrain --model transformer-lm --ranks 4` 576–613 →
/// 484–489 MB and system time 4.3–4.9 → 1.1–1.4 s. The threads here allocate few, large
/// blocks, so one arena's lock is not contended.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// How a human table is printed.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Aligned Markdown table
    #[default]
    Md,
    /// Comma-separated values with a header row
    Csv,
    /// One JSON object per row, in an array
    Json,
}

/// A small text table: a header and rows of cells, printed as Markdown, CSV or JSON.
#[derive(Clone, Debug, Default)]
pub struct TextTable {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl TextTable {
    pub fn new<S: ToString>(header: impl IntoIterator<Item = S>) -> Self {
        TextTable {
            header: header.into_iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }
    pub fn push<S: ToString>(&mut self, row: impl IntoIterator<Item = S>) {
        self.rows
            .push(row.into_iter().map(|s| s.to_string()).collect());
    }

    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Md => self.markdown(),
            Format::Csv => self.csv(),
            Format::Json => self.json(),
        }
    }

    fn markdown(&self) -> String {
        // A cell is one line of one column: `|` and `\` are backslash-escaped (GFM), and line
        // breaks, tabs, NUL and other control characters are written as visible escapes.
        fn escape(c: &str) -> String {
            let mut o = String::with_capacity(c.len());
            for ch in c.chars() {
                match ch {
                    '|' => o.push_str("\\|"),
                    '\\' => o.push_str("\\\\"),
                    '\n' => o.push_str("\\n"),
                    '\r' => o.push_str("\\r"),
                    '\t' => o.push_str("\\t"),
                    c if c.is_control() => o.push_str(&format!("\\u{{{:x}}}", c as u32)),
                    c => o.push(c),
                }
            }
            o
        }
        let esc = |r: &[String]| -> Vec<String> { r.iter().map(|c| escape(c)).collect() };
        let header = esc(&self.header);
        let rows: Vec<Vec<String>> = self.rows.iter().map(|r| esc(r)).collect();
        let n = header.len();
        let mut w: Vec<usize> = header.iter().map(|h| h.chars().count().max(3)).collect();
        for r in &rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        // Once per column, not per cell: per cell it made a table of R rows O(R²).
        let numeric_cols: Vec<bool> = (0..n)
            .map(|i| {
                !rows.is_empty()
                    && rows.iter().all(|r| {
                        r.get(i)
                            .is_some_and(|c| c.parse::<f64>().is_ok() || c == "-")
                    })
            })
            .collect();
        let numeric = |i: usize| numeric_cols.get(i).copied().unwrap_or(false);
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, c) in cells.iter().enumerate().take(n) {
                let pad = w[i] - c.chars().count();
                if numeric(i) {
                    s.push_str(&format!(" {}{} |", " ".repeat(pad), c));
                } else {
                    s.push_str(&format!(" {}{} |", c, " ".repeat(pad)));
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(&header);
        out.push('|');
        for (i, wi) in w.iter().enumerate() {
            if numeric(i) {
                out.push_str(&format!("{}:|", "-".repeat(wi + 1)));
            } else {
                out.push_str(&format!("{}|", "-".repeat(wi + 2)));
            }
        }
        out.push('\n');
        for r in &rows {
            out.push_str(&line(r));
        }
        out
    }

    fn csv(&self) -> String {
        let cell = |c: &str| {
            if c.contains([',', '"', '\n']) {
                format!("\"{}\"", c.replace('"', "\"\""))
            } else {
                c.to_string()
            }
        };
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let cells: Vec<String> = r.iter().map(|c| cell(c)).collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    fn json(&self) -> String {
        let mut out = String::from("[\n");
        for (j, r) in self.rows.iter().enumerate() {
            out.push_str("  {");
            for (i, (h, c)) in self.header.iter().zip(r).enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let v = if c.parse::<f64>().is_ok_and(|v| v.is_finite()) {
                    c.clone()
                } else {
                    json_string(c)
                };
                out.push_str(&format!("{}: {}", json_string(h), v));
            }
            out.push('}');
            if j + 1 < self.rows.len() {
                out.push(',');
            }
            out.push('\n');
        }
        out.push_str("]\n");
        out
    }

    /// Prints to stdout (a table is the tool's main output there).
    pub fn print(&self, format: Format) -> Result<()> {
        let mut o = std::io::stdout().lock();
        // Flushed here so that a full disk is this call's error, not lost at exit.
        o.write_all(self.render(format).as_bytes())
            .and_then(|()| o.flush())
            .map_err(|e| anyhow::Error::new(e).context("writing <stdout>"))
    }
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Formats a float with `sig` significant digits, without exponent for ordinary magnitudes.
pub fn fmt_num(v: f64, sig: usize) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let mag = v.abs().log10().floor() as i32;
    if !(-4..=12).contains(&mag) {
        return format!("{:.*e}", sig.saturating_sub(1), v);
    }
    let decimals = (sig as i32 - 1 - mag).max(0) as usize;
    format!("{v:.decimals$}")
}

/// Whether human progress should be drawn: stderr is a terminal and `-q` was not given.
pub fn show_progress(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// A progress bar on stderr (indicatif), hidden when stderr is not a terminal or with `-q`.
pub fn progress(label: &str, total: u64, quiet: bool) -> indicatif::ProgressBar {
    if !show_progress(quiet) {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {per_sec} eta {eta} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

/// A usage error found after parsing (a flag that does not apply, a value out of range):
/// printed as clap prints its own (`error: …`, then the usage line) and exit 2. For the tools
/// that never run under mpirun; the others use `gradkit_comm::launch::usage_error`, which
/// prints it once per job.
pub fn usage_error<C: clap::CommandFactory>(msg: impl std::fmt::Display) -> ! {
    usage_clap_error::<C>(msg).exit()
}

/// The clap error [`usage_error`] prints: `error: MSG`, the usage line, exit status 2.
pub fn usage_clap_error<C: clap::CommandFactory>(msg: impl std::fmt::Display) -> clap::Error {
    C::command()
        .error(clap::error::ErrorKind::ArgumentConflict, msg)
        .format(&mut C::command())
}

/// [`usage_clap_error`] with the usage line of subcommand `sub` of `C` (`C`'s own when it
/// has no such subcommand).
pub fn subcommand_usage_clap_error<C: clap::CommandFactory>(
    sub: &str,
    msg: impl std::fmt::Display,
) -> clap::Error {
    let mut cmd = C::command();
    // Built, so that the subcommand's usage line carries the tool's name.
    cmd.build();
    match cmd.find_subcommand_mut(sub) {
        Some(s) => {
            let mut s = s.clone();
            s.error(clap::error::ErrorKind::ArgumentConflict, msg)
                .format(&mut s)
        }
        None => usage_clap_error::<C>(msg),
    }
}

/// The clap error for a variable [`crate::env::check`] refused: `error: MSG` alone (the
/// command line is fine, so no usage line), exit status 2.
pub fn env_clap_error(e: &anyhow::Error) -> clap::Error {
    clap::Error::raw(
        clap::error::ErrorKind::InvalidValue,
        format!("{}\n", chain_text(e)),
    )
}

/// [`crate::env::check`] for tools that run as one process (under mpirun, rank 0 alone, after
/// [`one_process_under_mpirun`]): a mistake is a usage error, exit 2.
pub fn check_env() {
    if let Err(e) = crate::env::check() {
        env_clap_error(&e).exit()
    }
}

/// Whether the user gave the argument `id` (on the command line or through its environment
/// variable), as opposed to clap filling in its default.
pub fn given(m: &clap::ArgMatches, id: &str) -> bool {
    matches!(
        m.try_get_raw(id).ok().and_then(|_| m.value_source(id)),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    )
}

// ---------------------------------------------------------------------------------------------
// Argument groups every tool flattens, so that one concept has one spelling, one default and
// one meaning in every tool (README.md lists the conventions).

/// The α-β cost model's default start-up latency α, in microseconds: the one default of
/// `--alpha-us` in every tool (gradallreduce model and bench, gradreport).
pub const DEFAULT_ALPHA_US: f64 = 5.0;
/// The α-β cost model's default link bandwidth, in GB/s: the one default of
/// `--bandwidth-gbps` in every tool (β = 1/bandwidth; 10 GB/s ≈ 100 Gbit/s InfiniBand EDR).
pub const DEFAULT_BANDWIDTH_GBPS: f64 = 10.0;

/// The α-β cost model's parameters, `--alpha-us` and `--bandwidth-gbps`, with the same
/// defaults and checks in every tool that predicts a time.
#[derive(clap::Args, Clone, Copy, Debug, PartialEq)]
pub struct CostArgs {
    /// Cost model: start-up latency α per message, in microseconds
    #[arg(long, value_name = "US", default_value_t = DEFAULT_ALPHA_US)]
    pub alpha_us: f64,
    /// Cost model: link bandwidth in GB/s (β = 1/bandwidth: 4 bytes/bandwidth per word);
    /// on the shaped cluster (`pipelines/cluster.sh run`) its links' rate
    #[arg(long, value_name = "GBPS", default_value_t = default_bandwidth_gbps())]
    pub bandwidth_gbps: f64,
}

impl Default for CostArgs {
    fn default() -> Self {
        CostArgs {
            alpha_us: DEFAULT_ALPHA_US,
            bandwidth_gbps: DEFAULT_BANDWIDTH_GBPS,
        }
    }
}

/// `--bandwidth-gbps`' default: the shaped cluster's link rate when the tool runs on it
/// (`pipelines/cluster.sh run` exports `GRADKIT_CLUSTER_INFO` with `rate=1gbit`), else
/// [`DEFAULT_BANDWIDTH_GBPS`]; so a bench's `model_us` column predicts that cluster.
pub fn default_bandwidth_gbps() -> f64 {
    std::env::var("GRADKIT_CLUSTER_INFO")
        .ok()
        .and_then(|info| cluster_rate_gbps(&info))
        .unwrap_or(DEFAULT_BANDWIDTH_GBPS)
}

/// The `rate=` of a `GRADKIT_CLUSTER_INFO` value (tc's units: bit, kbit, mbit, gbit, in
/// 1000s), in GB/s.
pub fn cluster_rate_gbps(info: &str) -> Option<f64> {
    let rate = info
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("rate="))?;
    let digits = rate.find(|c: char| !c.is_ascii_digit())?;
    let n: f64 = rate[..digits].parse().ok()?;
    let unit = match &rate[digits..] {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return None,
    };
    (n > 0.0).then_some(n * unit / 8.0 / 1e9)
}

impl CostArgs {
    /// α ≥ 0 and bandwidth > 0, both finite; the error names the flag (a usage error).
    pub fn check(&self) -> Result<()> {
        if !(self.alpha_us.is_finite() && self.alpha_us >= 0.0) {
            anyhow::bail!(
                "--alpha-us must be a finite number ≥ 0, got {} (flag --alpha-us)",
                self.alpha_us
            );
        }
        if !(self.bandwidth_gbps.is_finite() && self.bandwidth_gbps > 0.0) {
            anyhow::bail!(
                "--bandwidth-gbps must be a finite number > 0, got {} (flag --bandwidth-gbps)",
                self.bandwidth_gbps
            );
        }
        Ok(())
    }
    /// α in seconds per message.
    pub fn alpha_s(&self) -> f64 {
        self.alpha_us * 1e-6
    }
    /// β in seconds per byte.
    pub fn beta_byte_s(&self) -> f64 {
        1.0 / (self.bandwidth_gbps * 1e9)
    }
    /// β in seconds per 4-byte word (the unit of `collectives::cost`).
    pub fn beta_word_s(&self) -> f64 {
        4.0 * self.beta_byte_s()
    }
}

/// Where an output flag other than `-o` writes (`--metrics`, `--residual-out`, …): `None` when
/// the flag is absent; `-` is stdout, refused on a terminal (with a hint naming `flag`) and
/// under mpirun (with [`Output::from_arg`]'s message); anything else is the file.
///
/// Two outputs on stdout are refused by [`crate::paths::check_distinct`]: give it every
/// output, `-o` as `-` when absent ([`stdout_if_absent`]).
pub fn output_flag(flag: &str, arg: Option<&std::path::Path>) -> Result<Option<Output>> {
    match arg {
        None => Ok(None),
        Some(p) if p.as_os_str() == "-" => {
            if !under_mpi_launcher() && std::io::stdout().is_terminal() {
                anyhow::bail!(
                    "refusing to write Parquet to a terminal ({flag} -): give {flag} FILE, or pipe stdout into another tool (e.g. `| gradreport table`)"
                );
            }
            anyhow::Context::with_context(Output::from_arg(None), || format!("{flag} -")).map(Some)
        }
        Some(p) => Output::for_flag(flag, Some(p)).map(Some),
    }
}

/// `-o`'s path as [`crate::paths::check_distinct`] should see it: absent means stdout (`-`),
/// so that a second output on stdout (`--metrics -`) is refused.
pub fn stdout_if_absent(arg: Option<&std::path::Path>) -> Option<&std::path::Path> {
    Some(arg.unwrap_or(std::path::Path::new("-")))
}

/// The `--version` of the tool that expands it: its package version, and ` (cuda)` when that
/// tool was built with its `cuda` feature (so a user, and the device tests, can tell the two
/// builds apart: `gradkit_testkit::variant_bin`).
#[macro_export]
macro_rules! tool_version {
    () => {
        if cfg!(feature = "cuda") {
            concat!(env!("CARGO_PKG_VERSION"), " (cuda)")
        } else {
            env!("CARGO_PKG_VERSION")
        }
    };
}

/// clap's value parser over the names of an option type (`ALL`, `name`, `help`; the type's
/// `FromStr`, from [`crate::named!`], turns the name back): `--help` lists the names with
/// their help lines, and a typo is clap's usage error (exit 2) listing them.
pub fn named<T>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> Option<&'static str>,
) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: Copy + Send + Sync + 'static + std::str::FromStr<Err = String>,
{
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(all.iter().map(move |v| {
        let pv = PossibleValue::new(name(*v));
        match help(*v) {
            Some(h) => pv.help(h),
            None => pv,
        }
    }))
    .try_map(|s| s.parse::<T>())
}

#[cfg(test)]
mod tests {
    use super::{chain_text, cluster_rate_gbps};

    /// The cluster's rate in tc's units (1000s), as cluster.sh exports it, in GB/s.
    #[test]
    fn cluster_rate_in_gbps() {
        let info = |r: &str| format!("backend=mpi-tcp hosts=4 ranks=4 rate={r} id=a");
        assert_eq!(cluster_rate_gbps(&info("1gbit")), Some(0.125));
        assert_eq!(cluster_rate_gbps(&info("100mbit")), Some(0.0125));
        assert_eq!(cluster_rate_gbps(&info("800kbit")), Some(0.0001));
        assert_eq!(cluster_rate_gbps(&info("10gbit")), Some(1.25));
        assert_eq!(cluster_rate_gbps(&info("fast")), None);
        assert_eq!(cluster_rate_gbps(&info("0gbit")), None);
        assert_eq!(cluster_rate_gbps("hosts=4"), None);
    }

    /// A context that already quotes its cause (as `writing PATH: {io error}` does) is
    /// followed by the next cause only where that says something new.
    #[test]
    fn a_cause_the_message_already_holds_is_not_repeated() {
        let full = || std::io::Error::from_raw_os_error(28);
        let e = anyhow::Error::new(full()).context(format!("writing /data/t.parquet: {}", full()));
        assert_eq!(
            chain_text(&e),
            format!("writing /data/t.parquet: {}", full())
        );
        assert_eq!(chain_text(&e).matches("os error 28").count(), 1);
        let e = anyhow::anyhow!("root cause")
            .context("middle")
            .context("top");
        assert_eq!(chain_text(&e), "top: middle: root cause");
        // Only the message just before is compared: a cause repeated further down stays.
        let e = anyhow::anyhow!("a").context("b").context("a");
        assert_eq!(chain_text(&e), "a: b: a");
    }
}
