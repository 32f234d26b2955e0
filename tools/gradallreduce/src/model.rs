//! `gradallreduce model`: the α-β model's prediction for every algorithm, at any P.

use anyhow::{bail, Result};
use clap::Args;
use gradkit_collectives::cost::{self, Cost};
use gradkit_core::cli::{fmt_num, Format, TextTable};

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Ranks P of the predicted job (a number in the formulas: nothing is run)
    #[arg(long, value_name = "P", default_value_t = 256)]
    pub ranks: usize,
    /// Model size n in elements (e.g. 110M, 2^24 = 16M)
    #[arg(long, default_value = "16M")]
    pub n: String,
    /// Density k/n
    #[arg(long, default_value_t = 0.01)]
    pub density: f64,
    #[command(flatten)]
    pub cost: gradkit_core::cli::CostArgs,
    #[arg(long, value_enum, default_value_t = Format::Md)]
    pub format: Format,
}

pub fn run(a: ModelArgs) -> Result<()> {
    let n = crate::parse_size(&a.n)? as f64;
    if a.ranks == 0 || !(a.density > 0.0 && a.density <= 1.0) {
        bail!("--ranks must be ≥ 1 and --density in (0, 1]");
    }
    a.cost.check()?;
    let (p, k) = (a.ranks, (a.density * n).floor().max(1.0));
    let (alpha, beta_word) = (a.cost.alpha_s(), a.cost.beta_word_s());
    let rows: Vec<(&str, Cost)> = vec![
        ("dense (rabenseifner)", cost::dense(p, n)),
        ("dense (ring)", cost::ring(p, n)),
        ("dense (tree)", cost::tree(p, n)),
        ("topka", cost::topka(p, k)),
        ("topkdsa best", cost::topkdsa_best(p, k)),
        ("topkdsa worst", cost::topkdsa_worst(p, n, k)),
        ("gtopk", cost::gtopk(p, k)),
        ("gaussiank", cost::gaussiank(p, k)),
        ("oktopk best", cost::oktopk_best(p, k)),
        ("oktopk worst", cost::oktopk_worst(p, k)),
        ("onebit", cost::onebit(p, n as usize)),
    ];
    let dense_t = cost::dense(p, n).time(alpha, beta_word);
    let mut t = TextTable::new([
        "algo",
        "P",
        "n",
        "k",
        "latency_alpha",
        "words_per_rank",
        "time_ms",
        "speedup_vs_dense",
    ]);
    for (name, c) in rows {
        let time = c.time(alpha, beta_word);
        t.push([
            name.to_string(),
            p.to_string(),
            (n as u64).to_string(),
            (k as u64).to_string(),
            fmt_num(c.latency, 4),
            fmt_num(c.words, 5),
            fmt_num(time * 1e3, 4),
            fmt_num(dense_t / time, 3),
        ]);
    }
    t.print(a.format)
}
