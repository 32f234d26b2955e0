//! DeepSpeed's error-compensated 1-bit compressed allreduce (1-bit Adam / 1-bit LAMB,
//! onebit-lamb.md §2, anchors.md §3): the communication half of 1-bit LAMB.
//!
//! All layers are **fused** into one buffer in `layer_id` order (as DeepSpeed fuses every
//! momentum into one flat buffer), zero-padded to a multiple of `P·lcm(P, 8)`, then on each
//! rank:
//! 1. `buf = x + worker_error`; `s_w = ‖buf‖₂/√len`; sign bit 1 where `buf ≥ 0` (zero and −0
//!    count as +1); `worker_error = buf − s_w·sign`.
//! 2. The bits are packed MSB-first into bytes and cut into P chunks; chunk k goes to rank k
//!    (alltoall), every rank's `s_w` travels with it (the scale allgather).
//! 3. Rank j, the server of chunk j: `z = Σ_i (s_w⁽ⁱ⁾/P)·sign_i + server_error`;
//!    `s_s = ‖z‖₂/√len(z)`; `server_error = z − s_s·sign(z)`.
//! 4. The packed server chunks and their scales are allgathered (ring); the result is
//!    `s_s⁽ʲ⁾·sign_j` on chunk j, unpadded: the compressed **average**, bit-identical on all
//!    ranks.
//!
//! Bytes sent per rank per call: `2(P−1)·(d_pad/(8P) + 4)` — the P−1 sign chunks of the
//! alltoall and the P−1 of the ring allgather, each carrying one f32 scale (the scale rides in
//! the same message as its chunk, so the 2(P−1) scales cost no extra messages). P = 1 skips
//! communication and compression entirely (as DeepSpeed does): the output is the input.
//!
//! Worker and server errors persist across calls ([`OneBitState`]). Both are kept
//! *unsettled* between calls (docs/MEMORY.md): the buffers hold the last compressed input `c` and
//! owe `− s·sign(c)`, which the next call applies while reading them, so the worker
//! compressor and the server stage are one pass each; [`OneBitState::worker_error`] /
//! [`OneBitState::server_error`] give the settled values, bit for bit those of the two-pass
//! form. The reducer hands them out and takes them back as values ([`Reducer::state`] / [`Reducer::load_state`], named
//! [`WORKER_ERROR`] and [`SERVER_ERROR`]; moved rather than copied by [`Reducer::take_state`] /
//! [`Reducer::load_state_owned`]); gradallreduce's `--state FILE` saves and loads
//! them — DeepSpeed drops them on checkpoint load; we keep them.
//!
//! With `Params::resident` both errors live on that device instead (docs/GPU.md §7): the
//! allreduce below is the same, only its compress, server and decompress steps run where
//! the errors are (`place`), and what crosses between host and device per call is the
//! input, the result and packed signs.

use anyhow::{bail, Result};
use gradkit_comm::{Comm, CommExt, Fixed};
use gradkit_core::trace::Layout;
use gradkit_cost::{pf, Cost};

use crate::{Flat, Reducer, StepOutput};

mod place;
use place::{Place, Unpack};

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Length of the fused buffer after DeepSpeed's padding: n rounded up to a multiple of
/// `P·lcm(P, 8)` (so every server chunk is a whole number of bytes); in u128, where it cannot
/// overflow for any P of a u32 (saturating beyond), as the cost model asks it of any n.
pub fn padded(p: usize, n: usize) -> u128 {
    let p = p.max(1) as u128;
    let unit = (p * 8 / gcd(p, 8)).saturating_mul(p);
    (n as u128).div_ceil(unit).saturating_mul(unit)
}

/// [`padded`] of a buffer that exists (its padded length fits in memory).
pub fn padded_len(p: usize, n: usize) -> usize {
    usize::try_from(padded(p, n)).expect("a padded length that fits in memory")
}

/// The compressed allreduce's formula (onebit-lamb.md §2): an alltoall of sign chunks and an
/// allgather of server chunks (each (P−1)/P·padded/8 bytes) and two allgathers of one f32
/// scale per rank. Exact bytes sent per rank: 2(P−1)/P·padded/8 + 2(P−1)·4.
pub fn cost(p: usize, n: usize) -> Cost {
    if p <= 1 {
        return Cost {
            latency: 0.0,
            words: 0.0,
        };
    }
    let bytes = 2.0 * (pf(p) - 1.0) / pf(p) * padded(p, n) as f64 / 8.0 + 2.0 * (pf(p) - 1.0) * 4.0;
    Cost {
        latency: 4.0 * (pf(p) - 1.0),
        words: bytes / 4.0,
    }
}

