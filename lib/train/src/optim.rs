//! Optimisers on the flat parameter vector, with per-tensor segments where the method is
//! layer-wise (LAMB): SGD (momentum, Nesterov, weight decay), Adam / AdamW, LAMB as the
//! 1-bit LAMB paper uses it (whole-ratio clipping, no bias correction), 1-bit LAMB
//! (Algorithm 1 of onebit-lamb.md) and the 1-bit Adam baseline; plus the learning-rate
//! schedule (linear warm-up, then constant, linear or cosine decay).

// Index loops over several parallel arrays read closer to the papers' formulas.
#![allow(clippy::needless_range_loop)]

use anyhow::{bail, Result};

/// An optimiser (`--optimizer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    #[default]
    Sgd,
    Adam,
    AdamW,
    Lamb,
    /// 1-bit LAMB (onebit-lamb.md Algorithm 1).
    OnebitLamb,
    /// 1-bit Adam, the 1-bit LAMB paper's baseline.
    OnebitAdam,
}

impl Method {
    /// Every optimiser, in the order `--help` lists them.
    pub const ALL: &'static [Method] = &[
        Method::Sgd,
        Method::Adam,
        Method::AdamW,
        Method::Lamb,
        Method::OnebitLamb,
        Method::OnebitAdam,
    ];

    /// The `--optimizer` name.
    pub const fn name(self) -> &'static str {
        match self {
            Method::Sgd => "sgd",
            Method::Adam => "adam",
            Method::AdamW => "adamw",
            Method::Lamb => "lamb",
            Method::OnebitLamb => "onebit-lamb",
            Method::OnebitAdam => "onebit-adam",
        }
    }

    /// One line for `--help`.
    pub const fn help(self) -> &'static str {
        match self {
            Method::Sgd => "SGD with --momentum, --nesterov and --weight-decay (L2)",
            Method::Adam => "Adam with bias correction; --weight-decay adds L2 to the gradient",
            Method::AdamW => "Adam with decoupled weight decay",
            Method::Lamb => {
                "LAMB: per-tensor trust ratio ‖x‖/‖u‖ clipped to [--lamb-min, --lamb-max]"
            }
            Method::OnebitLamb => {
                "1-bit LAMB: LAMB for --freeze-step steps, then 1-bit compressed momentum (needs --exchange onebit)"
            }
            Method::OnebitAdam => {
                "1-bit Adam: Adam for --freeze-step steps, then frozen variance and 1-bit momentum (needs --exchange onebit)"
            }
        }
    }

    /// Whether it is a 1-bit optimiser (its momentum goes through `--exchange onebit`).
    pub const fn is_onebit(self) -> bool {
        matches!(self, Method::OnebitLamb | Method::OnebitAdam)
    }
}

gradkit_core::named!(Method, "--optimizer", suffix = " (flag --optimizer)");

/// Every optimiser knob; each method reads the ones it documents.
#[derive(Clone, Debug)]
pub struct OptConfig {
    pub method: Method,
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// LAMB's clip bounds for the trust ratio (DeepSpeed `min_coeff`/`max_coeff`).
    pub lamb_min: f32,
    pub lamb_max: f32,
    /// 1-bit LAMB: β3 of the coefficient EMA (`coeff_beta`).
    pub coeff_beta: f32,
    /// 1-bit LAMB: bounds of the variance ratio r (`factor_min`/`factor_max`).
    pub factor_min: f32,
    pub factor_max: f32,
    /// 1-bit LAMB: largest relative change of r per step (`factor_threshold`).
    pub factor_threshold: f32,
    /// 1-bit LAMB/Adam: warm-up steps T_w before compression starts.
    pub freeze_step: u32,
    /// 1-bit LAMB/Adam compressed stage: clip m/(√v_frozen+η) to ±[`adam_ratio_bound`]
    /// (`--onebit-clip on`, the default). Neither Algorithm 1 nor DeepSpeed has this clip;
    /// `false` is their exact update (see docs/ALGORITHMS.md).
    pub onebit_clip: bool,
    /// 1-bit LAMB/Adam: zero the averaged momentum where the frozen variance is exactly 0
    /// (`--onebit-mask auto`, the default). DeepSpeed applies only a user-given
    /// `exp_avg_mask` and none by default; `false` is that default (`--onebit-mask none`).
    pub onebit_mask: bool,
    /// 1-bit LAMB: the "LAMB + basic 1-bit" ablation of the paper's §3.4
    /// (`--onebit-basic`): in the compression stage the coefficient stays frozen at c_avg
    /// (no variance ratio r), the failure the paper's reconstruction fixes.
    pub onebit_basic: bool,
}

