//! Training data: the shipped UCI digits, a seeded Markov language source whose entropy rate
//! is known exactly, and the user's own Parquet files; per-rank shards and batches that are a
//! pure function of (seed, rank, step), so a resumed run draws the batches an uninterrupted
//! one would.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow_array::{Array, ArrayRef, ListArray, RecordBatch, StringArray};
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The UCI digits, embedded so `--data digits` works from any directory (see data/README.md).
pub static DIGITS_PARQUET: &[u8] = include_bytes!("../../../data/digits.parquet");

/// A labelled classification set (features row-major, `dim` per example).
#[derive(Clone, Debug)]
pub struct Classification {
    pub dim: usize,
    pub classes: usize,
    pub train_x: Vec<f32>,
    pub train_y: Vec<u32>,
    pub test_x: Vec<f32>,
    pub test_y: Vec<u32>,
}

impl Classification {
    pub fn train_len(&self) -> usize {
        self.train_y.len()
    }
}

/// A token stream for next-token prediction.
#[derive(Clone, Debug)]
pub struct LanguageModel {
    pub vocab: usize,
    pub train: Vec<u32>,
    pub test: Vec<u32>,
    /// The best achievable test loss in nats per token (the source's entropy rate), when known.
    pub entropy_rate: Option<f64>,
}

/// A data set: classification or language modelling.
#[derive(Clone, Debug)]
pub enum Dataset {
    Class(Arc<Classification>),
    Lm(Arc<LanguageModel>),
}

/// One rank's mini-batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Batch {
    /// `x` is `[b, dim]`, `y` is `[b]`.
    Class { x: Vec<f32>, y: Vec<u32>, b: usize },
    /// `x` and `y` are `[b, t]` (y is x shifted by one token).
    Lm {
        x: Vec<u32>,
        y: Vec<u32>,
        b: usize,
        t: usize,
    },
}

