//! Synthetic gradient traces that behave like real ones (what `gradtrace synthetic` writes).
//!
//! The algorithms downstream depend on four properties of real gradients, and each has one knob:
//!
//! * **per-layer scales** that differ by orders of magnitude (DEFT's norm-based allocation):
//!   layer `l` gets an element scale `s_l = 10^u / sqrt(fan_in)`, `u ~ U[-1, 1]` drawn from the
//!   seed, so norms spread over orders of magnitude on top of the spread of layer sizes;
//! * **heavy tails**: a value is `s_l · z · exp(h·z²/2)` (Tukey's h-transform of a standard
//!   normal `z`; `h = --tail`, 0 is Gaussian, 0.2 has power-law tails of index 5 like a
//!   Student-t with 5 degrees of freedom). The transform is monotone in `|z|`, so the top-k set
//!   of a layer is the top-k set of `|z|`;
//! * **drift across steps** (Ok-Topk's threshold reuse): `z` follows a stationary AR(1) in the
//!   step, `corr(z[t], z[t+1]) = ρ` (`--drift`), so large coordinates stay large;
//! * **a shared component plus per-rank noise**: `z[t,r] = √o·S[t] + √(1−o)·N[t,r]` with `S`
//!   and every `N[·,r]` independent AR(1) processes, so `corr(z[t,r], z[t,r']) = o`
//!   (`--overlap`) and workers' top-k sets overlap partially.
//!
//! Every (layer, component) draws from its own seeded stream, so the bytes depend only on the
//! seed and the parameters (and a rank's values do not change when ranks are added).

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::tables::TensorRow;

/// One parameter tensor of a model: its name and shape (numel is the product).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    pub name: String,
    pub shape: Vec<u32>,
}

impl LayerSpec {
    pub fn new(name: &str, shape: &[u32]) -> Self {
        LayerSpec {
            name: name.to_string(),
            shape: shape.to_vec(),
        }
    }
    /// The product of the dimensions; `u64::MAX` when it overflows (then refused by
    /// [`SynthSpec::check`] as more than a layer can hold).
    pub fn numel(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
            .unwrap_or(u64::MAX)
    }
    /// Inputs per output: numel over the first dimension (1 for vectors).
    fn fan_in(&self) -> u64 {
        if self.shape.len() < 2 {
            1
        } else {
            (self.numel() / self.shape[0].max(1) as u64).max(1)
        }
    }
}

/// What to generate. See the module documentation for the model.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub layers: Vec<LayerSpec>,
    pub ranks: u32,
    pub steps: u32,
    pub seed: u64,
    /// Correlation between ranks at one step (0 = independent workers, 1 = identical).
    pub overlap: f64,
    /// AR(1) coefficient: correlation of a coordinate between consecutive steps.
    pub drift: f64,
    /// Tukey h of the heavy tail (0 = Gaussian).
    pub tail: f64,
}