impl Default for OptConfig {
    fn default() -> Self {
        OptConfig {
            method: Method::Sgd,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            lamb_min: 0.01,
            lamb_max: 10.0,
            coeff_beta: 0.9,
            factor_min: 0.5,
            factor_max: 4.0,
            factor_threshold: 0.1,
            freeze_step: 100,
            onebit_clip: true,
            onebit_mask: true,
            onebit_basic: false,
        }
    }
}

/// Named state vectors (for checkpoints).
pub type State = Vec<(String, Vec<f32>)>;

fn norm(v: &[f32]) -> f32 {
    v.iter()
        .map(|x| (*x as f64) * (*x as f64))
        .sum::<f64>()
        .sqrt() as f32
}

/// An optimiser that updates the whole flat parameter vector from a (reduced) gradient.
pub trait Optimizer: Send {
    fn name(&self) -> &'static str;
    /// `params -= lr·update(grad)`; `step` counts from 0.
    fn step(&mut self, params: &mut [f32], grad: &[f32], lr: f32, step: u32);
    fn state(&self) -> State;
    fn load_state(&mut self, st: &State) -> Result<()>;
    /// Per-tensor trust-ratio coefficients of the last step (LAMB), for the metrics.
    fn coefficients(&self) -> Option<&[f32]> {
        None
    }
    /// The second moment v the next step divides by (Adam family), for the
    /// `variance_norm` metric.
    fn second_moment(&self) -> Option<&[f32]> {
        None
    }
}

/// Adam-family first and second moments as checkpoint state (PyTorch's names).
fn moments_state(m: &[f32], v: &[f32]) -> State {
    vec![
        ("exp_avg".into(), m.to_vec()),
        ("exp_avg_sq".into(), v.to_vec()),
    ]
}

/// Restores [`moments_state`], checking the lengths.
fn load_moments(st: &State, m: &mut Vec<f32>, v: &mut Vec<f32>) -> Result<()> {
    *m = take(st, "exp_avg", m.len())?;
    *v = take(st, "exp_avg_sq", v.len())?;
    Ok(())
}

fn take(st: &State, name: &str, n: usize) -> Result<Vec<f32>> {
    match st.iter().find(|(k, _)| k == name) {
        Some((_, v)) if v.len() == n => Ok(v.clone()),
        Some((_, v)) => bail!(
            "checkpoint state `{name}` has {} values, expected {n}",
            v.len()
        ),
        None => bail!("checkpoint lacks optimiser state `{name}`"),
    }
}

/// SGD: g += wd·w; buf = μ·buf + g; d = nesterov ? g + μ·buf : buf; w -= lr·d
/// (PyTorch's rule, dampening 0; with μ = 0 it is plain SGD).
pub struct Sgd {
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    pub buf: Vec<f32>,
}

impl Optimizer for Sgd {
    fn name(&self) -> &'static str {
        "sgd"
    }
    fn step(&mut self, w: &mut [f32], g: &[f32], lr: f32, _step: u32) {
        let mu = self.momentum;
        for i in 0..w.len() {
            let gi = g[i] + self.weight_decay * w[i];
            let d = if mu != 0.0 {
                self.buf[i] = mu * self.buf[i] + gi;
                if self.nesterov {
                    gi + mu * self.buf[i]
                } else {
                    self.buf[i]
                }
            } else {
                gi
            };
            w[i] -= lr * d;
        }
    }
    fn state(&self) -> State {
        vec![("momentum_buffer".into(), self.buf.clone())]
    }
    fn load_state(&mut self, st: &State) -> Result<()> {
        self.buf = take(st, "momentum_buffer", self.buf.len())?;
        Ok(())
    }
}