impl Batch {
    pub fn len(&self) -> usize {
        match self {
            Batch::Class { b, .. } | Batch::Lm { b, .. } => *b,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How `--data` is resolved: `digits`, `synthetic-lm`, or a Parquet file.
#[derive(Clone, Debug)]
pub struct DataSpec {
    pub name: String,
    /// synthetic-lm: vocabulary size.
    pub vocab: usize,
    /// synthetic-lm: seed of the corpus (independent of the training seed).
    pub corpus_seed: u64,
    /// synthetic-lm: number of training tokens (the test set is a tenth of it).
    pub tokens: usize,
    /// A token file: the vocabulary `--vocab` declares (every id must be below it), when the
    /// user gave one; else the file's `gradkit.vocab` metadata, else max id + 1.
    pub declared_vocab: Option<usize>,
}

impl Default for DataSpec {
    fn default() -> Self {
        DataSpec {
            name: "digits".into(),
            vocab: 1024,
            corpus_seed: 0,
            tokens: 200_000,
            declared_vocab: None,
        }
    }
}

/// Loads the data set `--data` names.
pub fn load(spec: &DataSpec) -> Result<Dataset> {
    match spec.name.as_str() {
        "digits" => Ok(Dataset::Class(Arc::new(
            read_parquet(Bytes::from_static(DIGITS_PARQUET), "digits (embedded)")?
                .into_class("digits", &Declared::default())?,
        ))),
        "synthetic-lm" => {
            let src = MarkovSource::new(spec.vocab, spec.corpus_seed)?;
            let n_test = (spec.tokens / 10).max(1);
            // The sample, then its train and test copies: 2 × 4 bytes per token.
            gradkit_core::budget::check(
                &format!("--tokens {} of synthetic-lm", spec.tokens),
                gradkit_core::budget::product(&[spec.tokens as u128 + n_test as u128, 8]),
            )?;
            let all = src.sample(spec.tokens + n_test, spec.corpus_seed);
            Ok(Dataset::Lm(Arc::new(LanguageModel {
                vocab: spec.vocab,
                train: all[..spec.tokens].to_vec(),
                test: all[spec.tokens..].to_vec(),
                entropy_rate: Some(src.entropy_rate),
            })))
        }
        path => {
            let p = Path::new(path);
            if !p.exists() {
                bail!("--data `{path}`: not `digits`, `synthetic-lm` or an existing Parquet file (flag --data)");
            }
            let bytes = std::fs::read(p).with_context(|| format!("cannot read {path}"))?;
            let bytes = Bytes::from(bytes);
            let declared = Declared::of(&bytes, spec, path)?;
            let t = read_parquet(bytes, path)?;
            if t.has("tokens") {
                Ok(Dataset::Lm(Arc::new(t.into_lm(path, &declared)?)))
            } else if t.has("features") || t.has("label") {
                Ok(Dataset::Class(Arc::new(t.into_class(path, &declared)?)))
            } else {
                bail!(
                    "{path}: no `features`/`label` columns (classification) and no `tokens` column (language model); columns are: {} (flag --data)",
                    t.names().join(", ")
                )
            }
        }
    }
}

/// Most classes a file may have (max label + 1) without declaring its class count.
pub const MAX_UNDECLARED_CLASSES: usize = 1 << 16;
/// Largest vocabulary (max token id + 1) a file may have without declaring one.
pub const MAX_UNDECLARED_VOCAB: usize = 1 << 20;

/// Sizes that bound a data file's ids: its class count or vocabulary, as `--vocab` or the
/// file's key-value metadata (`gradkit.classes`, `gradkit.vocab`) declares them. An id past
/// the declared size (or, undeclared, past a sane maximum) is an error naming the row, not
/// a model sized by one stray value.
#[derive(Clone, Debug, Default)]
struct Declared {
    classes: Option<usize>,
    /// The vocabulary and what declared it (for the message).
    vocab: Option<(usize, String)>,
}

impl Declared {
    fn of(bytes: &Bytes, spec: &DataSpec, src: &str) -> Result<Declared> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
            .with_context(|| format!("{src}: not a Parquet file"))?;
        let kv = builder.metadata().file_metadata().key_value_metadata();
        let get = |key: &str| -> Result<Option<usize>> {
            let Some(v) = kv.and_then(|kv| kv.iter().find(|e| e.key == key)) else {
                return Ok(None);
            };
            let text = v.value.as_deref().unwrap_or("");
            match text.trim().parse::<usize>() {
                Ok(n) if n >= 2 => Ok(Some(n)),
                _ => bail!("{src}: metadata `{key}` = `{text}` is not a count ≥ 2"),
            }
        };
        let classes = get("gradkit.classes")?;
        let vocab = match spec.declared_vocab {
            Some(v) => Some((v, "--vocab".to_string())),
            None => get("gradkit.vocab")?.map(|v| (v, "metadata `gradkit.vocab`".to_string())),
        };
        Ok(Declared { classes, vocab })
    }
}

/// Columns of a Parquet file, one array per record batch.
struct RawTable {
    cols: Vec<(String, Vec<ArrayRef>)>,
}

fn read_parquet(bytes: Bytes, name: &str) -> Result<RawTable> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .with_context(|| format!("{name}: not a Parquet file"))?;
    let schema = builder.schema().clone();
    let reader = builder.build()?;
    let batches: Vec<RecordBatch> = reader
        .collect::<std::result::Result<_, _>>()
        .map_err(gradkit_core::io::decode_error)
        .with_context(|| format!("{name}: cannot decode"))?;
    // pandas and polars write LargeUtf8 and LargeList: the same normalisation as the tables'.
    let cols = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let arrays = batches
                .iter()
                .map(|b| gradkit_core::tables::normalize_array(b.column(i)))
                .collect::<Result<_>>()
                .with_context(|| format!("{name}: column `{}`", f.name()))?;
            Ok((f.name().clone(), arrays))
        })
        .collect::<Result<_>>()?;
    Ok(RawTable { cols })
}

impl RawTable {
    fn has(&self, name: &str) -> bool {
        self.cols.iter().any(|c| c.0 == name)
    }
    fn names(&self) -> Vec<String> {
        self.cols.iter().map(|c| c.0.clone()).collect()
    }
    fn col(&self, name: &str, src: &str) -> Result<&Vec<ArrayRef>> {
        self.cols
            .iter()
            .find(|c| c.0 == name)
            .map(|c| &c.1)
            .with_context(|| {
                format!(
                    "{src}: missing column `{name}` (columns: {})",
                    self.names().join(", ")
                )
            })
    }

