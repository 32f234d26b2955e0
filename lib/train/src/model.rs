//! The models, built from candle-nn layers with candle's autodiff: `mlp`, `cnn` (a small
//! VGG-style conv net), `transformer-lm` (a tiny GPT with a large embedding table) and
//! `lstm-lm` (candle-nn's LSTM). Parameters are initialised from our own seeded RNG (candle's
//! CPU RNG cannot be seeded), and travel between candle and the optimisers as one flat `f32`
//! vector in a fixed layer order (parameter names sorted), the same flat index space the
//! collectives use ([`Layout`]).

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, IndexOp, Module, Tensor, Var, D};
use candle_nn::{Conv2d, Conv2dConfig, Embedding, Linear, VarBuilder, VarMap};
use gradkit_core::trace::Layout;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::data::{Batch, Dataset};

/// `--model` values.
pub const MODELS: &[(&str, &str)] = &[
    ("mlp", "64-128-128-C perceptron with ReLU (classification)"),
    (
        "cnn",
        "VGG-style: 2×[conv3×3, conv3×3, maxpool] + 2 dense layers (8×8 images)",
    ),
    (
        "transformer-lm",
        "GPT-style decoder: token + position embeddings, pre-LN blocks, untied output head",
    ),
    (
        "lstm-lm",
        "embedding → one LSTM layer (candle-nn) → output head",
    ),
];

/// Sizes of the models (defaults are the tiny models of docs/gradtrain.md).
#[derive(Clone, Debug)]
pub struct ModelSpec {
    pub name: String,
    /// mlp hidden width; LSTM hidden size.
    pub hidden: usize,
    /// transformer/LSTM embedding width.
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub seq_len: usize,
}

impl Default for ModelSpec {
    fn default() -> Self {
        ModelSpec {
            name: "mlp".into(),
            hidden: 128,
            d_model: 64,
            layers: 2,
            heads: 4,
            seq_len: 32,
        }
    }
}

struct Block {
    ln1: (Tensor, Tensor),
    qkv: Linear,
    proj: Linear,
    ln2: (Tensor, Tensor),
    fc: Linear,
    out: Linear,
}

enum Net {
    Mlp(Vec<Linear>),
    Cnn {
        convs: Vec<Conv2d>,
        fcs: Vec<Linear>,
        side: usize,
    },
    Transformer {
        /// `None` when the token embedding lives outside the model (sharded, [`Model::new_sharded`]).
        wte: Option<Embedding>,
        wpe: Tensor,
        blocks: Vec<Block>,
        lnf: (Tensor, Tensor),
        head: Linear,
        heads: usize,
    },
    Lstm {
        emb: Option<Embedding>,
        lstm: candle_nn::LSTM,
        head: Linear,
    },
}

/// A model with its parameters (candle `Var`s) in layout order.
pub struct Model {
    pub name: String,
    net: Net,
    vars: Vec<(String, Var)>,
    layout: Layout,
    /// The token embedding when it is held outside the model ([`Model::new_sharded`]).
    external: Option<ExternalEmbedding>,
    device: Device,
    /// Keeps the variables alive (the layers hold their tensors).
    _varmap: VarMap,
}

/// The device models run on: CPU, or the first CUDA GPU when gradkit-train is built with its
/// `candle-cuda` feature (gradtrain's `candle-cuda`).
pub fn device() -> Result<Device> {
    #[cfg(feature = "candle-cuda")]
    {
        if let Ok(d) = Device::new_cuda(0) {
            return Ok(d);
        }
    }
    Ok(Device::Cpu)
}

fn layer_norm(x: &Tensor, p: &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
    // Written with primitive ops so candle's autodiff covers it (its fused kernel has no
    // backward pass).
    let d = x.dim(D::Minus1)? as f64;
    let mean = (x.sum_keepdim(D::Minus1)? / d)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / d)?;
    let xn = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
    xn.broadcast_mul(&p.0)?.broadcast_add(&p.1)
}

/// 2×2 max pooling from reshape + max. candle 0.11's `max_pool2d` backward scales the
/// gradient of a unique maximum by 1/4 (it multiplies by the window's tie fraction instead
/// of dividing by the tie count); our finite-difference test caught it.
fn max_pool_2x2(x: &Tensor) -> candle_core::Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    x.reshape((b, c, h / 2, 2, w / 2, 2))?.max(5)?.max(3)
}