/// Adam (bias-corrected). `decoupled`: AdamW (w ← w·(1 − lr·wd) first); otherwise the
/// weight decay is an L2 term added to the gradient.
pub struct Adam {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub decoupled: bool,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl Optimizer for Adam {
    fn name(&self) -> &'static str {
        if self.decoupled {
            "adamw"
        } else {
            "adam"
        }
    }
    fn step(&mut self, w: &mut [f32], g: &[f32], lr: f32, step: u32) {
        let t = step as i32 + 1;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        for i in 0..w.len() {
            let mut gi = g[i];
            if self.decoupled {
                w[i] *= 1.0 - lr * self.weight_decay;
            } else {
                gi += self.weight_decay * w[i];
            }
            self.m[i] = self.beta1 * self.m[i] + (1.0 - self.beta1) * gi;
            self.v[i] = self.beta2 * self.v[i] + (1.0 - self.beta2) * gi * gi;
            let mh = self.m[i] / bc1;
            let vh = self.v[i] / bc2;
            w[i] -= lr * mh / (vh.sqrt() + self.eps);
        }
    }
    fn state(&self) -> State {
        moments_state(&self.m, &self.v)
    }
    fn load_state(&mut self, st: &State) -> Result<()> {
        load_moments(st, &mut self.m, &mut self.v)
    }
    fn second_moment(&self) -> Option<&[f32]> {
        Some(&self.v)
    }
}

/// LAMB as in 1-bit LAMB's Eq. (2), per tensor ℓ (no bias correction):
/// m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; u = m/(√v+η) + λ·x;
/// c = clip(‖x‖/‖u‖, c_min, c_max) (c = 1 when either norm is 0); x -= lr·c·u.
pub struct Lamb {
    pub cfg: OptConfig,
    pub segments: Vec<(usize, usize)>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    /// The coefficients c_ℓ of the last step (1-bit LAMB's EMA reads them).
    pub last_coeff: Vec<f32>,
}

impl Lamb {
    pub fn new(cfg: &OptConfig, segments: Vec<(usize, usize)>, n: usize) -> Self {
        let l = segments.len();
        Lamb {
            cfg: cfg.clone(),
            segments,
            m: vec![0.0; n],
            v: vec![0.0; n],
            last_coeff: vec![1.0; l],
        }
    }
}

impl Optimizer for Lamb {
    fn name(&self) -> &'static str {
        "lamb"
    }
    fn coefficients(&self) -> Option<&[f32]> {
        Some(&self.last_coeff)
    }
    fn second_moment(&self) -> Option<&[f32]> {
        Some(&self.v)
    }
    fn step(&mut self, w: &mut [f32], g: &[f32], lr: f32, _step: u32) {
        let c = &self.cfg;
        for (li, &(o, n)) in self.segments.iter().enumerate() {
            let mut u = vec![0.0f32; n];
            for j in 0..n {
                let i = o + j;
                self.m[i] = c.beta1 * self.m[i] + (1.0 - c.beta1) * g[i];
                self.v[i] = c.beta2 * self.v[i] + (1.0 - c.beta2) * g[i] * g[i];
                u[j] = self.m[i] / (self.v[i].sqrt() + c.eps) + c.weight_decay * w[i];
            }
            let wn = norm(&w[o..o + n]);
            let un = norm(&u);
            let coeff = if wn == 0.0 || un == 0.0 {
                1.0
            } else {
                (wn / un).clamp(c.lamb_min, c.lamb_max)
            };
            self.last_coeff[li] = coeff;
            for j in 0..n {
                w[o + j] -= lr * coeff * u[j];
            }
        }
    }
    fn state(&self) -> State {
        moments_state(&self.m, &self.v)
    }
    fn load_state(&mut self, st: &State) -> Result<()> {
        load_moments(st, &mut self.m, &mut self.v)
    }
}

/// The momentum mask of 1-bit LAMB/Adam (onebit-lamb.md §6): 1 bit cannot encode 0, so an
/// entry whose gradient was exactly 0 through the whole warm-up (frozen v = 0, e.g. the
/// always-blank corner pixels of the digits) would get a ±scale momentum divided by η and
/// blow up. DeepSpeed asks the user for the mask (none by default); we derive it from the
/// frozen variance unless [`OptConfig::onebit_mask`] is off.
fn mask_never_seen(m: &mut [f32], v_frozen: &[f32]) {
    for (mi, vi) in m.iter_mut().zip(v_frozen) {
        if *vi == 0.0 {
            *mi = 0.0;
        }
    }
}