    fn into_class(self, src: &str, declared: &Declared) -> Result<Classification> {
        let mut rows = Vec::new();
        for a in self.col("features", src)? {
            rows.extend(list_f32(a, "features", src)?);
        }
        let mut y = Vec::new();
        for a in self.col("label", src)? {
            y.extend(int_values(a.as_ref(), "label", src)?);
        }
        let n = rows.len();
        let dim = rows.first().map_or(0, |r| r.len());
        if n == 0 || dim == 0 {
            bail!("{src}: no examples (column `features` is empty)");
        }
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != dim) {
            bail!(
                "{src}: row {i} has {} features but row 0 has {dim} (column `features`)",
                r.len()
            );
        }
        if let Some((i, v)) = rows
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.iter().find(|v| !v.is_finite()).map(|v| (i, *v)))
        {
            bail!("{src}: row {i} has the non-finite feature {v} (column `features`)");
        }
        let (bound, how) = match declared.classes {
            Some(c) => (c, "the class count the file declares (metadata `gradkit.classes`)"),
            None => (
                MAX_UNDECLARED_CLASSES,
                "the most classes a file may have without declaring them; if intended, set the file's metadata `gradkit.classes` to the class count",
            ),
        };
        if let Some((i, l)) = y.iter().enumerate().find(|(_, l)| **l as usize >= bound) {
            bail!("{src}: row {i}: label {l} is not below {bound}, {how} (column `label`)");
        }
        let classes = declared
            .classes
            .unwrap_or_else(|| y.iter().max().map_or(0, |m| *m as usize + 1));
        if classes < 2 {
            bail!("{src}: needs at least 2 classes (column `label`)");
        }
        let is_test = self.test_rows(src, n)?;
        let mut c = Classification {
            dim,
            classes,
            train_x: Vec::new(),
            train_y: Vec::new(),
            test_x: Vec::new(),
            test_y: Vec::new(),
        };
        for (i, r) in rows.into_iter().enumerate() {
            if is_test[i] {
                c.test_x.extend(r);
                c.test_y.push(y[i]);
            } else {
                c.train_x.extend(r);
                c.train_y.push(y[i]);
            }
        }
        if c.train_y.is_empty() || c.test_y.is_empty() {
            bail!("{src}: the train or the test split is empty (column `split`)");
        }
        Ok(c)
    }

    /// Which rows are test examples: column `split` (`train`/`test`) where the file has it,
    /// else the last fifth.
    fn test_rows(&self, src: &str, n: usize) -> Result<Vec<bool>> {
        if !self.has("split") {
            let cut = n - n / 5;
            return Ok((0..n).map(|i| i >= cut).collect());
        }
        let mut vals: Vec<Option<String>> = Vec::with_capacity(n);
        for a in self.col("split", src)? {
            let s = a
                .as_any()
                .downcast_ref::<StringArray>()
                .with_context(|| format!("{src}: column `split` must be Utf8 (`train`/`test`)"))?;
            vals.extend((0..s.len()).map(|i| s.is_valid(i).then(|| s.value(i).to_string())));
        }
        (0..n)
            .map(|i| match vals[i].as_deref() {
                Some("train") => Ok(false),
                Some("test") => Ok(true),
                other => bail!(
                    "{src}: row {i}: split `{}` is neither `train` nor `test` (column `split`)",
                    other.unwrap_or("null")
                ),
            })
            .collect()
    }

    fn into_lm(self, src: &str, declared: &Declared) -> Result<LanguageModel> {
        let (bound, how) = match &declared.vocab {
            Some((v, by)) => (*v, format!("the vocabulary {by} declares")),
            None => (
                MAX_UNDECLARED_VOCAB,
                "the largest vocabulary a file may have undeclared; if intended, give --vocab N or set the file's metadata `gradkit.vocab`".to_string(),
            ),
        };
        let mut all: Vec<u32> = Vec::new();
        let mut row = 0usize;
        for a in self.col("tokens", src)? {
            for doc in list_u32(a, "tokens", src)? {
                if let Some((pos, id)) = doc.iter().enumerate().find(|(_, t)| **t as usize >= bound)
                {
                    bail!(
                        "{src}: row {row}, position {pos}: token id {id} is not below {bound}, {how} (column `tokens`)"
                    );
                }
                all.extend(doc);
                row += 1;
            }
        }
        if all.len() < 100 {
            bail!(
                "{src}: only {} tokens; need at least 100 (column `tokens`)",
                all.len()
            );
        }
        let vocab = match &declared.vocab {
            Some((v, _)) => *v,
            None => *all.iter().max().unwrap() as usize + 1,
        };
        let cut = all.len() - all.len() / 10;
        Ok(LanguageModel {
            vocab,
            train: all[..cut].to_vec(),
            test: all[cut..].to_vec(),
            entropy_rate: None,
        })
    }
}