// The pure 1-bit kernels (compress with error feedback, sign packing, decompression) live in
// `gradkit_sparsify::onebit`, behind the `gradkit_sparsify::kernels::Kernels` interface;
// re-exported here so that callers of `gradkit_collectives::onebit` are unchanged.
use gradkit_sparsify::kernels::Kernels;
pub use gradkit_sparsify::onebit::{
    compress_into, compress_with_feedback, pack_and_feedback, pack_signs, rms, unpack_accumulate,
    unpack_first, unpack_scaled,
};
use gradkit_sparsify::resident::DeviceKernels;

/// Message buffers kept between calls: a call builds P + 1 (P sign chunks and its server
/// chunk) and receives 2P; it keeps what the next call builds.
fn spare_kept(p: usize) -> usize {
    p + 1
}

fn push_scale(v: &mut Vec<u8>, s: f32) {
    v.extend_from_slice(&s.to_le_bytes());
}

fn split_scale(mut v: Vec<u8>) -> Result<(Vec<u8>, f32)> {
    if v.len() < 4 {
        bail!("1-bit message of {} bytes lacks its scale", v.len());
    }
    let at = v.len() - 4;
    let s = f32::from_le_bytes(v[at..].try_into().expect("4 bytes"));
    v.truncate(at);
    Ok((v, s))
}

/// Which 1-bit variant a [`OneBitState`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// DeepSpeed's two-stage compressed allreduce (worker and server compression).
    Server,
    /// Baseline: every rank allgathers every rank's packed signs and scale, then averages;
    /// no server stage (pads to a multiple of 8 only).
    Naive,
}

/// The error buffers of one rank, kept across the calls of a run.
#[derive(Debug)]
pub struct OneBitState {
    pub variant: Variant,
    /// World size the buffers were sized for.
    pub p: usize,
    /// Unpadded fused length.
    pub n: usize,
    /// The worker error (padded length) and the server error of this rank's chunk
    /// (`padded/P`; empty for [`Variant::Naive`]), in host memory with the compress / pack /
    /// unpack kernels (gradkit-sparsify's CPU reference by default) or resident on a device.
    /// Both are kept **unsettled** (docs/MEMORY.md): a buffer holds the last call's
    /// compressed input `c`, and the error is `c − due·sign(c)`
    /// ([`OneBitState::worker_error`]); the next call applies that feedback while reading
    /// it, so the worker compressor and the server stage are one pass each instead of two.
    place: Place,
    /// The scale whose feedback the worker error still owes (0.0: settled).
    worker_due: f32,
    /// The same for the server error.
    server_due: f32,
    /// Buffers reused across calls (fresh allocations of this size cost page faults).
    scratch: Scratch,
}

/// Buffers kept across calls: the packed worker signs and the list of received chunks.
/// (Message vectors are not pooled: `Comm` takes and returns owned vectors, and keeping the
/// received ones for reuse measured more page faults per call under mpirun — 91 against
/// 18 — than letting the allocator recycle them.)
#[derive(Clone, Debug, Default)]
struct Scratch {
    bits: Vec<u8>,
    /// Received sign chunks with their scales (vectors from the alltoall or allgather).
    msgs: Vec<(Vec<u8>, f32)>,
    /// Message buffers of earlier calls (the chunks received in both phases), each of a
    /// chunk's size: the next call builds its messages in them, so that a steady-state call
    /// allocates and page-faults no message buffer (docs/MEMORY.md; the communicator keeps the
    /// buffers it sends for its receives).
    spare: Vec<Vec<u8>>,
}

impl Scratch {
    /// A message buffer with room for `len` bytes, from [`Scratch::spare`] when one is there.
    fn message(&mut self, len: usize) -> Vec<u8> {
        let mut m = self.spare.pop().unwrap_or_default();
        m.clear();
        m.reserve(len);
        m
    }

    /// Keeps `m` for a later call's message, at most `keep` buffers in all.
    fn recycle(&mut self, m: Vec<u8>, keep: usize) {
        if self.spare.len() < keep {
            self.spare.push(m);
        }
    }
}