/// The compressed stage's clip bound: [`adam_ratio_bound`] with `--onebit-clip on`, none
/// with `off`.
fn compressed_bound(c: &OptConfig) -> Option<f32> {
    if c.onebit_clip {
        adam_ratio_bound(c.beta1, c.beta2)
    } else {
        None
    }
}

/// The largest |m/√v| an uncompressed Adam/LAMB step can produce (no bias correction, m and
/// v from 0 on the same gradients): m = (1−β1)Σβ1^j g_j and v = (1−β2)Σβ2^j g_j², so by
/// Cauchy–Schwarz |m| ≤ (1−β1)·√(Σ(β1²/β2)^j)·√(v/(1−β2)), i.e.
/// |m/√v| ≤ (1−β1)/√((1−β2)(1−β1²/β2)) (≈ 7.27 for β = (0.9, 0.999)). `None` when β1² ≥ β2
/// (the series diverges: no bound).
pub fn adam_ratio_bound(beta1: f32, beta2: f32) -> Option<f32> {
    let (b1, b2) = (beta1 as f64, beta2 as f64);
    let q = 1.0 - b1 * b1 / b2;
    (q > 0.0 && b2 < 1.0).then(|| ((1.0 - b1) / ((1.0 - b2) * q).sqrt()) as f32)
}

/// The compressed stage's m/(√v_frozen + η), clipped to ±[`adam_ratio_bound`] when `bound`
/// is `Some` ([`OptConfig::onebit_clip`]; `None` is Algorithm 1 / DeepSpeed exactly). With a
/// frozen variance the ratio is no longer bounded: an entry that was rarely active during the
/// warm-up (a rarely lit pixel's weight) has a tiny but nonzero v, while the 1-bit momentum
/// gives it a magnitude ≈ its chunk's mean |m|; m/√v then explodes (NaN a few steps after the
/// freeze on digits with η = 1e-8). Clipping to the bound every uncompressed step obeys
/// changes nothing an uncompressed step could produce.
fn clipped_ratio(m: f32, den: f32, bound: Option<f32>) -> f32 {
    let x = m / den;
    match bound {
        Some(b) => x.clamp(-b, b),
        None => x,
    }
}

/// 1-bit LAMB (Algorithm 1 of onebit-lamb.md). Steps `0..freeze_step` are LAMB on the
/// allreduced gradient ([`OnebitLamb::warmup_step`]) while the per-tensor coefficient EMA
/// `c_avg ← β3·c_avg + (1−β3)·c` is recorded (skipped when c == 1 exactly, as DeepSpeed
/// does); at the end of the last warm-up step v is frozen and a fresh copy keeps being
/// updated. Each later step is [`OnebitLamb::local_momentum`] (local momentum, scaled),
/// one fused 1-bit compressed allreduce of it by the caller, then
/// [`OnebitLamb::compressed_step`].
pub struct OnebitLamb {
    pub lamb: Lamb,
    pub v_fresh: Vec<f32>,
    pub c_avg: Vec<f32>,
    pub r_prev: Vec<f32>,
    /// Momentum scaling k_ℓ, fixed at the first compression step (empty before).
    pub scale: Vec<f32>,
    /// m of the previous step (the global momentum after the last allreduce).
    m_prev: Vec<f32>,
}

