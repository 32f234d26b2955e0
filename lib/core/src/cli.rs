//! The CLI layer every tool shares: input/output arguments, error reporting and exit codes,
//! human tables (Markdown, CSV, JSON) and progress on stderr.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::io::{Input, Output, ReadOptions};

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

/// An error already reported elsewhere (by MPI rank 0): exit 1 without printing.
#[derive(Debug)]
pub struct Silent;

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped: another rank reported the error")
    }
}

impl std::error::Error for Silent {}

/// Runs a tool's body: errors print as `error: …` with the context chain and exit 1.
/// clap's own usage errors exit 2 before this is reached.
pub fn run(body: impl FnOnce() -> Result<()>) -> ExitCode {
    match body() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.is::<Silent>() {
                return ExitCode::from(1);
            }
            if e.chain().any(is_broken_pipe) {
                // The reader went away (`| head`): not an error of ours.
                return ExitCode::SUCCESS;
            }
            let mut msg = format!("{e}");
            for cause in e.chain().skip(1) {
                msg.push_str(": ");
                msg.push_str(&cause.to_string());
            }
            eprintln!("error: {msg}");
            ExitCode::from(1)
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
        let n = self.header.len();
        let mut w: Vec<usize> = self
            .header
            .iter()
            .map(|h| h.chars().count().max(3))
            .collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let numeric = |i: usize| {
            !self.rows.is_empty()
                && self.rows.iter().all(|r| {
                    r.get(i)
                        .is_some_and(|c| c.parse::<f64>().is_ok() || c == "-")
                })
        };
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
        let mut out = line(&self.header);
        out.push('|');
        for (i, wi) in w.iter().enumerate() {
            if numeric(i) {
                out.push_str(&format!("{}:|", "-".repeat(wi + 1)));
            } else {
                out.push_str(&format!("{}|", "-".repeat(wi + 2)));
            }
        }
        out.push('\n');
        for r in &self.rows {
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
        o.write_all(self.render(format).as_bytes())?;
        Ok(())
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