impl OneBitState {
    /// Lengths of the (worker error, server error) buffers for a fused buffer of `n`
    /// elements on `p` ranks: the padded length, and `padded/P` for [`Variant::Server`] on
    /// more than one rank (else 0).
    pub fn lens(variant: Variant, p: usize, n: usize) -> (usize, usize) {
        let npad = match variant {
            Variant::Server => padded_len(p, n),
            Variant::Naive => n.div_ceil(8) * 8,
        };
        let server = match variant {
            Variant::Server if p > 1 => npad / p,
            _ => 0,
        };
        (npad, server)
    }

    /// Zero errors for a fused buffer of `n` elements on `p` ranks, in host memory.
    pub fn new(variant: Variant, p: usize, n: usize) -> Self {
        OneBitState {
            variant,
            p,
            n,
            place: Place::host(gradkit_sparsify::kernels::cpu(), Self::lens(variant, p, n)),
            worker_due: 0.0,
            server_due: 0.0,
            scratch: Scratch::default(),
        }
    }

    /// The same state with zero errors in host memory, stepped by `kernels` (a device
    /// implementation that copies per call, say).
    pub fn with_kernels(mut self, kernels: &'static dyn Kernels) -> Self {
        self.place = Place::host(kernels, self.place.lens());
        (self.worker_due, self.server_due) = (0.0, 0.0);
        self
    }

    /// The same state with zero errors resident on `dev` (docs/GPU.md §7): per call the data
    /// goes up and the result comes down once; the rest that crosses is packed signs.
    pub fn resident(mut self, dev: &'static dyn DeviceKernels) -> Self {
        self.place = Place::device(dev, self.place.lens());
        (self.worker_due, self.server_due) = (0.0, 0.0);
        self
    }

    /// Padded length of the fused buffer.
    pub fn padded(&self) -> usize {
        self.place.lens().0
    }

    /// Compressed allreduce of `data` in place: on return every rank holds the same
    /// compressed average. `data.len()` must equal the `n` the state was made for.
    pub fn allreduce(&mut self, comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
        let p = comm.size();
        if p != self.p || data.len() != self.n {
            bail!(
                "1-bit state is for {} ranks and {} elements, but this call has {} ranks and {} elements",
                self.p,
                self.n,
                p,
                data.len()
            );
        }
        if p == 1 {
            return Ok(()); // DeepSpeed skips the compressed allreduce when n == 1.
        }
        match self.variant {
            Variant::Server => self.allreduce_server(comm, data),
            Variant::Naive => self.allreduce_naive(comm, data),
        }
    }

    /// This rank's worker error, settled (padded length): what the two-pass
    /// [`compress_with_feedback`] would hold, bit for bit.
    pub fn worker_error(&self) -> Vec<f32> {
        self.place.settled(self.dues()).0
    }

    /// This rank's server error, settled (`padded/P`, or empty).
    pub fn server_error(&self) -> Vec<f32> {
        self.place.settled(self.dues()).1
    }

    /// ‖worker error‖₂ and ‖server error‖₂ of the settled errors, without settling them.
    pub fn error_norms(&self) -> (f64, f64) {
        let (w, s) = self.place.settled_sum_sq(self.dues());
        (w.sqrt(), s.sqrt())
    }

    /// The scales the (worker, server) errors still owe.
    fn dues(&self) -> (f32, f32) {
        (self.worker_due, self.server_due)
    }

    /// Both errors settled (the state keeps empty buffers): what
    /// [`OneBitState::worker_error`] and [`OneBitState::server_error`] give, moved out of
    /// host memory without a copy.
    fn take_errors(&mut self) -> (Vec<f32>, Vec<f32>) {
        let ws = self.place.take_settled(self.dues());
        (self.worker_due, self.server_due) = (0.0, 0.0);
        ws
    }

    /// Replaces both errors by settled ones of the same lengths as the state's (the caller
    /// checks them, see [`fits`]).
    fn set_errors(&mut self, w: Vec<f32>, s: Vec<f32>) {
        self.place.set(w, s);
        (self.worker_due, self.server_due) = (0.0, 0.0);
    }

    /// Step 1 on this rank: the sign bits of `x + worker_error` into `scratch.bits`, in one
    /// pass that also settles the previous call's feedback
    /// ([`Kernels::onebit_compress_deferred`]). Returns the scale, now owed by the error.
    fn worker_compress(&mut self, comm: &dyn Comm, data: &[f32]) -> f32 {
        let _ph = comm.phase("compress");
        let s = self
            .place
            .compress(data, self.worker_due, &mut self.scratch.bits);
        self.worker_due = s;
        s
    }