impl OnebitLamb {
    pub fn new(cfg: &OptConfig, segments: Vec<(usize, usize)>, n: usize) -> Self {
        let l = segments.len();
        OnebitLamb {
            lamb: Lamb::new(cfg, segments, n),
            v_fresh: Vec::new(),
            c_avg: vec![0.0; l],
            r_prev: vec![1.0; l],
            scale: Vec::new(),
            m_prev: Vec::new(),
        }
    }
    /// Whether `step` (from 0) is in the compression stage.
    pub fn compressing(&self, step: u32) -> bool {
        step >= self.lamb.cfg.freeze_step
    }
    /// A warm-up step: LAMB on the allreduced gradient, recording c_avg; freezes v after
    /// the last warm-up step.
    pub fn warmup_step(&mut self, w: &mut [f32], g: &[f32], lr: f32, step: u32) {
        self.lamb.step(w, g, lr, step);
        let b3 = self.lamb.cfg.coeff_beta;
        for (ca, c) in self.c_avg.iter_mut().zip(&self.lamb.last_coeff) {
            if *c != 1.0 {
                *ca = b3 * *ca + (1.0 - b3) * c;
            }
        }
        if step + 1 == self.lamb.cfg.freeze_step {
            self.v_fresh = self.lamb.v.clone();
        }
    }
    /// Lines 5–6 and the momentum scaling of §4.3: m ← k_ℓ·(β1·m_prev + (1−β1)·g_local), with
    /// k_ℓ = mean_ℓ(s_ℓ)/s_ℓ, s_ℓ = RMS of tensor ℓ of the global momentum at the first
    /// compression step.
    /// Returns the fused buffer to allreduce with 1-bit compression.
    pub fn local_momentum(&mut self, g_local: &[f32]) -> Vec<f32> {
        let c = &self.lamb.cfg;
        if self.v_fresh.is_empty() {
            // freeze_step = 0: the variance is frozen at its initial value.
            self.v_fresh = self.lamb.v.clone();
        }
        self.m_prev = self.lamb.m.clone();
        let mut m: Vec<f32> = self
            .m_prev
            .iter()
            .zip(g_local)
            .map(|(mp, g)| c.beta1 * mp + (1.0 - c.beta1) * g)
            .collect();
        if self.scale.is_empty() {
            // From the global momentum of the warm-up (identical on every rank, as
            // DeepSpeed's), so every rank scales by the same k_ℓ.
            let s: Vec<f32> = self
                .lamb
                .segments
                .iter()
                .map(|&(o, n)| norm(&self.m_prev[o..o + n]) / (n as f32).sqrt())
                .collect();
            let united = s.iter().sum::<f32>() / s.len().max(1) as f32;
            self.scale = s
                .iter()
                .map(|&sl| {
                    if sl > 0.0 && united > 0.0 {
                        united / sl
                    } else {
                        1.0
                    }
                })
                .collect();
        }
        for (&(o, n), k) in self.lamb.segments.iter().zip(&self.scale) {
            m[o..o + n].iter_mut().for_each(|x| *x *= k);
        }
        m
    }
    /// Lines 13–21: unscale the averaged momentum, reconstruct the gradient, update the fresh
    /// variance, compute the clipped ratio r and step with the frozen variance.
    pub fn compressed_step(&mut self, w: &mut [f32], mut m: Vec<f32>, lr: f32) {
        let c = self.lamb.cfg.clone();
        if c.onebit_mask {
            mask_never_seen(&mut m, &self.lamb.v);
        }
        let bound = compressed_bound(&c);
        for (li, &(o, n)) in self.lamb.segments.iter().enumerate() {
            let k = self.scale[li];
            m[o..o + n].iter_mut().for_each(|x| *x /= k);
            if c.onebit_basic {
                // §3.4's "LAMB + basic 1-bit": v and c both frozen.
                let coeff = self.c_avg[li];
                for j in 0..n {
                    let i = o + j;
                    let den = self.lamb.v[i].sqrt() + c.eps;
                    let u = clipped_ratio(m[i], den, bound) + c.weight_decay * w[i];
                    w[i] -= lr * coeff * u;
                }
                self.lamb.last_coeff[li] = coeff;
                continue;
            }
            let mut u_pre = vec![0.0f32; n];
            let mut u = vec![0.0f32; n];
            let mut r = f32::NEG_INFINITY;
            for j in 0..n {
                let i = o + j;
                let g_rec = (m[i] - c.beta1 * self.m_prev[i]) / (1.0 - c.beta1);
                self.v_fresh[i] = c.beta2 * self.v_fresh[i] + (1.0 - c.beta2) * g_rec * g_rec;
                let den = self.lamb.v[i].sqrt() + c.eps;
                u_pre[j] = clipped_ratio(m[i], den, bound);
                u[j] = u_pre[j] + c.weight_decay * w[i];
                r = r.max(den / (self.v_fresh[i].sqrt() + c.eps));
            }
            if c.weight_decay > 0.0 {
                let un = norm(&u);
                let rho = if un > 0.0 {
                    (norm(&u_pre) / un).min(1.0)
                } else {
                    1.0
                };
                r = r * rho + (1.0 - rho);
            }
            r = r.clamp(c.factor_min, c.factor_max);
            let prev = self.r_prev[li];
            r = r.clamp(
                (1.0 - c.factor_threshold) * prev,
                (1.0 + c.factor_threshold) * prev,
            );
            self.r_prev[li] = r;
            let coeff = r * self.c_avg[li];
            // What the scaling-ratio curves plot (nothing reads it after the warm-up).
            self.lamb.last_coeff[li] = coeff;
            for j in 0..n {
                w[o + j] -= lr * coeff * u[j];
            }
        }
        self.lamb.m = m;
    }
    pub fn state(&self) -> State {
        let mut s = self.lamb.state();
        s.push(("exp_avg_sq_fresh".into(), self.v_fresh.clone()));
        s.push(("coeff_avg".into(), self.c_avg.clone()));
        s.push(("ratio_prev".into(), self.r_prev.clone()));
        s.push(("momentum_scale".into(), self.scale.clone()));
        s
    }
    pub fn load_state(&mut self, st: &State) -> Result<()> {
        self.lamb.load_state(st)?;
        let get = |k: &str| st.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        self.v_fresh = get("exp_avg_sq_fresh").unwrap_or_default();
        self.c_avg = take(st, "coeff_avg", self.c_avg.len())?;
        self.r_prev = take(st, "ratio_prev", self.r_prev.len())?;
        self.scale = get("momentum_scale").unwrap_or_default();
        Ok(())
    }
}