fn list_f32(a: &ArrayRef, col: &str, src: &str) -> Result<Vec<Vec<f32>>> {
    let l = a.as_any().downcast_ref::<ListArray>().with_context(|| {
        format!(
            "{src}: column `{col}` must be a List of floats, not {}",
            a.data_type()
        )
    })?;
    let mut out = Vec::with_capacity(l.len());
    for i in 0..l.len() {
        if l.is_null(i) {
            bail!("{src}: row {i} is null (column `{col}`)");
        }
        let v = l.value(i);
        let vals: Vec<f32> = match v.data_type() {
            DataType::Float32 => v
                .as_any()
                .downcast_ref::<arrow_array::Float32Array>()
                .unwrap()
                .values()
                .to_vec(),
            DataType::Float64 => v
                .as_any()
                .downcast_ref::<arrow_array::Float64Array>()
                .unwrap()
                .values()
                .iter()
                .map(|x| *x as f32)
                .collect(),
            other => {
                bail!("{src}: column `{col}` must be a List of Float32/Float64, not List<{other}>")
            }
        };
        if v.null_count() > 0 {
            bail!("{src}: row {i} has null values (column `{col}`)");
        }
        out.push(vals);
    }
    Ok(out)
}

fn int_values(a: &dyn Array, col: &str, src: &str) -> Result<Vec<u32>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    if a.null_count() > 0 {
        bail!("{src}: column `{col}` has nulls");
    }
    macro_rules! conv {
        ($t:ty) => {
            a.as_primitive::<$t>()
                .values()
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    u32::try_from(*v as i64).with_context(|| {
                        format!("{src}: row {i}: value {v} is not a valid id ≥ 0 (column `{col}`)")
                    })
                })
                .collect()
        };
    }
    match a.data_type() {
        DataType::UInt8 => conv!(UInt8Type),
        DataType::UInt16 => conv!(UInt16Type),
        DataType::UInt32 => conv!(UInt32Type),
        DataType::UInt64 => conv!(UInt64Type),
        DataType::Int8 => conv!(Int8Type),
        DataType::Int16 => conv!(Int16Type),
        DataType::Int32 => conv!(Int32Type),
        DataType::Int64 => conv!(Int64Type),
        other => bail!("{src}: column `{col}` must hold integers, not {other}"),
    }
}

fn list_u32(a: &ArrayRef, col: &str, src: &str) -> Result<Vec<Vec<u32>>> {
    let l = a.as_any().downcast_ref::<ListArray>().with_context(|| {
        format!(
            "{src}: column `{col}` must be a List of integers, not {}",
            a.data_type()
        )
    })?;
    (0..l.len())
        .map(|i| int_values(l.value(i).as_ref(), col, src))
        .collect()
}

/// A first-order Markov source over a Zipf-distributed vocabulary. Row s of the transition
/// matrix is `P(j | s) ∝ (j+1)^-1.1 · (π_s(j)+1)^-1` — a global Zipf law (frequent tokens are
/// frequent everywhere) times a state-specific Zipf preference over a seeded permutation π_s,
/// so the previous token carries information. The entropy rate
/// `H = Σ_s μ_s Σ_j −P(j|s) ln P(j|s)` (μ the stationary distribution, found by power
/// iteration to 1e-15 in f64) is the lowest expected loss any model can reach.
#[derive(Clone, Debug)]
pub struct MarkovSource {
    pub vocab: usize,
    /// Row-major cumulative transition probabilities.
    cdf: Vec<f64>,
    pub stationary: Vec<f64>,
    /// nats per token.
    pub entropy_rate: f64,
}

impl MarkovSource {
    pub const GLOBAL_EXPONENT: f64 = 1.1;
    pub const STATE_EXPONENT: f64 = 1.0;