    /// What of this state's messages does not grow with the model's size: each message's
    /// f32 scale and the padding's share of its sign bits (for a replay at another size).
    fn fixed_part(&self) -> Fixed {
        let padded = self.padded().max(1);
        Fixed::Share {
            header: 4,
            padding: (padded - self.n.min(padded)) as f64 / padded as f64,
        }
    }

    fn allreduce_server(&mut self, comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
        let p = comm.size();
        let _fixed = comm.fixed(self.fixed_part());
        let s_w = self.worker_compress(comm, data);
        let cb = self.scratch.bits.len() / p; // bytes per chunk
        let chunk_len = cb * 8;
        // Phase 1: alltoall of the sign chunks, each with the sender's worker scale (the
        // copy is of the packed bits only, 1/32 of the data).
        let mut sends = Vec::with_capacity(p);
        for k in 0..p {
            let mut m = self.scratch.message(cb + 4);
            m.extend_from_slice(&self.scratch.bits[k * cb..(k + 1) * cb]);
            push_scale(&mut m, s_w);
            sends.push(m);
        }
        let got = {
            let _ph = comm.phase("alltoall");
            comm.alltoallv(sends)?
        };
        let mine = {
            let _ph = comm.phase("server");
            self.server_stage(got, cb)?
        };
        // Phase 2: ring allgather of the packed server chunks with their scales.
        let all = {
            let _ph = comm.phase("allgather");
            comm.allgatherv(mine)?
        };
        let _ph = comm.phase("decompress");
        let mut parts = std::mem::take(&mut self.scratch.msgs);
        parts.clear();
        for m in all {
            let (b, s) = split_scale(m)?;
            if b.len() != cb {
                bail!("1-bit server chunk of {} bytes, expected {cb}", b.len());
            }
            parts.push((b, s));
        }
        self.place
            .decompress(&parts, Unpack::Chunks(chunk_len), data);
        for (b, _) in parts.drain(..) {
            self.scratch.recycle(b, spare_kept(p));
        }
        self.scratch.msgs = parts;
        Ok(())
    }

    /// Step 3 on this rank's chunk (onebit-lamb.md §2): `z = Σ_i (s_i/P)·sign_i` (rank order)
    /// `+ server_error`, in one pass over the server error's buffer that settles the last
    /// call's feedback while reading it, writes `z` there, packs its signs and sums Σz²
    /// ([`Kernels::onebit_server_deferred`]); the new scale `s_s` is then owed by the buffer.
    /// Returns the packed chunk with its scale.
    fn server_stage(&mut self, got: Vec<Vec<u8>>, cb: usize) -> Result<Vec<u8>> {
        let p = got.len();
        let mut msgs = std::mem::take(&mut self.scratch.msgs);
        msgs.clear();
        for m in got {
            let (b, s) = split_scale(m)?;
            if b.len() != cb {
                bail!("1-bit chunk of {} bytes, expected {cb}", b.len());
            }
            msgs.push((b, s / p as f32));
        }
        let mut sb = self.scratch.message(cb + 4);
        sb.resize(cb, 0);
        let ss = self.place.server(&msgs, self.server_due, &mut sb);
        let len = self.place.lens().1;
        let s_s = if len == 0 {
            0.0
        } else {
            (ss / len as f64).sqrt() as f32
        };
        self.server_due = s_s;
        for (b, _) in msgs.drain(..) {
            self.scratch.recycle(b, spare_kept(p));
        }
        self.scratch.msgs = msgs;
        push_scale(&mut sb, s_s);
        Ok(sb)
    }

    fn allreduce_naive(&mut self, comm: &dyn Comm, data: &mut [f32]) -> Result<()> {
        let p = comm.size();
        let _fixed = comm.fixed(self.fixed_part());
        let s_w = self.worker_compress(comm, data);
        let mut bits = std::mem::take(&mut self.scratch.bits);
        push_scale(&mut bits, s_w);
        let all = {
            let _ph = comm.phase("allgather");
            comm.allgatherv(bits)?
        };
        // The average straight into `data` (the padding is never read): the sum from +0 of
        // every rank's term, in rank order.
        let _ph = comm.phase("decompress");
        let mut parts = std::mem::take(&mut self.scratch.msgs);
        parts.clear();
        for m in all {
            let (b, s) = split_scale(m)?;
            if b.len() * 8 < data.len() {
                bail!("1-bit message of {} bytes is too short", b.len());
            }
            parts.push((b, s / p as f32));
        }
        self.place.decompress(&parts, Unpack::Sum, data);
        // This rank's own signs: next call's sign buffer.
        self.scratch.bits = std::mem::take(&mut parts[comm.rank()].0);
        parts.clear();
        self.scratch.msgs = parts;
        Ok(())
    }
}