/// 1-bit Adam (the baseline, DeepSpeed's `OnebitAdam`): Adam without bias correction on the
/// allreduced gradient for `freeze_step` steps, then v frozen; each later step updates the
/// local momentum, allreduces it with 1-bit compression, and steps with the frozen v.
pub struct OnebitAdam {
    pub cfg: OptConfig,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl OnebitAdam {
    pub fn new(cfg: &OptConfig, n: usize) -> Self {
        OnebitAdam {
            cfg: cfg.clone(),
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }
    pub fn compressing(&self, step: u32) -> bool {
        step >= self.cfg.freeze_step
    }
    /// `bound`: clip m/(√v+η) to ±bound (the compressed stage, [`clipped_ratio`]).
    fn apply(&self, w: &mut [f32], lr: f32, bound: Option<f32>) {
        let c = &self.cfg;
        for i in 0..w.len() {
            let upd =
                clipped_ratio(self.m[i], self.v[i].sqrt() + c.eps, bound) + c.weight_decay * w[i];
            w[i] -= lr * upd;
        }
    }
    pub fn warmup_step(&mut self, w: &mut [f32], g: &[f32], lr: f32) {
        let c = &self.cfg;
        for i in 0..w.len() {
            self.m[i] = c.beta1 * self.m[i] + (1.0 - c.beta1) * g[i];
            self.v[i] = c.beta2 * self.v[i] + (1.0 - c.beta2) * g[i] * g[i];
        }
        self.apply(w, lr, None);
    }
    pub fn local_momentum(&self, g_local: &[f32]) -> Vec<f32> {
        let c = &self.cfg;
        self.m
            .iter()
            .zip(g_local)
            .map(|(m, g)| c.beta1 * m + (1.0 - c.beta1) * g)
            .collect()
    }
    pub fn compressed_step(&mut self, w: &mut [f32], mut m: Vec<f32>, lr: f32) {
        if self.cfg.onebit_mask {
            mask_never_seen(&mut m, &self.v);
        }
        self.m = m;
        self.apply(w, lr, compressed_bound(&self.cfg));
    }
    pub fn state(&self) -> State {
        moments_state(&self.m, &self.v)
    }
    pub fn load_state(&mut self, st: &State) -> Result<()> {
        load_moments(st, &mut self.m, &mut self.v)
    }
}

/// The optimiser of a run.
pub enum Opt {
    Plain(Box<dyn Optimizer>),
    OnebitLamb(OnebitLamb),
    OnebitAdam(OnebitAdam),
}

impl Opt {
    /// Builds `cfg.method` for parameters with the given per-tensor segments.
    pub fn new(cfg: &OptConfig, segments: Vec<(usize, usize)>) -> Result<Opt> {
        let n = segments.last().map_or(0, |(o, l)| o + l);
        Ok(match cfg.method {
            Method::Sgd => Opt::Plain(Box::new(Sgd {
                momentum: cfg.momentum,
                nesterov: cfg.nesterov,
                weight_decay: cfg.weight_decay,
                buf: vec![0.0; n],
            })),
            Method::Adam | Method::AdamW => Opt::Plain(Box::new(Adam {
                beta1: cfg.beta1,
                beta2: cfg.beta2,
                eps: cfg.eps,
                weight_decay: cfg.weight_decay,
                decoupled: cfg.method == Method::AdamW,
                m: vec![0.0; n],
                v: vec![0.0; n],
            })),
            Method::Lamb => Opt::Plain(Box::new(Lamb::new(cfg, segments, n))),
            Method::OnebitLamb => Opt::OnebitLamb(OnebitLamb::new(cfg, segments, n)),
            Method::OnebitAdam => Opt::OnebitAdam(OnebitAdam::new(cfg, n)),
        })
    }
    /// Whether `step` runs the 1-bit compression stage.
    pub fn compressing(&self, step: u32) -> bool {
        match self {
            Opt::Plain(_) => false,
            Opt::OnebitLamb(o) => o.compressing(step),
            Opt::OnebitAdam(o) => o.compressing(step),
        }
    }
    /// A step on an already reduced gradient (every optimiser outside the 1-bit stage).
    pub fn step(&mut self, w: &mut [f32], g: &[f32], lr: f32, step: u32) {
        match self {
            Opt::Plain(o) => o.step(w, g, lr, step),
            Opt::OnebitLamb(o) => o.warmup_step(w, g, lr, step),
            Opt::OnebitAdam(o) => o.warmup_step(w, g, lr),
        }
    }
    /// LAMB's per-tensor coefficients c_ℓ of the last step (1-bit LAMB: r·c_avg in the
    /// compression stage), for the scaling-ratio curves; `None` for other optimisers.
    pub fn coefficients(&self) -> Option<&[f32]> {
        match self {
            Opt::Plain(o) => o.coefficients(),
            Opt::OnebitLamb(o) => Some(&o.lamb.last_coeff),
            Opt::OnebitAdam(_) => None,
        }
    }
    /// L2 norms of the second moments after the last step, as metrics: `variance_norm`, the
    /// v the update divides by (frozen in the 1-bit compression stage), and for 1-bit LAMB
    /// `variance_fresh_norm`, the copy that keeps being updated from the reconstructed
    /// gradients (its ratio to the frozen one drives r). Empty for SGD.
    pub fn variance_norms(&self) -> Vec<(&'static str, f64)> {
        let l2 = |v: &[f32]| {
            v.iter()
                .map(|x| (*x as f64) * (*x as f64))
                .sum::<f64>()
                .sqrt()
        };
        match self {
            Opt::Plain(o) => o
                .second_moment()
                .map(|v| vec![("variance_norm", l2(v))])
                .unwrap_or_default(),
            Opt::OnebitLamb(o) => {
                let mut out = vec![("variance_norm", l2(&o.lamb.v))];
                if !o.v_fresh.is_empty() {
                    out.push(("variance_fresh_norm", l2(&o.v_fresh)));
                }
                out
            }
            Opt::OnebitAdam(o) => vec![("variance_norm", l2(&o.v))],
        }
    }
    pub fn state(&self) -> State {
        match self {
            Opt::Plain(o) => o.state(),
            Opt::OnebitLamb(o) => o.state(),
            Opt::OnebitAdam(o) => o.state(),
        }
    }
    pub fn load_state(&mut self, st: &State) -> Result<()> {
        match self {
            Opt::Plain(o) => o.load_state(st),
            Opt::OnebitLamb(o) => o.load_state(st),
            Opt::OnebitAdam(o) => o.load_state(st),
        }
    }
}

/// `--decay` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Decay {
    #[default]
    None,
    Linear,
    Cosine,
}

/// Learning rate of `step` (from 0): linear warm-up over `warmup` steps to `base`, then
/// constant, or linear / cosine decay to 0 at `total`.
pub fn lr_at(base: f32, step: u32, warmup: u32, total: u32, decay: Decay) -> f32 {
    if step < warmup {
        return base * (step + 1) as f32 / warmup as f32;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let x = ((step - warmup) as f64 / span).min(1.0);
    match decay {
        Decay::None => base,
        Decay::Linear => (base as f64 * (1.0 - x)) as f32,
        Decay::Cosine => (base as f64 * 0.5 * (1.0 + (std::f64::consts::PI * x).cos())) as f32,
    }
}