impl SynthSpec {
    /// A spec with the defaults of `gradtrace synthetic`.
    pub fn new(layers: Vec<LayerSpec>, ranks: u32, steps: u32, seed: u64) -> Self {
        SynthSpec {
            layers,
            ranks,
            steps,
            seed,
            overlap: DEFAULT_OVERLAP,
            drift: DEFAULT_DRIFT,
            tail: DEFAULT_TAIL,
        }
    }
    pub fn check(&self) -> Result<()> {
        if self.layers.is_empty() {
            bail!("no layers (--shape or --layers)");
        }
        if self.ranks == 0 {
            bail!("--ranks must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.overlap) {
            bail!("--overlap must lie in [0, 1], got {}", self.overlap);
        }
        if !(0.0..=1.0).contains(&self.drift) {
            bail!("--drift must lie in [0, 1], got {}", self.drift);
        }
        if !(0.0..=0.5).contains(&self.tail) {
            bail!(
                "--tail must lie in [0, 0.5] (larger has infinite variance), got {}",
                self.tail
            );
        }
        let mut seen = std::collections::HashSet::new();
        for l in &self.layers {
            if l.numel() == 0 {
                bail!("layer `{}` has no elements (--layers)", l.name);
            }
            if l.numel() > u32::MAX as u64 {
                bail!(
                    "layer `{}` has {} elements; tensor/1 indexes a layer with u32",
                    l.name,
                    l.numel()
                );
            }
            if !seen.insert(l.name.as_str()) {
                bail!("layer `{}` appears twice (--layers)", l.name);
            }
        }
        Ok(())
    }
}

pub const DEFAULT_OVERLAP: f64 = 0.6;
pub const DEFAULT_DRIFT: f64 = 0.9;
pub const DEFAULT_TAIL: f64 = 0.2;

/// The model shapes `--shape` knows.
pub const SHAPES: &[&str] = &["mlp", "vgg16", "lstm", "bert-base"];

/// The parameters of a named model, in PyTorch's `named_parameters()` order, each layer's first
/// dimension multiplied by `scale` (at least 1) so numel shrinks by about `scale`.
pub fn shape(name: &str, scale: f64) -> Result<Vec<LayerSpec>> {
    if !(scale > 0.0 && scale <= 1.0) {
        bail!("--scale must lie in (0, 1], got {scale}");
    }
    let layers = match name {
        "mlp" => mlp(),
        "vgg16" => vgg16_cifar(),
        "lstm" => lstm_wikitext2(),
        "bert-base" => bert_base(),
        other => bail!(
            "unknown shape `{other}` (--shape); known: {}",
            SHAPES.join(", ")
        ),
    };
    Ok(layers
        .into_iter()
        .map(|mut l| {
            if scale < 1.0 {
                l.shape[0] = ((l.shape[0] as f64 * scale).round() as u32).max(1);
            }
            l
        })
        .collect())
}

/// A 784-512-512-10 MLP for MNIST (`fc1`, `fc2`, `fc3`): 669,706 parameters.
fn mlp() -> Vec<LayerSpec> {
    let mut v = Vec::new();
    for (name, o, i) in [("fc1", 512, 784), ("fc2", 512, 512), ("fc3", 10, 512)] {
        v.push(LayerSpec::new(&format!("{name}.weight"), &[o, i]));
        v.push(LayerSpec::new(&format!("{name}.bias"), &[o]));
    }
    v
}

/// VGG-16 with batch norm for CIFAR-10 (the model of Ok-Topk's Table 2, 14,728,266
/// parameters): `features.N` conv/bn modules in `nn.Sequential` numbering, `classifier`.
fn vgg16_cifar() -> Vec<LayerSpec> {
    const CFG: [u32; 18] = [
        64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0,
    ];
    let mut v = Vec::new();
    let (mut idx, mut cin) = (0u32, 3u32);
    for &c in &CFG {
        if c == 0 {
            idx += 1; // MaxPool2d
            continue;
        }
        v.push(LayerSpec::new(
            &format!("features.{idx}.weight"),
            &[c, cin, 3, 3],
        ));
        v.push(LayerSpec::new(&format!("features.{idx}.bias"), &[c]));
        v.push(LayerSpec::new(
            &format!("features.{}.weight", idx + 1),
            &[c],
        ));
        v.push(LayerSpec::new(&format!("features.{}.bias", idx + 1), &[c]));
        idx += 3; // Conv2d, BatchNorm2d, ReLU
        cin = c;
    }
    v.push(LayerSpec::new("classifier.weight", &[10, 512]));
    v.push(LayerSpec::new("classifier.bias", &[10]));
    v
}

/// The 3-layer, 650-unit LSTM language model on WikiText-2 with tied embeddings (PowerSGD's and
/// DEFT's LSTM, 28,949,319 parameters; PyTorch `RNNModel` names).
fn lstm_wikitext2() -> Vec<LayerSpec> {
    const VOCAB: u32 = 28869;
    const H: u32 = 650;
    let mut v = vec![LayerSpec::new("encoder.weight", &[VOCAB, H])];
    for l in 0..3 {
        v.push(LayerSpec::new(&format!("rnn.weight_ih_l{l}"), &[4 * H, H]));
        v.push(LayerSpec::new(&format!("rnn.weight_hh_l{l}"), &[4 * H, H]));
        v.push(LayerSpec::new(&format!("rnn.bias_ih_l{l}"), &[4 * H]));
        v.push(LayerSpec::new(&format!("rnn.bias_hh_l{l}"), &[4 * H]));
    }
    v.push(LayerSpec::new("decoder.bias", &[VOCAB]));
    v
}

/// BERT-base (uncased) encoder, Hugging Face `BertModel` names: 109,482,240 parameters.
fn bert_base() -> Vec<LayerSpec> {
    const H: u32 = 768;
    const FF: u32 = 3072;
    let mut v = vec![
        LayerSpec::new("embeddings.word_embeddings.weight", &[30522, H]),
        LayerSpec::new("embeddings.position_embeddings.weight", &[512, H]),
        LayerSpec::new("embeddings.token_type_embeddings.weight", &[2, H]),
        LayerSpec::new("embeddings.LayerNorm.weight", &[H]),
        LayerSpec::new("embeddings.LayerNorm.bias", &[H]),
    ];
    for i in 0..12 {
        let p = format!("encoder.layer.{i}");
        for m in ["query", "key", "value"] {
            v.push(LayerSpec::new(
                &format!("{p}.attention.self.{m}.weight"),
                &[H, H],
            ));
            v.push(LayerSpec::new(
                &format!("{p}.attention.self.{m}.bias"),
                &[H],
            ));
        }
        v.push(LayerSpec::new(
            &format!("{p}.attention.output.dense.weight"),
            &[H, H],
        ));
        v.push(LayerSpec::new(
            &format!("{p}.attention.output.dense.bias"),
            &[H],
        ));
        v.push(LayerSpec::new(
            &format!("{p}.attention.output.LayerNorm.weight"),
            &[H],
        ));
        v.push(LayerSpec::new(
            &format!("{p}.attention.output.LayerNorm.bias"),
            &[H],
        ));
        v.push(LayerSpec::new(
            &format!("{p}.intermediate.dense.weight"),
            &[FF, H],
        ));
        v.push(LayerSpec::new(
            &format!("{p}.intermediate.dense.bias"),
            &[FF],
        ));
        v.push(LayerSpec::new(
            &format!("{p}.output.dense.weight"),
            &[H, FF],
        ));
        v.push(LayerSpec::new(&format!("{p}.output.dense.bias"), &[H]));
        v.push(LayerSpec::new(
            &format!("{p}.output.LayerNorm.weight"),
            &[H],
        ));
        v.push(LayerSpec::new(&format!("{p}.output.LayerNorm.bias"), &[H]));
    }
    v.push(LayerSpec::new("pooler.dense.weight", &[H, H]));
    v.push(LayerSpec::new("pooler.dense.bias", &[H]));
    v
}

/// Parses `--layers "fc1.weight=512x784,fc1.bias=512,…"`: `NAME=N` (a vector of N) or
/// `NAME=D0xD1x…` (a shape).
pub fn parse_layers(spec: &str) -> Result<Vec<LayerSpec>> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, dims) = item
            .split_once('=')
            .with_context(|| format!("`{item}` is not NAME=SIZE (--layers)"))?;
        let name = name.trim();
        if name.is_empty() {
            bail!("`{item}` has an empty layer name (--layers)");
        }
        let shape = dims
            .split(['x', 'X', '*'])
            .map(|d| {
                d.trim()
                    .parse::<u32>()
                    .with_context(|| format!("`{d}` in `{item}` is not a size (--layers)"))
            })
            .collect::<Result<Vec<u32>>>()?;
        out.push(LayerSpec {
            name: name.to_string(),
            shape,
        });
    }
    if out.is_empty() {
        bail!("no layers given (--layers \"fc1.weight=4096,fc1.bias=64\")");
    }
    Ok(out)
}