/// The name of the worker error in [`Reducer::state`] (padded length).
pub const WORKER_ERROR: &str = "worker_error";
/// The name of this rank's server error in [`Reducer::state`] (`padded/P`, or empty).
pub const SERVER_ERROR: &str = "server_error";

/// The 1-bit descriptors: compressed, reading `--state` (never `--op`: they average).
const fn onebit_algo(
    name: &'static str,
    description: &'static str,
    cost: Option<crate::algo::CostFn>,
    make: fn(&crate::Params) -> Result<Box<dyn Reducer>>,
) -> crate::algo::Descriptor {
    crate::algo::Descriptor {
        name,
        family: crate::algo::Family::Compressed,
        paper: "1-bit LAMB §3 and DeepSpeed's compressed allreduce (onebit-lamb.md §2)",
        description,
        reads: &[crate::algo::Knob::State],
        cost,
        ..crate::algo::Descriptor::base(make)
    }
}

fn make_onebit(variant: Variant, params: &crate::Params) -> Result<Box<dyn Reducer>> {
    Ok(Box::new(
        OneBitReducer::new(variant)
            .with_kernels(params.kernels)
            .with_resident(params.resident),
    ))
}

/// `--algo onebit`.
pub const ONEBIT: crate::algo::Descriptor = crate::algo::Descriptor {
    exchange: crate::algo::AsExchange::new(
        "1-bit compressed allreduce of the momentum (with --optimizer onebit-lamb/onebit-adam)",
    ),
    ..onebit_algo(
        "onebit",
        "DeepSpeed's error-compensated 1-bit allreduce (average)",
        Some(|p, n, _| cost(p, n as usize)),
        |params| make_onebit(Variant::Server, params),
    )
};

/// `--algo onebit-naive`.
pub const ONEBIT_NAIVE: crate::algo::Descriptor = onebit_algo(
    "onebit-naive",
    "allgather of every rank's signs and scale (baseline)",
    None,
    |params| make_onebit(Variant::Naive, params),
);

/// The 1-bit algorithms, in `--help` order.
pub const ALGOS: &[crate::Algo] = &[crate::Algo(&ONEBIT), crate::Algo(&ONEBIT_NAIVE)];

/// The 1-bit variant of `algo`, `None` for an algorithm that is not a 1-bit one.
pub fn variant_of(algo: crate::Algo) -> Option<Variant> {
    if algo == crate::Algo(&ONEBIT) {
        Some(Variant::Server)
    } else if algo == crate::Algo(&ONEBIT_NAIVE) {
        Some(Variant::Naive)
    } else {
        None
    }
}

/// `--algo onebit` / `onebit-naive` as a [`Reducer`]: dense input (sparse is densified),
/// dense output = the compressed average. Its state is this rank's worker and server error.
pub struct OneBitReducer {
    variant: Variant,
    kernels: &'static dyn Kernels,
    /// A device that keeps the errors resident (`Params::resident`); `None`: host memory.
    resident: Option<&'static dyn DeviceKernels>,
    state: Option<OneBitState>,
    /// Errors given to [`Reducer::load_state`] before the first step (the buffers' sizes
    /// depend on P and n, known at the first step, where they are checked).
    pending: Option<(Vec<f32>, Vec<f32>)>,
}

impl OneBitReducer {
    pub fn new(variant: Variant) -> Self {
        OneBitReducer {
            variant,
            kernels: gradkit_sparsify::kernels::cpu(),
            resident: None,
            state: None,
            pending: None,
        }
    }

