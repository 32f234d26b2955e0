//! `gradallreduce model`: the α-β model's prediction for every algorithm, at any P.

use anyhow::{bail, Context, Result};
use clap::Args;
use gradkit_collectives::cost::{self, Cost};
use gradkit_collectives::Algo;
use gradkit_core::cli::{fmt_num, Format, TextTable};
use gradkit_core::keep::{Keep, DEFAULT_DENSITY};

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Ranks P of the predicted job (a number in the formulas: nothing is run), 1 to 2^24
    #[arg(long, value_name = "P", default_value_t = 256)]
    pub ranks: usize,
    /// Model size n in elements: SI's decimal multiples (110M = 110,000,000) or binary ones
    /// (16Mi = 2^24), 1 to 2^53
    #[arg(long, default_value = "16Mi")]
    pub n: String,
    /// Density k/n
    #[arg(long, default_value_t = DEFAULT_DENSITY)]
    pub density: f64,
    #[command(flatten)]
    pub cost: gradkit_core::cli::CostArgs,
    #[arg(long, value_enum, default_value_t = Format::Md)]
    pub format: Format,
}

/// The largest `--ranks`: 2^24, past the largest machines (about 10 million cores) while
/// every count of the formulas stays exact in f64 (P² < 2^53).
pub const MAX_RANKS: usize = 1 << 24;
/// The largest `--n`: 2^53 elements, the largest count the f64 formulas hold exactly.
pub const MAX_N: u64 = 1 << 53;

impl ModelArgs {
    /// The flags' ranges, checked on the command line alone (a usage error names the flag).
    pub fn check_flags(&self) -> Result<()> {
        if !(1..=MAX_RANKS).contains(&self.ranks) {
            bail!(
                "--ranks must be from 1 to {MAX_RANKS} (2^24), got {} (flag --ranks)",
                self.ranks
            );
        }
        let n = self.n()?;
        if !(1..=MAX_N).contains(&n) {
            bail!("--n must be from 1 to {MAX_N} (2^53) elements, got {n} (flag --n)");
        }
        if let Err(e) = Keep::density(self.density) {
            bail!("{e} (flag --density)");
        }
        self.cost.check()
    }

    fn n(&self) -> Result<u64> {
        gradkit_core::budget::parse_count(&self.n)
            .with_context(|| format!("--n {} (flag --n)", self.n))
    }
}

pub fn run(a: ModelArgs) -> Result<()> {
    a.check_flags()?;
    let n = a.n()?;
    // Exact in f64: n ≤ 2^53.
    let (p, k) = (a.ranks, Keep::Density(a.density).k(n) as f64);
    let n = n as f64;
    let (alpha, beta_word) = (a.cost.alpha_s(), a.cost.beta_word_s());
    let rows = formulas(p, n, k);
    let dense_t = cost::dense(p, n).time(alpha, beta_word);
    let mut t = TextTable::new([
        "algo",
        "P",
        "n",
        "k",
        "alpha_terms",
        "bytes_per_rank",
        "time_ms",
        "speedup_vs_dense",
    ]);
    for (name, c) in rows {
        let time = c.time(alpha, beta_word);
        t.push([
            name,
            p.to_string(),
            (n as u64).to_string(),
            (k as u64).to_string(),
            fmt_num(c.latency, 4),
            fmt_num(c.bytes(), 5),
            fmt_num(time * 1e3, 4),
            fmt_num(dense_t / time, 3),
        ]);
    }
    t.print(a.format)
}

/// One row per formula of the registry, in its order: `NAME`, or `NAME best` and `NAME worst`
/// where the paper gives an interval.
fn formulas(p: usize, n: f64, k: f64) -> Vec<(String, Cost)> {
    let mut rows = Vec::new();
    for a in Algo::ALL {
        match (a.bounds(p, n, k), a.cost(p, n, k)) {
            (Some((best, worst)), _) => {
                rows.push((format!("{a} best"), best));
                rows.push((format!("{a} worst"), worst));
            }
            (None, Some(c)) => rows.push((a.to_string(), c)),
            (None, None) => {}
        }
    }
    rows
}

/// `gradallreduce model --help`'s text after the options: what the rows are, from the
/// registry.
pub fn after_help() -> String {
    let none: Vec<&str> = Algo::ALL
        .iter()
        .filter(|a| a.cost(2, 1.0, 1.0).is_none())
        .map(|a| a.name())
        .collect();
    format!(
        "One row per algorithm with a formula, in --algo's order (two, `best` and `worst`, where \
         the paper gives an interval); speedup_vs_dense is against Table 1's dense row \
         (Rabenseifner). No formula: {}.",
        none.join(", ")
    )
}