    pub fn new(vocab: usize, seed: u64) -> Result<Self> {
        if !(2..=65_536).contains(&vocab) {
            bail!("--vocab must be in 2..=65536, got {vocab} (flag --vocab)");
        }
        let v = vocab;
        gradkit_core::budget::check(
            &format!("--vocab {v}: the synthetic-lm source's {v}×{v} transition matrix"),
            gradkit_core::budget::product(&[v as u128, v as u128, 8]),
        )?;
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6d61_726b_6f76);
        let mut p = vec![0f64; v * v];
        let mut perm: Vec<usize> = (0..v).collect();
        for s in 0..v {
            // Fisher-Yates with our own RNG (stable across rand versions).
            for i in (1..v).rev() {
                let j = rng.gen_range(0..=i);
                perm.swap(i, j);
            }
            let row = &mut p[s * v..(s + 1) * v];
            for j in 0..v {
                row[j] = ((j + 1) as f64).powf(-Self::GLOBAL_EXPONENT)
                    * ((perm[j] + 1) as f64).powf(-Self::STATE_EXPONENT);
            }
            let z: f64 = row.iter().sum();
            row.iter_mut().for_each(|x| *x /= z);
        }
        let stationary = stationary(&p, v);
        let mut h = 0.0;
        for s in 0..v {
            let row = &p[s * v..(s + 1) * v];
            let hs: f64 = row.iter().filter(|x| **x > 0.0).map(|x| -x * x.ln()).sum();
            h += stationary[s] * hs;
        }
        let mut cdf = p;
        for s in 0..v {
            let row = &mut cdf[s * v..(s + 1) * v];
            let mut acc = 0.0;
            for x in row.iter_mut() {
                acc += *x;
                *x = acc;
            }
            row[v - 1] = 1.0;
        }
        Ok(MarkovSource {
            vocab,
            cdf,
            stationary,
            entropy_rate: h,
        })
    }

    /// `n` tokens, starting from a draw of the stationary distribution.
    pub fn sample(&self, n: usize, seed: u64) -> Vec<u32> {
        let v = self.vocab;
        let mut rng = StdRng::seed_from_u64(seed ^ 0x636f_7270_7573);
        let u: f64 = rng.gen();
        let mut acc = 0.0;
        let mut s = v - 1;
        for (i, m) in self.stationary.iter().enumerate() {
            acc += m;
            if u < acc {
                s = i;
                break;
            }
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(s as u32);
            let row = &self.cdf[s * v..(s + 1) * v];
            let u: f64 = rng.gen();
            s = row.partition_point(|c| *c <= u).min(v - 1);
        }
        out
    }
}

fn stationary(p: &[f64], v: usize) -> Vec<f64> {
    let mut mu = vec![1.0 / v as f64; v];
    let mut next = vec![0.0; v];
    for _ in 0..100_000 {
        next.iter_mut().for_each(|x| *x = 0.0);
        for s in 0..v {
            let m = mu[s];
            let row = &p[s * v..(s + 1) * v];
            for (n, q) in next.iter_mut().zip(row) {
                *n += m * q;
            }
        }
        let z: f64 = next.iter().sum();
        next.iter_mut().for_each(|x| *x /= z);
        let diff: f64 = mu.iter().zip(&next).map(|(a, b)| (a - b).abs()).sum();
        std::mem::swap(&mut mu, &mut next);
        if diff < 1e-15 {
            break;
        }
    }
    mu
}