fn ln_params(vb: &VarBuilder, d: usize) -> candle_core::Result<(Tensor, Tensor)> {
    Ok((
        vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
        vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
    ))
}

/// A token embedding the model does not hold (EmbRace's sharded table, docs/gradtrain.md): its name
/// and shape, and where it sits in the full model's layout.
#[derive(Clone, Debug)]
pub struct ExternalEmbedding {
    /// `wte.weight` or `emb.weight`.
    pub name: String,
    pub vocab: usize,
    pub width: usize,
    /// The full model's layout (the embedding included), for reports and checkpoints.
    pub full_layout: Layout,
    /// Its offset in that layout (the held parameters before it come first).
    pub offset: usize,
    seed: u64,
}

impl Model {
    /// Builds `spec.name` for `data`, with parameters drawn from `seed`.
    pub fn new(spec: &ModelSpec, data: &Dataset, seed: u64) -> Result<Model> {
        Self::build(spec, data, seed, false)
    }

    /// As [`Model::new`] for a language model, but without its token embedding: no rank
    /// allocates the V × d table (EmbRace, embrace.md §1.1: the table lives in column shards);
    /// the forward takes the looked-up rows ([`Model::loss_and_grad_rows`]). The held
    /// parameters and the embedding's initial values ([`Model::embedding_init`]) equal those of
    /// `Model::new` with the same seed.
    pub fn new_sharded(spec: &ModelSpec, data: &Dataset, seed: u64) -> Result<Model> {
        Self::build(spec, data, seed, true)
    }

    fn build(spec: &ModelSpec, data: &Dataset, seed: u64, shard: bool) -> Result<Model> {
        let device = device()?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let net = build_net(spec, data, &vb, shard)?;
        let mut vars: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .map_err(|_| anyhow::anyhow!("variable map poisoned"))?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let entries: Vec<(String, Vec<usize>)> = vars
            .iter()
            .map(|(n, v)| (n.clone(), v.dims().to_vec()))
            .collect();
        let external = match (shard, data) {
            (true, Dataset::Lm(l)) => Some(ExternalEmbedding::new(
                if spec.name == "lstm-lm" {
                    "emb.weight"
                } else {
                    "wte.weight"
                },
                l.vocab,
                spec.d_model,
                &entries,
                seed,
            )),
            (true, Dataset::Class(_)) => bail!("only a language model's embedding can be sharded"),
            (false, _) => None,
        };
        let m = Model {
            name: spec.name.clone(),
            net,
            vars,
            layout: layout_of(&entries),
            external,
            device,
            _varmap: varmap,
        };
        m.set_flat(&m.init_params(seed))?;
        Ok(m)
    }

    /// The token embedding held outside this model, if any ([`Model::new_sharded`]).
    pub fn external_embedding(&self) -> Option<&ExternalEmbedding> {
        self.external.as_ref()
    }

    /// Every parameter tensor of the full model in layout order (name, shape), the external
    /// embedding included.
    fn full_entries(&self) -> Vec<(String, Vec<usize>)> {
        match &self.external {
            Some(e) => entries_of(&e.full_layout),
            None => entries_of(&self.layout),
        }
    }

    /// Columns `cols` of the external embedding's initial values (V × |cols|, row-major):
    /// the same seeded draws as the full model's, replayed without keeping the table.
    pub fn embedding_init(&self, cols: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let e = self
            .external
            .as_ref()
            .context("the model holds its embedding")?;
        let mut out = Vec::with_capacity(e.vocab * cols.len());
        let mut k = 0usize;
        let mut keep = |x| {
            if cols.contains(&(k % e.width)) {
                out.push(x);
            }
            k += 1;
        };
        init_values(&self.full_entries(), e.seed, Some(&e.name), &mut keep, None);
        Ok(out)
    }