    /// The same reducer running on `kernels` (a device implementation, say).
    pub fn with_kernels(mut self, kernels: &'static dyn Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// The same reducer with its errors resident on `dev` (`None`: host memory).
    pub fn with_resident(mut self, dev: Option<&'static dyn DeviceKernels>) -> Self {
        self.resident = dev;
        self
    }

    /// Zero errors, or the loaded ones when they fit `p` ranks and `n` elements.
    fn init_state(&mut self, p: usize, n: usize) -> Result<OneBitState> {
        let mut st = OneBitState::new(self.variant, p, n).with_kernels(self.kernels);
        if let Some(dev) = self.resident {
            st = st.resident(dev);
        }
        if let Some((w, s)) = self.pending.take() {
            fits(self.name(), &st, &w, &s)?;
            st.set_errors(w, s);
        }
        Ok(st)
    }
}

/// Whether loaded errors `w`, `s` have the lengths of `st`'s buffers.
fn fits(name: &str, st: &OneBitState, w: &[f32], s: &[f32]) -> Result<()> {
    let (wl, sl) = st.place.lens();
    for (key, got, want) in [(WORKER_ERROR, w.len(), wl), (SERVER_ERROR, s.len(), sl)] {
        if got != want {
            bail!(
                "{name}: loaded state `{key}` holds {got} values, but {} ranks with {} elements need {want}",
                st.p,
                st.n
            );
        }
    }
    Ok(())
}

impl Reducer for OneBitReducer {
    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Server => "onebit",
            Variant::Naive => "onebit-naive",
        }
    }

    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let n = layout.total() as usize;
        let mut data = input.into_dense(n);
        if data.len() != n {
            bail!(
                "1-bit input has {} values but the layout has {n}",
                data.len()
            );
        }
        if self.state.is_none() {
            self.state = Some(self.init_state(comm.size(), n)?);
        }
        let st = self.state.as_mut().expect("initialised");
        st.allreduce(comm, &mut data)?;
        let mut out = StepOutput::new(Flat::Dense(data));
        out.metrics.push(("padded_len".into(), st.padded() as f64));
        let (wn, sn) = st.error_norms();
        out.metrics.push(("worker_error_norm".into(), wn));
        out.metrics.push(("server_error_norm".into(), sn));
        Ok(out)
    }

    /// This rank's worker and server error (after the first step; before it, what
    /// [`Reducer::load_state`] was given, if anything).
    fn state(&self) -> Vec<(String, Vec<f32>)> {
        let (w, s) = match (&self.state, &self.pending) {
            (Some(st), _) => (st.worker_error(), st.server_error()),
            (None, Some((w, s))) => (w.clone(), s.clone()),
            (None, None) => return Vec::new(),
        };
        vec![(WORKER_ERROR.to_string(), w), (SERVER_ERROR.to_string(), s)]
    }

    /// This rank's worker and server error moved out, settled (the reducer is done: it
    /// holds no state afterwards).
    fn take_state(&mut self) -> Vec<(String, Vec<f32>)> {
        let (w, s) = match (self.state.as_mut(), self.pending.take()) {
            (Some(st), _) => st.take_errors(),
            (None, Some(ws)) => ws,
            (None, None) => return Vec::new(),
        };
        self.state = None;
        vec![(WORKER_ERROR.to_string(), w), (SERVER_ERROR.to_string(), s)]
    }

    /// Takes both [`WORKER_ERROR`] and [`SERVER_ERROR`] (or nothing). Their lengths are
    /// checked against P and n at once when the reducer has run, else at the first step.
    fn load_state(&mut self, state: &[(String, Vec<f32>)]) -> Result<()> {
        self.load_state_owned(state.to_vec())
    }

    /// [`Reducer::load_state`] keeping the given buffers (no copy).
    fn load_state_owned(&mut self, state: Vec<(String, Vec<f32>)>) -> Result<()> {
        let name = self.name();
        if state.is_empty() {
            return Ok(());
        }
        let (mut w, mut s) = (None, None);
        for (key, v) in state {
            let slot = match key.as_str() {
                WORKER_ERROR => &mut w,
                SERVER_ERROR => &mut s,
                other => {
                    bail!("{name}: unknown state `{other}` (known: {WORKER_ERROR}, {SERVER_ERROR})")
                }
            };
            if slot.replace(v).is_some() {
                bail!("{name}: state `{key}` given twice");
            }
        }
        let (Some(w), Some(s)) = (w, s) else {
            bail!("{name}: state needs both `{WORKER_ERROR}` and `{SERVER_ERROR}`");
        };
        match &mut self.state {
            Some(st) => {
                fits(name, st, &w, &s)?;
                st.set_errors(w, s);
            }
            None => self.pending = Some((w, s)),
        }
        Ok(())
    }
}