/// Mixes seed, rank and step into one RNG seed (splitmix64 finaliser).
pub fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed
        .wrapping_add(a.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(b.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One rank's share of the training data and how to draw its batches.
#[derive(Clone, Debug)]
pub struct Shard {
    data: Dataset,
    rank: usize,
    /// Classification: the training rows of this rank (`i % P == rank`).
    rows: Vec<usize>,
    /// LM: this rank's contiguous token range.
    range: (usize, usize),
    pub seq_len: usize,
}

impl Shard {
    /// Rank `rank` of `p`; fails when a batch of `batch` cannot be drawn from the shard.
    pub fn new(
        data: &Dataset,
        rank: usize,
        p: usize,
        batch: usize,
        seq_len: usize,
    ) -> Result<Shard> {
        if batch == 0 {
            bail!("--batch must be at least 1 (flag --batch)");
        }
        match data {
            Dataset::Class(c) => {
                let rows: Vec<usize> = (0..c.train_len()).filter(|i| i % p == rank).collect();
                if batch > rows.len() {
                    bail!(
                        "--batch {batch} is larger than rank {rank}'s shard of {} training examples ({} examples over {p} ranks) (flag --batch)",
                        rows.len(),
                        c.train_len()
                    );
                }
                Ok(Shard {
                    data: data.clone(),
                    rank,
                    rows,
                    range: (0, 0),
                    seq_len,
                })
            }
            Dataset::Lm(l) => {
                let per = l.train.len() / p;
                let range = (rank * per, (rank + 1) * per);
                let windows = per.saturating_sub(seq_len);
                if seq_len == 0 {
                    bail!("--seq-len must be at least 1 (flag --seq-len)");
                }
                if batch > windows {
                    bail!(
                        "--batch {batch} is larger than rank {rank}'s shard: {per} tokens give {windows} windows of {} tokens (flag --batch)",
                        seq_len + 1
                    );
                }
                Ok(Shard {
                    data: data.clone(),
                    rank,
                    rows: Vec::new(),
                    range,
                    seq_len,
                })
            }
        }
    }

    /// The batch of `step`: `b` distinct examples (windows) drawn from the shard by a seeded
    /// RNG that depends only on (seed, rank, step).
    pub fn batch(&self, seed: u64, step: u32, b: usize) -> Batch {
        let mut rng = StdRng::seed_from_u64(mix(seed, self.rank as u64 + 1, step as u64 + 1));
        match &self.data {
            Dataset::Class(c) => {
                let pick = rand::seq::index::sample(&mut rng, self.rows.len(), b);
                let mut x = Vec::with_capacity(b * c.dim);
                let mut y = Vec::with_capacity(b);
                for i in pick.iter() {
                    let r = self.rows[i];
                    x.extend_from_slice(&c.train_x[r * c.dim..(r + 1) * c.dim]);
                    y.push(c.train_y[r]);
                }
                Batch::Class { x, y, b }
            }
            Dataset::Lm(l) => {
                let t = self.seq_len;
                let windows = self.range.1 - self.range.0 - t;
                let pick = rand::seq::index::sample(&mut rng, windows, b);
                let mut x = Vec::with_capacity(b * t);
                let mut y = Vec::with_capacity(b * t);
                for i in pick.iter() {
                    let s = self.range.0 + i;
                    x.extend_from_slice(&l.train[s..s + t]);
                    y.extend_from_slice(&l.train[s + 1..s + t + 1]);
                }
                Batch::Lm { x, y, b, t }
            }
        }
    }
}

/// Logits per language-model evaluation batch, at most (64 MiB of f32).
const EVAL_LOGITS: usize = 1 << 24;

/// The evaluation batches: the whole test set (classification) or up to `max_windows`
/// non-overlapping windows of the test tokens (LM), in chunks of `chunk` examples.
pub fn eval_batches(
    data: &Dataset,
    seq_len: usize,
    chunk: usize,
    max_windows: usize,
) -> Vec<Batch> {
    let mut out = Vec::new();
    match data {
        Dataset::Class(c) => {
            let n = c.test_y.len();
            let mut i = 0;
            while i < n {
                let e = (i + chunk).min(n);
                out.push(Batch::Class {
                    x: c.test_x[i * c.dim..e * c.dim].to_vec(),
                    y: c.test_y[i..e].to_vec(),
                    b: e - i,
                });
                i = e;
            }
        }
        Dataset::Lm(l) => {
            let t = seq_len;
            let nw = ((l.test.len().saturating_sub(1)) / t).min(max_windows);
            // At most EVAL_LOGITS logits (T × V floats, plus softmax temporaries) per batch:
            // with a 100k vocabulary, 256 windows of 8 tokens took 4 GB at the final evaluation.
            let chunk = chunk.min((EVAL_LOGITS / (t * l.vocab).max(1)).max(1));
            let mut w = 0;
            while w < nw {
                let e = (w + chunk).min(nw);
                let mut x = Vec::new();
                let mut y = Vec::new();
                for k in w..e {
                    x.extend_from_slice(&l.test[k * t..k * t + t]);
                    y.extend_from_slice(&l.test[k * t + 1..k * t + t + 1]);
                }
                out.push(Batch::Lm { x, y, b: e - w, t });
                w = e;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data file whose first page is garbled is named, and the Parquet decoder's message
    /// follows once, not under two prefixes (`Parquet argument error: Parquet error: …`).
    #[test]
    fn a_damaged_data_file_names_the_decoders_message_once() {
        let labels: ArrayRef = Arc::new(arrow_array::Int64Array::from_iter_values(0..64));
        let batch = RecordBatch::try_from_iter([("label", labels)]).unwrap();
        let mut bytes = Vec::new();
        let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        assert!(read_parquet(Bytes::from(bytes.clone()), "d.parquet").is_ok());
        // The first column chunk's first page header starts right after the magic `PAR1`.
        for b in &mut bytes[4..16] {
            *b ^= 0xff;
        }
        let e = read_parquet(Bytes::from(bytes), "d.parquet")
            .err()
            .expect("a damaged page was read");
        let msg = gradkit_core::cli::chain_text(&e);
        assert!(
            msg.starts_with("d.parquet: cannot decode: Parquet error: "),
            "{msg}"
        );
        assert_eq!(msg.matches("Parquet").count(), 1, "{msg}");
    }
}