    /// Seeded initial values of the held parameters: biases 0, LayerNorm gains 1, embeddings
    /// U(±0.1), other weights U(±1/√fan_in) (PyTorch's default for Linear, Conv and LSTM).
    /// An external embedding's values are drawn (so every other tensor gets the same values as
    /// in the full model) but not kept.
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.layout.total() as usize);
        let skip = self.external.as_ref().map(|e| e.name.as_str());
        init_values(
            &self.full_entries(),
            seed,
            skip,
            &mut |_| {},
            Some(&mut out),
        );
        out
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Each parameter tensor's `(offset, numel)` in the flat vector (the optimizers' segments).
    pub fn segments(&self) -> Vec<(usize, usize)> {
        self.layout
            .layers
            .iter()
            .map(|l| (l.offset as usize, l.numel as usize))
            .collect()
    }
    pub fn n_params(&self) -> usize {
        self.layout.total() as usize
    }
    /// Parameters of the full model, an external embedding included.
    pub fn n_params_full(&self) -> usize {
        self.external
            .as_ref()
            .map_or(self.layout.total(), |e| e.full_layout.total()) as usize
    }
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The parameters as one flat vector in layout order.
    pub fn get_flat(&self) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.n_params());
        for (_, v) in &self.vars {
            out.extend(v.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// Overwrites layer `i` of the layout (`--schedule 2d` writes one block at a time).
    pub fn set_layer(&self, i: usize, vals: &[f32]) -> Result<()> {
        let v = &self.vars.get(i).context("no such layer")?.1;
        if vals.len() != v.elem_count() {
            bail!(
                "layer {i} has {} values, got {}",
                v.elem_count(),
                vals.len()
            );
        }
        v.set(&Tensor::from_slice(vals, v.dims(), &self.device)?)?;
        Ok(())
    }

    /// Overwrites the parameters from a flat vector in layout order.
    pub fn set_flat(&self, flat: &[f32]) -> Result<()> {
        if flat.len() != self.n_params() {
            bail!(
                "parameter vector has {} values, model has {}",
                flat.len(),
                self.n_params()
            );
        }
        for ((_, v), l) in self.vars.iter().zip(&self.layout.layers) {
            let seg = &flat[l.offset as usize..(l.offset + l.numel) as usize];
            v.set(&Tensor::from_slice(seg, v.dims(), &self.device)?)?;
        }
        Ok(())
    }

    /// `before(k)` is called before FP stage `k` reads its parameters (`--schedule 2d`,
    /// embrace.md §2.1; [`crate::schedule::fp_groups`]): transformer-lm 0 = embeddings,
    /// 1 + i = block i, L + 1 = final LN and head; lstm-lm 0 and 1 first; others never.
    fn logits(
        &self,
        batch: &Batch,
        before: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Tensor, Tensor)> {
        self.logits_rows(batch, before, None)
    }

    /// The token embeddings of an LM batch (`b × t × d`): looked up in the model's own table,
    /// or the given rows (`b·t × d`, token order) for an external embedding.
    fn embed(
        &self,
        table: Option<&Embedding>,
        rows: Option<&Tensor>,
        x: &[u32],
        bt: (usize, usize),
    ) -> Result<Tensor> {
        match (table, rows) {
            (Some(e), None) => Ok(e.forward(&Tensor::from_slice(x, bt, &self.device)?)?),
            (None, Some(r)) => Ok(r.reshape((bt.0, bt.1, r.dim(1)?))?),
            (Some(_), Some(_)) => bail!("the model holds its token embedding; pass no rows"),
            (None, None) => bail!("the token embedding is external: the forward needs its rows"),
        }
    }

    /// [`Model::logits`] with the token embeddings given as `rows` when the embedding is
    /// external ([`Model::new_sharded`]).
    fn logits_rows(
        &self,
        batch: &Batch,
        before: &mut dyn FnMut(usize) -> Result<()>,
        rows: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let dev = &self.device;
        Ok(match (&self.net, batch) {
            (Net::Mlp(ls), Batch::Class { x, y, b }) => {
                let mut h = Tensor::from_slice(x, (*b, x.len() / b), dev)?;
                for (i, l) in ls.iter().enumerate() {
                    h = l.forward(&h)?;
                    if i + 1 < ls.len() {
                        h = h.relu()?;
                    }
                }
                (h, Tensor::from_slice(y, *b, dev)?)
            }
            (Net::Cnn { convs, fcs, side }, Batch::Class { x, y, b }) => {
                let mut h = Tensor::from_slice(x, (*b, 1, *side, *side), dev)?;
                for (i, c) in convs.iter().enumerate() {
                    h = c.forward(&h)?.relu()?;
                    if i % 2 == 1 {
                        h = max_pool_2x2(&h)?;
                    }
                }
                let mut h = h.flatten_from(1)?;
                h = fcs[0].forward(&h)?.relu()?;
                h = fcs[1].forward(&h)?;
                (h, Tensor::from_slice(y, *b, dev)?)
            }
            (
                Net::Transformer {
                    wte,
                    wpe,
                    blocks,
                    lnf,
                    head,
                    heads,
                },
                Batch::Lm { x, y, b, t },
            ) => {
                let (b, t) = (*b, *t);
                before(0)?;
                let e = self.embed(wte.as_ref(), rows, x, (b, t))?;
                let mut h = e.broadcast_add(&wpe.i(0..t)?)?;
                let mask = causal_mask(t, dev)?;
                for (i, bl) in blocks.iter().enumerate() {
                    before(1 + i)?;
                    h = block_forward(bl, h, &mask, *heads)?;
                }
                before(1 + blocks.len())?;
                let h = layer_norm(&h, lnf)?;
                let logits = head.forward(&h)?;
                let v = logits.dim(2)?;
                (
                    logits.reshape((b * t, v))?,
                    Tensor::from_slice(y, b * t, dev)?,
                )
            }
            (Net::Lstm { emb, lstm, head }, Batch::Lm { x, y, b, t }) => {
                use candle_nn::RNN;
                let (b, t) = (*b, *t);
                before(0)?;
                before(1)?;
                let e = self.embed(emb.as_ref(), rows, x, (b, t))?;
                let states = lstm.seq(&e)?;
                let h = lstm.states_to_tensor(&states)?; // [b, t, hidden]
                let logits = head.forward(&h)?;
                let v = logits.dim(2)?;
                (
                    logits.reshape((b * t, v))?,
                    Tensor::from_slice(y, b * t, dev)?,
                )
            }
            _ => bail!("batch kind does not match model `{}`", self.name),
        })
    }

    /// Mean cross-entropy of the batch (a candle tensor, for autodiff).
    pub fn loss(&self, batch: &Batch) -> Result<Tensor> {
        let (logits, y) = self.logits(batch, &mut |_| Ok(()))?;
        Ok(candle_nn::loss::cross_entropy(&logits, &y)?)
    }

    /// The loss of the batch and its gradient as a flat vector in layout order.
    pub fn loss_and_grad(&self, batch: &Batch) -> Result<(f32, Vec<f32>)> {
        self.loss_and_grad_with(batch, &mut |_| Ok(()))
    }

    /// [`Model::loss_and_grad`] calling `before(k)` before FP stage `k` (see `logits`).
    pub fn loss_and_grad_with(
        &self,
        batch: &Batch,
        before: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(f32, Vec<f32>)> {
        let (logits, y) = self.logits(batch, before)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        let grads = loss.backward()?;
        let mut g = Vec::with_capacity(self.n_params());
        for (name, v) in &self.vars {
            match grads.get(v.as_tensor()) {
                Some(t) => g.extend(t.flatten_all()?.to_vec1::<f32>()?),
                None => {
                    let _ = name;
                    g.extend(std::iter::repeat_n(0.0, v.elem_count()))
                }
            }
        }
        Ok((loss.to_scalar::<f32>()?, g))
    }

    /// With an external embedding ([`Model::new_sharded`]): the loss of an LM batch whose
    /// token embeddings are `rows` (`T × d`, one row per token in batch order: the output of
    /// EmbRace's forward AlltoAll), the flat gradient of the held parameters, and the gradient
    /// of each token's row (`T × d`, duplicates not summed). `before` as in
    /// [`Model::loss_and_grad_with`].
    pub fn loss_and_grad_rows(
        &self,
        batch: &Batch,
        rows: &[f32],
        before: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(f32, Vec<f32>, Vec<f32>)> {
        let e = self
            .external
            .as_ref()
            .context("the model holds its token embedding")?;
        let t = rows.len() / e.width.max(1);
        let var = Var::from_tensor(&Tensor::from_slice(rows, (t, e.width), &self.device)?)?;
        let (logits, y) = self.logits_rows(batch, before, Some(var.as_tensor()))?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        let grads = loss.backward()?;
        let mut g = Vec::with_capacity(self.n_params());
        for (_, v) in &self.vars {
            match grads.get(v.as_tensor()) {
                Some(t) => g.extend(t.flatten_all()?.to_vec1::<f32>()?),
                None => g.extend(std::iter::repeat_n(0.0, v.elem_count())),
            }
        }
        let gr = match grads.get(var.as_tensor()) {
            Some(x) => x.flatten_all()?.to_vec1::<f32>()?,
            None => vec![0.0; rows.len()],
        };
        Ok((loss.to_scalar::<f32>()?, g, gr))
    }

    /// Mean loss and accuracy (classification) over evaluation batches.
    pub fn evaluate(&self, batches: &[Batch]) -> Result<Eval> {
        self.evaluate_rows(batches, None)
    }

    /// [`Model::evaluate`]; with an external embedding, `rows[i]` are the token embeddings
    /// of `batches[i]` (`T × d`, token order).
    pub fn evaluate_rows(&self, batches: &[Batch], rows: Option<&[Vec<f32>]>) -> Result<Eval> {
        let (mut loss_sum, mut correct, mut count) = (0.0f64, 0usize, 0usize);
        for (i, b) in batches.iter().enumerate() {
            let r = match rows {
                Some(rs) => {
                    let r = rs
                        .get(i)
                        .context("no embedding rows for an evaluation batch")?;
                    let w = self.external.as_ref().map_or(1, |e| e.width.max(1));
                    Some(Tensor::from_slice(r, (r.len() / w, w), &self.device)?)
                }
                None => None,
            };
            let (logits, y) = self.logits_rows(b, &mut |_| Ok(()), r.as_ref())?;
            let n = y.dim(0)?;
            let l = candle_nn::loss::cross_entropy(&logits, &y)?.to_scalar::<f32>()? as f64;
            loss_sum += l * n as f64;
            let pred = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            let yv = y.to_vec1::<u32>()?;
            correct += pred.iter().zip(&yv).filter(|(a, b)| a == b).count();
            count += n;
        }
        if count == 0 {
            bail!("empty evaluation set");
        }
        Ok(Eval {
            loss: loss_sum / count as f64,
            accuracy: correct as f64 / count as f64,
        })
    }
}

/// The transformer-lm layers (`wte` only when `shard` is false).
fn transformer(spec: &ModelSpec, vocab: usize, vb: &VarBuilder, shard: bool) -> Result<Net> {
    let d = spec.d_model;
    if spec.heads == 0 || !d.is_multiple_of(spec.heads) {
        bail!(
            "--d-model {d} must be a multiple of --heads {} (flag --heads)",
            spec.heads
        );
    }
    let wte = (!shard)
        .then(|| candle_nn::embedding(vocab, d, vb.pp("wte")))
        .transpose()?;
    let wpe = vb.get_with_hints((spec.seq_len, d), "wpe.weight", candle_nn::Init::Const(0.0))?;
    let mut blocks = Vec::new();
    for i in 0..spec.layers {
        let b = vb.pp(format!("h{i}"));
        blocks.push(Block {
            ln1: ln_params(&b.pp("ln1"), d)?,
            qkv: candle_nn::linear(d, 3 * d, b.pp("attn_qkv"))?,
            proj: candle_nn::linear(d, d, b.pp("attn_proj"))?,
            ln2: ln_params(&b.pp("ln2"), d)?,
            fc: candle_nn::linear(d, 4 * d, b.pp("mlp_fc"))?,
            out: candle_nn::linear(4 * d, d, b.pp("mlp_out"))?,
        });
    }
    Ok(Net::Transformer {
        wte,
        wpe,
        blocks,
        lnf: ln_params(&vb.pp("lnf"), d)?,
        head: candle_nn::linear(d, vocab, vb.pp("lm_head"))?,
        heads: spec.heads,
    })
}

/// The layout of parameter tensors `entries` (name, shape) in the given order.
fn layout_of(entries: &[(String, Vec<usize>)]) -> Layout {
    Layout::new(
        entries
            .iter()
            .enumerate()
            .map(|(i, (n, dims))| {
                let numel: usize = dims.iter().product();
                let shape = dims.iter().map(|d| *d as u32).collect();
                (i as u32, n.clone(), numel as u64, Some(shape))
            })
            .collect(),
    )
}

/// (name, shape) of every tensor of `layout`.
fn entries_of(layout: &Layout) -> Vec<(String, Vec<usize>)> {
    layout
        .layers
        .iter()
        .map(|l| {
            let dims = l.shape.clone().unwrap_or_default();
            (l.name.clone(), dims.iter().map(|d| *d as usize).collect())
        })
        .collect()
}

/// The seeded initial values of `entries` in order (see [`Model::init_params`]): the values
/// of the tensor named `external` go to `emb`, all others to `out` (when given).
fn init_values(
    entries: &[(String, Vec<usize>)],
    seed: u64,
    external: Option<&str>,
    emb: &mut dyn FnMut(f32),
    mut out: Option<&mut Vec<f32>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x696e_6974);
    for (name, dims) in entries {
        let n: usize = dims.iter().product();
        let last = name.rsplit('.').next().unwrap_or("");
        let is_ln = name.split('.').any(|p| p.starts_with("ln"));
        let mut put = |x: f32| match &mut out {
            _ if external == Some(name.as_str()) => emb(x),
            Some(o) => o.push(x),
            None => {}
        };
        if last.starts_with("bias") {
            (0..n).for_each(|_| put(0.0));
        } else if is_ln {
            (0..n).for_each(|_| put(1.0));
        } else if name.starts_with("wte") || name.starts_with("wpe") || name.starts_with("emb") {
            (0..n).for_each(|_| put(rng.gen_range(-0.1f32..0.1)));
        } else {
            let fan_in = (n / dims.first().copied().unwrap_or(1).max(1)).max(1);
            let b = 1.0 / (fan_in as f32).sqrt();
            (0..n).for_each(|_| put(rng.gen_range(-b..b)));
        }
    }
}

impl ExternalEmbedding {
    /// The embedding `name` (vocab × width) beside the held tensors `held` (sorted by name).
    fn new(
        name: &str,
        vocab: usize,
        width: usize,
        held: &[(String, Vec<usize>)],
        seed: u64,
    ) -> Self {
        let mut all = held.to_vec();
        all.push((name.to_string(), vec![vocab, width]));
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let full_layout = layout_of(&all);
        let offset = full_layout
            .layers
            .iter()
            .find(|l| l.name == name)
            .map_or(0, |l| l.offset as usize);
        ExternalEmbedding {
            name: name.to_string(),
            vocab,
            width,
            full_layout,
            offset,
            seed,
        }
    }
}

/// Result of an evaluation: mean loss (nats) and top-1 accuracy (next-token accuracy for LMs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Eval {
    pub loss: f64,
    pub accuracy: f64,
}

/// Checks that the model/data pair exists without building it (for early CLI errors).
pub fn check_name(name: &str) -> Result<()> {
    MODELS
        .iter()
        .any(|m| m.0 == name)
        .then_some(())
        .with_context(|| {
            let names: Vec<&str> = MODELS.iter().map(|m| m.0).collect();
            format!("unknown --model `{name}` (known: {})", names.join(", "))
        })
}

/// Copies of the parameter vector one rank keeps: the parameters, candle's gradients and
/// their flat copy, the optimiser state (up to two moments), the exchange's buffers
/// (residual, reduce buffer) and the initial draw. An estimate, deliberately on the high side.
pub const PARAM_COPIES: u128 = 10;

/// Copies of an EmbRace rank's embedding table of record: the table and up to two optimiser
/// moments (the row gradients are per batch, counted with the activations' order of size).
pub const TABLE_COPIES: u128 = 3;

/// Parameters of `spec` on `data`, in u128 (saturating), computed from the flags and the
/// data's sizes without building anything; mirrors [`Model::new`]'s layers.
pub fn estimate_params(spec: &ModelSpec, data: &Dataset) -> u128 {
    let m = |f: &[u128]| gradkit_core::budget::product(f);
    let s = |terms: &[u128]| terms.iter().fold(0u128, |a, t| a.saturating_add(*t));
    let (h, d, layers, t) = (
        spec.hidden as u128,
        spec.d_model as u128,
        spec.layers as u128,
        spec.seq_len as u128,
    );
    let linear = |i: u128, o: u128| s(&[m(&[i, o]), o]);
    match (spec.name.as_str(), data) {
        ("mlp", Dataset::Class(c)) => {
            let (dim, k) = (c.dim as u128, c.classes as u128);
            s(&[linear(dim, h), linear(h, h), linear(h, k)])
        }
        ("cnn", Dataset::Class(c)) => {
            let side = (c.dim as f64).sqrt() as u128;
            let convs =
                linear(9, 16) + linear(16 * 9, 16) + linear(16 * 9, 32) + linear(32 * 9, 32);
            let flat = m(&[32, side / 4, side / 4]);
            s(&[convs, linear(flat, 64), linear(64, c.classes as u128)])
        }
        ("transformer-lm", Dataset::Lm(l)) => {
            let v = l.vocab as u128;
            let block = s(&[
                m(&[4, d]),
                linear(d, m(&[3, d])),
                linear(d, d),
                linear(d, m(&[4, d])),
                linear(m(&[4, d]), d),
            ]);
            s(&[
                m(&[v, d]),
                m(&[t, d]),
                m(&[layers, block]),
                m(&[2, d]),
                linear(d, v),
            ])
        }
        ("lstm-lm", Dataset::Lm(l)) => {
            let v = l.vocab as u128;
            let gates = m(&[4, h]);
            s(&[m(&[v, d]), m(&[gates, s(&[d, h, 2])]), linear(h, v)])
        }
        _ => 0,
    }
}

/// Floats of activations (forward values and their gradients) one step of `batch` examples
/// holds on one rank: a rough upper estimate, dominated by the logits for language models.
pub fn estimate_activations(spec: &ModelSpec, data: &Dataset, batch: usize) -> u128 {
    let m = |f: &[u128]| gradkit_core::budget::product(f);
    let (b, h, d, t) = (
        batch as u128,
        spec.hidden as u128,
        spec.d_model as u128,
        spec.seq_len as u128,
    );
    match data {
        Dataset::Class(c) => m(&[
            b,
            (c.dim as u128)
                .saturating_mul(97)
                .saturating_add(m(&[3, h]))
                .saturating_add(c.classes as u128),
            3,
        ]),
        Dataset::Lm(l) => {
            let per_token = (l.vocab as u128).saturating_mul(3).saturating_add(m(&[
                d.max(h),
                spec.layers.max(1) as u128,
                24,
            ]));
            let attention = m(&[spec.heads.max(1) as u128, t, spec.layers.max(1) as u128, 3]);
            m(&[b, t, per_token.saturating_add(attention)])
        }
    }
}

/// Stops with a clear error, before any parameter is allocated, when the model the flags
/// and the data describe would not fit the memory budget on the `ranks_here` ranks of this
/// process (`--max-memory`, `GRADKIT_MAX_MEMORY`, else the machine's memory).
///
/// `table_ranks`: `Some(P)` when the token embedding is not part of the model but a table of
/// record held outside it (EmbRace's exchanges, [`Model::new_sharded`]): the V × d embedding
/// then counts as [`TABLE_COPIES`] copies of 1/P of it (P = 1 for the replicated AllGather
/// baselines) instead of [`PARAM_COPIES`] copies of all of it.
pub fn check_memory(
    spec: &ModelSpec,
    data: &Dataset,
    batch: usize,
    ranks_here: usize,
    table_ranks: Option<usize>,
) -> Result<()> {
    let params = estimate_params(spec, data);
    let acts = estimate_activations(spec, data, batch);
    let (table, shard) = match (table_ranks, data, spec.name.as_str()) {
        (Some(p), Dataset::Lm(l), "transformer-lm" | "lstm-lm") => {
            let t =
                gradkit_core::budget::product(&[l.vocab as u128, spec.d_model as u128]).min(params);
            (t, t.div_ceil(p.max(1) as u128))
        }
        _ => (0, 0),
    };
    let floats = (params - table)
        .saturating_mul(PARAM_COPIES)
        .saturating_add(shard.saturating_mul(TABLE_COPIES))
        .saturating_add(acts);
    let bytes = gradkit_core::budget::product(&[floats, 4, ranks_here as u128]);
    let sizes = match data {
        Dataset::Class(c) => format!(
            "--hidden {}, {} features, {} classes (column `label`)",
            spec.hidden, c.dim, c.classes
        ),
        Dataset::Lm(l) => format!(
            "--d-model {}, --hidden {}, --layers {}, --seq-len {}, vocabulary {}",
            spec.d_model, spec.hidden, spec.layers, spec.seq_len, l.vocab
        ),
    };
    gradkit_core::budget::check(
        &format!(
            "--model {} ({sizes}) has {params} parameters; with gradients, optimiser state, exchange buffers and activations for --batch {batch} on {ranks_here} rank(s) in this process it",
            spec.name
        ),
        bytes,
    )
}

/// One pre-norm transformer block on `h` ([b, t, d]): causal multi-head self-attention with
/// `heads` heads, then the MLP, each added to the residual stream.
fn block_forward(bl: &Block, h: Tensor, mask: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, t, d) = h.dims3()?;
    let dh = d / heads;
    let a = layer_norm(&h, &bl.ln1)?;
    let qkv = bl
        .qkv
        .forward(&a)?
        .reshape((b, t, 3, heads, dh))?
        .permute((2, 0, 3, 1, 4))?;
    let q = qkv.i(0)?.contiguous()?;
    let k = qkv.i(1)?.contiguous()?;
    let v = qkv.i(2)?.contiguous()?;
    let att = (q.matmul(&k.t()?.contiguous()?)? * (1.0 / (dh as f64).sqrt()))?;
    let att = candle_nn::ops::softmax(&att.broadcast_add(mask)?, D::Minus1)?;
    let o = att
        .matmul(&v)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, t, d))?;
    let h = (h + bl.proj.forward(&o)?)?;
    let m = layer_norm(&h, &bl.ln2)?;
    let m = bl.out.forward(&bl.fc.forward(&m)?.gelu_erf()?)?;
    Ok((h + m)?)
}