/// SplitMix64: turns (seed, layer, component) into independent stream seeds (also
/// [`crate::expand`]'s).
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn stream(seed: u64, layer: usize, component: u64) -> StdRng {
    StdRng::seed_from_u64(mix(mix(mix(seed) ^ layer as u64) ^ component))
}

/// Component id of the per-layer scale stream (ranks use 1 + rank, the shared part 0).
const SCALE_STREAM: u64 = u64::MAX;

/// The element scale `s_l` of every layer (see the module documentation).
pub fn layer_scales(spec: &SynthSpec) -> Vec<f64> {
    spec.layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let u: f64 = stream(spec.seed, i, SCALE_STREAM).gen_range(-1.0..1.0);
            10f64.powf(u) / (l.fan_in() as f64).sqrt()
        })
        .collect()
}

/// One AR(1) process over a layer's coordinates: its state and its random stream.
struct Ar1 {
    rng: StdRng,
    state: Vec<f32>,
}

impl Ar1 {
    fn new(rng: StdRng, n: usize) -> Self {
        Ar1 {
            rng,
            state: vec![0.0; n],
        }
    }
    /// Moves one step: x ← ρx + √(1−ρ²)ε (at the first step x ← ε, the stationary law).
    fn advance(&mut self, first: bool, rho: f64) {
        let (a, b) = if first {
            (0.0, 1.0)
        } else {
            (rho, (1.0 - rho * rho).max(0.0).sqrt())
        };
        for x in &mut self.state {
            let e: f64 = self.rng.sample(StandardNormal);
            *x = (a * *x as f64 + b * e) as f32;
        }
    }
}

/// Streams the trace one (step, rank) at a time, step-major, each item holding that pair's
/// dense rows in layer order. Memory is (ranks + 1) × the model's size, or 2 × for the
/// generator of one rank ([`Generator::for_rank`]).
pub struct Generator {
    spec: SynthSpec,
    scales: Vec<f64>,
    shared: Vec<Ar1>,
    /// The ranks generated (all of them, or one), and their noise processes.
    rank_ids: Vec<u32>,
    ranks: Vec<Vec<Ar1>>,
    step: u32,
    /// Position in `rank_ids` of the next item.
    pos: usize,
}

impl Generator {
    pub fn new(spec: &SynthSpec) -> Result<Self> {
        Self::of_ranks(spec, (0..spec.ranks).collect())
    }