/// The network `spec` names for `data` (the weights drawn by `vb`; EmbRace's `shard` leaves
/// the token embedding out).
fn build_net(spec: &ModelSpec, data: &Dataset, vb: &VarBuilder, shard: bool) -> Result<Net> {
    Ok(match (spec.name.as_str(), data) {
        ("mlp", Dataset::Class(c)) => {
            let h = spec.hidden;
            Net::Mlp(vec![
                candle_nn::linear(c.dim, h, vb.pp("fc1"))?,
                candle_nn::linear(h, h, vb.pp("fc2"))?,
                candle_nn::linear(h, c.classes, vb.pp("fc3"))?,
            ])
        }
        ("cnn", Dataset::Class(c)) => {
            let side = (c.dim as f64).sqrt() as usize;
            if side * side != c.dim || !side.is_multiple_of(4) {
                bail!(
                    "--model cnn needs square images whose side is a multiple of 4; the data has {} features (flag --model)",
                    c.dim
                );
            }
            let cfg = Conv2dConfig {
                padding: 1,
                ..Default::default()
            };
            let convs = vec![
                candle_nn::conv2d(1, 16, 3, cfg, vb.pp("conv1"))?,
                candle_nn::conv2d(16, 16, 3, cfg, vb.pp("conv2"))?,
                candle_nn::conv2d(16, 32, 3, cfg, vb.pp("conv3"))?,
                candle_nn::conv2d(32, 32, 3, cfg, vb.pp("conv4"))?,
            ];
            let flat = 32 * (side / 4) * (side / 4);
            let fcs = vec![
                candle_nn::linear(flat, 64, vb.pp("fc1"))?,
                candle_nn::linear(64, c.classes, vb.pp("fc2"))?,
            ];
            Net::Cnn { convs, fcs, side }
        }
        ("transformer-lm", Dataset::Lm(l)) => transformer(spec, l.vocab, vb, shard)?,
        ("lstm-lm", Dataset::Lm(l)) => Net::Lstm {
            emb: (!shard)
                .then(|| candle_nn::embedding(l.vocab, spec.d_model, vb.pp("emb")))
                .transpose()?,
            lstm: candle_nn::lstm(
                spec.d_model,
                spec.hidden,
                candle_nn::LSTMConfig::default(),
                vb.pp("lstm"),
            )?,
            head: candle_nn::linear(spec.hidden, l.vocab, vb.pp("lm_head"))?,
        },
        ("mlp" | "cnn", Dataset::Lm(_)) => bail!(
            "--model {} is a classifier but the data is a token stream; use --data digits or a file with `features`/`label` (flag --model)",
            spec.name
        ),
        ("transformer-lm" | "lstm-lm", Dataset::Class(_)) => bail!(
            "--model {} is a language model but the data is a classification set; use --data synthetic-lm or a file with `tokens` (flag --model)",
            spec.name
        ),
        (other, _) => {
            let names: Vec<&str> = MODELS.iter().map(|m| m.0).collect();
            bail!("unknown --model `{other}` (known: {})", names.join(", "))
        }
    })
}

/// The additive causal mask of `t` positions: 0 where a position may attend, -1e9 after it.
fn causal_mask(t: usize, dev: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..t * t)
        .map(|k| if k % t > k / t { -1e9 } else { 0.0 })
        .collect();
    Ok(Tensor::from_slice(&mask, (t, t), dev)?)
}