    /// The items of rank `rank` alone, step by step: the same values as [`Generator::new`]'s
    /// items of that rank (each rank's noise has a random stream of its own), at the cost of
    /// one rank. This is how a rank makes its own gradient without the others' (e.g.
    /// `gradallreduce bench` under mpirun).
    pub fn for_rank(spec: &SynthSpec, rank: u32) -> Result<Self> {
        if rank >= spec.ranks {
            bail!("rank {rank} is not one of the spec's {} ranks", spec.ranks);
        }
        Self::of_ranks(spec, vec![rank])
    }

    fn of_ranks(spec: &SynthSpec, rank_ids: Vec<u32>) -> Result<Self> {
        spec.check()?;
        // The AR(1) states of the shared and per-rank streams, the item being written and
        // the writer's buffers: about ranks + 3 f32 copies of the model.
        let n: u128 = spec.layers.iter().map(|l| l.numel() as u128).sum();
        crate::budget::check(
            &format!(
                "a synthetic model of {n} elements (--shape/--layers) on {} of --ranks {}",
                rank_ids.len(),
                spec.ranks
            ),
            crate::budget::product(&[n, rank_ids.len() as u128 + 3, 4]),
        )?;
        let scales = layer_scales(spec);
        let shared = spec
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| Ar1::new(stream(spec.seed, i, 0), l.numel() as usize))
            .collect();
        let ranks = rank_ids
            .iter()
            .map(|&r| {
                spec.layers
                    .iter()
                    .enumerate()
                    .map(|(i, l)| Ar1::new(stream(spec.seed, i, 1 + r as u64), l.numel() as usize))
                    .collect()
            })
            .collect();
        Ok(Generator {
            spec: spec.clone(),
            scales,
            shared,
            rank_ids,
            ranks,
            step: 0,
            pos: 0,
        })
    }

    /// Number of (step, rank) items the generator yields.
    pub fn len(&self) -> u64 {
        self.spec.steps as u64 * self.rank_ids.len() as u64
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Iterator for Generator {
    type Item = Vec<TensorRow>;

    fn next(&mut self) -> Option<Vec<TensorRow>> {
        if self.step >= self.spec.steps {
            return None;
        }
        let (step, pos) = (self.step, self.pos);
        let rank = self.rank_ids[pos];
        let first = step == 0;
        if pos == 0 {
            for s in &mut self.shared {
                s.advance(first, self.spec.drift);
            }
        }
        let wa = self.spec.overlap.sqrt();
        let wb = (1.0 - self.spec.overlap).max(0.0).sqrt();
        let h = self.spec.tail;
        let mut rows = Vec::with_capacity(self.spec.layers.len());
        for (i, l) in self.spec.layers.iter().enumerate() {
            let noise = &mut self.ranks[pos][i];
            noise.advance(first, self.spec.drift);
            let s = self.scales[i];
            let values = self.shared[i]
                .state
                .iter()
                .zip(&noise.state)
                .map(|(&a, &b)| {
                    let z = wa * a as f64 + wb * b as f64;
                    (s * z * (0.5 * h * z * z).exp()) as f32
                })
                .collect();
            rows.push(TensorRow {
                step,
                rank,
                layer_id: i as u32,
                layer: l.name.clone(),
                numel: l.numel(),
                shape: Some(l.shape.clone()),
                indices: None,
                values,
            });
        }
        self.pos += 1;
        if self.pos == self.rank_ids.len() {
            self.pos = 0;
            self.step += 1;
        }
        Some(rows)
    }
}

/// The whole trace in memory: rows ordered by step, rank, layer.
pub fn generate(spec: &SynthSpec) -> Result<Vec<TensorRow>> {
    Ok(Generator::new(spec)?.flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_sizes_match_the_published_parameter_counts() {
        let total = |n: &str| -> u64 { shape(n, 1.0).unwrap().iter().map(|l| l.numel()).sum() };
        assert_eq!(total("vgg16"), 14_728_266); // Ok-Topk Table 2
        assert_eq!(total("lstm"), 28_949_319); // PowerSGD / DEFT LSTM on WikiText-2
        assert_eq!(total("bert-base"), 109_482_240); // bert-base-uncased BertModel
        assert_eq!(total("mlp"), 784 * 512 + 512 + 512 * 512 + 512 + 5120 + 10);
    }

    #[test]
    fn parse_layers_reads_sizes_and_shapes() {
        let l = parse_layers("fc1.weight=64x32, fc1.bias=64").unwrap();
        assert_eq!(l[0], LayerSpec::new("fc1.weight", &[64, 32]));
        assert_eq!(l[1], LayerSpec::new("fc1.bias", &[64]));
        assert!(parse_layers("fc1").is_err());
        assert!(parse_layers("a=x").is_err());
    }
}
