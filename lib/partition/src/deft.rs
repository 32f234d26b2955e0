//! DEFT's work division (DEFT §3; deft.md §1): cut the gradient into pieces, give each piece a
//! share of k by its L2 norm, and pack the pieces into P bins of equal selection cost so every
//! worker searches a disjoint part of the gradient.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use gradkit_core::trace::Layout;
use gradkit_core::PlanRow;
use gradkit_sparsify::{Leaves, Residual};

/// A contiguous range `[start, end)` of one layer (`layer` indexes `Layout.layers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    pub layer: usize,
    pub start: u64,
    pub end: u64,
}

impl Piece {
    /// Number of elements in the piece.
    pub fn size(&self) -> u64 {
        self.end - self.start
    }
    /// The piece's range in the flat index space of `layout`.
    pub fn flat_range(&self, layout: &Layout) -> std::ops::Range<usize> {
        let off = layout.layers[self.layer].offset;
        (off + self.start) as usize..(off + self.end) as usize
    }
}

/// Two-stage partitioning (DEFT Alg. 2, deft.md §1.1): layers in `layer_id` order; a layer with
/// more than n_g/P elements (real division) is cut into P contiguous pieces, the first
/// `size mod P` one element longer; smaller layers stay whole; empty pieces are skipped.
/// The pieces tile the flat index space in order.
pub fn pieces(layout: &Layout, p: usize) -> Vec<Piece> {
    let p = p.max(1);
    let threshold = layout.total() as f64 / p as f64;
    let mut out = Vec::new();
    for (li, l) in layout.layers.iter().enumerate() {
        let size = l.numel;
        if size as f64 > threshold {
            let (q, r) = (size / p as u64, size % p as u64);
            let mut start = 0;
            for i in 0..p as u64 {
                let len = q + u64::from(i < r);
                if len > 0 {
                    out.push(Piece {
                        layer: li,
                        start,
                        end: start + len,
                    });
                }
                start += len;
            }
        } else if size > 0 {
            out.push(Piece {
                layer: li,
                start: 0,
                end: size,
            });
        }
    }
    out
}

/// Piece indices by descending norm; equal norms keep the lower piece index first
/// (a stable sort; NaN norms sort as the largest, by `f64::total_cmp`).
pub fn priority(norms: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..norms.len()).collect();
    order.sort_by(|&a, &b| norms[b].total_cmp(&norms[a]));
    order
}

/// Norm-based local-k allocation (DEFT Alg. 3, deft.md §1.2): pieces by descending L2 norm
/// ([`priority`]), `k_x = clamp(floor(k_remain·norm_x/norm_remain), 1, size_x)`, both remainders
/// reduced after each piece. `norm_remain` is the sum of the norms not yet visited, summed from
/// the smallest up so the last piece sees exactly its own norm (the reference subtracts in
/// floating point and can leave the last piece one short). With `topup`, leftover k is handed
/// out in priority order up to each piece's size (the reference code's pass), and an overshoot
/// from the forced `k_x ≥ 1` is taken back from the lowest-priority pieces with k_x > 1, so
/// Σk_x = k exactly whenever L ≤ k ≤ n_g (our addition; docs/gradpartition.md).
pub fn allocate_k(pieces: &[Piece], norms: &[f64], k: u64, topup: bool) -> Vec<u64> {
    assert_eq!(pieces.len(), norms.len(), "one norm per piece");
    let order = priority(norms);
    // suffix[i] = Σ norms of order[i..], accumulated from the end.
    let mut suffix = vec![0.0f64; order.len() + 1];
    for i in (0..order.len()).rev() {
        let n = norms[order[i]];
        suffix[i] = if n.is_finite() && n > 0.0 { n } else { 0.0 } + suffix[i + 1];
    }
    let mut ks = vec![0u64; pieces.len()];
    let mut k_remain = k as i128;
    for (i, &x) in order.iter().enumerate() {
        let size = pieces[x].size();
        let norm_x = if norms[x].is_finite() && norms[x] > 0.0 {
            norms[x]
        } else {
            0.0
        };
        let norm_remain = suffix[i];
        let k_temp = if norm_remain > 0.0 && k_remain > 0 {
            let ratio = (norm_x / norm_remain).min(1.0);
            (k_remain as f64 * ratio).floor() as u64
        } else {
            0
        };
        let kx = if size < k_temp { size } else { k_temp.max(1) };
        ks[x] = kx;
        k_remain -= kx as i128;
    }
    if topup {
        for &x in &order {
            if k_remain <= 0 {
                break;
            }
            let room = (pieces[x].size() - ks[x]) as i128;
            let add = room.min(k_remain);
            ks[x] += add as u64;
            k_remain -= add;
        }
        for &x in order.iter().rev() {
            if k_remain >= 0 {
                break;
            }
            let spare = (ks[x] - 1) as i128;
            let take = spare.min(-k_remain);
            ks[x] -= take as u64;
            k_remain += take;
        }
    }
    ks
}

/// Selection cost of a piece (DEFT Eq. 3, deft.md §1.3): `size·log2(k_x)`, or `size` when
/// k_x ≤ 1 (the reference code's guard against a zero cost).
pub fn cost(size: u64, k: u64) -> f64 {
    if k > 1 {
        size as f64 * (k as f64).log2()
    } else {
        size as f64
    }
}

/// A bin in the min-heap: least load first, then the lower bin index.
#[derive(PartialEq)]
struct Bin(f64, usize);
impl Eq for Bin {}
impl Ord for Bin {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap.
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}
impl PartialOrd for Bin {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Greedy LPT bin-packing (DEFT Alg. 4, deft.md §1.3): cost [`cost`]; the costliest remaining
/// piece goes to the least-loaded bin; ties go to the lower piece index, then the lower bin
/// index (the reference's `list.index(max)` / `list.index(min)`). Returns each piece's bin.
pub fn bin_pack(pieces: &[Piece], ks: &[u64], p: usize) -> Vec<usize> {
    assert_eq!(pieces.len(), ks.len(), "one k per piece");
    let p = p.max(1);
    let costs: Vec<f64> = pieces
        .iter()
        .zip(ks)
        .map(|(pc, &k)| cost(pc.size(), k))
        .collect();
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]));
    let mut heap: BinaryHeap<Bin> = (0..p).map(|b| Bin(0.0, b)).collect();
    let mut bins = vec![0usize; pieces.len()];
    for x in order {
        let Bin(load, b) = heap.pop().expect("p ≥ 1 bins");
        bins[x] = b;
        heap.push(Bin(load + costs[x], b));
    }
    bins
}

/// Cost load of each bin (DEFT Eq. 4: C_i = Σ_{x ∈ bin i} cost_x).
pub fn bin_loads(pieces: &[Piece], ks: &[u64], bins: &[usize], p: usize) -> Vec<f64> {
    let mut loads = vec![0.0; p.max(1)];
    for ((pc, &k), &b) in pieces.iter().zip(ks).zip(bins) {
        loads[b] += cost(pc.size(), k);
    }
    loads
}

/// The worker that takes bin `bin` at step `step` (deft.md §1.3: worker r takes bin
/// `(t + r) mod P`, so the bin→worker mapping shifts by one each step).
pub fn worker_of_bin(bin: usize, step: u32, p: usize) -> usize {
    let t = step as usize % p;
    (bin + p - t) % p
}

/// Per-piece L2 norms of a flat vector (one pass; f64 accumulation, sequential inside a piece
/// so the result does not depend on threading).
pub fn piece_norms(layout: &Layout, pieces: &[Piece], flat: &[f32]) -> Vec<f64> {
    pieces
        .iter()
        .map(|pc| gradkit_sparsify::deft::range_norm(&flat[pc.flat_range(layout)]))
        .collect()
}

/// One step's plan (deft.md §1.7): norms of the leader's error-compensated gradient, k
/// allocation, bin-packing, then `plan/1` rows where worker r takes bin `(step + r) mod P` and
/// each row's k is the leader's k_x. Rows are ordered by worker, then piece order.
pub fn plan_step(
    layout: &Layout,
    pieces: &[Piece],
    leader_acc_flat: &[f32],
    k: u64,
    p: usize,
    step: u32,
    topup: bool,
) -> Vec<PlanRow> {
    let norms = piece_norms(layout, pieces, leader_acc_flat);
    let ks = allocate_k(pieces, &norms, k, topup);
    let bins = bin_pack(pieces, &ks, p);
    plan_rows(layout, pieces, &ks, &bins, p, step)
}

/// `plan/1` rows for given k and bins (worker r takes bin `(step + r) mod P`).
pub fn plan_rows(
    layout: &Layout,
    pieces: &[Piece],
    ks: &[u64],
    bins: &[usize],
    p: usize,
    step: u32,
) -> Vec<PlanRow> {
    let p = p.max(1);
    let mut idx: Vec<usize> = (0..pieces.len()).collect();
    idx.sort_by_key(|&x| (worker_of_bin(bins[x], step, p), x));
    idx.into_iter()
        .map(|x| {
            let pc = &pieces[x];
            let l = &layout.layers[pc.layer];
            PlanRow {
                step,
                worker: worker_of_bin(bins[x], step, p) as u32,
                layer_id: l.layer_id,
                layer: l.name.clone(),
                start: pc.start,
                end: pc.end,
                k: Some(ks[x]),
            }
        })
        .collect()
}

/// DEFT's plan for one step, with what the leader decided, what each worker then selected
/// with its own k_x, and what it cost.
#[derive(Clone, Debug)]
pub struct DeftStep {
    pub step: u32,
    /// The trace rank whose accumulator set the norms (`step mod P`, then mod the trace's ranks).
    pub leader: usize,
    /// `plan/1` rows; each row's k is the leader's k_x (what the broadcast plan carries).
    pub rows: Vec<PlanRow>,
    /// k_x of each piece (the leader's).
    pub ks: Vec<u64>,
    /// Bin of each piece.
    pub bins: Vec<usize>,
    /// Cost load of each worker (Eq. 4, with the leader's k_x, as the bin-packing saw it),
    /// indexed by worker.
    pub loads: Vec<f64>,
    /// The leader's Σk_x over each worker's pieces, and the elements of those pieces.
    pub worker_k: Vec<u64>,
    pub worker_elements: Vec<u64>,
    /// Indices each worker actually selected: in its own pieces, with the k_x its *own*
    /// accumulator's norms give (deft.md §1.2: "each worker runs this locally on its own acc").
    pub worker_selected: Vec<u64>,
    /// Wall time of each worker's layer-wise top-k over its own pieces (Alg. 5), seconds.
    pub worker_select_s: Vec<f64>,
    /// Size of the union of all workers' DEFT selections, counted from the indices
    /// (|∪_w selection_w|). The pieces are disjoint, so this is Σ worker_selected, which is
    /// ≈ k but not k: each worker's k_x come from its own norms.
    pub union_deft: u64,
    /// Size of the union of all ranks' plain top-k selections on the same accumulators
    /// (`None` when not asked for).
    pub union_topk: Option<u64>,
    /// Mean wall time of one plain top-k over a rank's whole accumulator, seconds
    /// (`None` when the build-up comparison was not asked for).
    pub topk_select_s: Option<f64>,
}

/// A selection function: indices of the k largest |x| of a slice, any order.
pub type Select<'a> = &'a (dyn Fn(&[f32], usize) -> Vec<u32> + Sync);

/// DEFT over a trace (deft.md §1.0, §1.7): per-rank error feedback (`acc = residual + grad`),
/// the rotating leader's plan, each worker's layer-wise top-k in its own pieces with its own
/// norm-derived k_x (Alg. 3 and 5), and the residual update
/// (`acc[idx] = 0` on every rank for the union of the selections).
pub struct DeftPlanner {
    pub layout: Layout,
    pub pieces: Vec<Piece>,
    pub p: usize,
    pub k: u64,
    pub topup: bool,
    /// Error feedback on (`--no-residual` turns it off).
    pub residual: bool,
    /// Each trace rank's error-feedback residual (gradkit-sparsify's one implementation).
    res: Vec<Residual>,
}

impl DeftPlanner {
    /// A planner for `p` workers selecting `k` of the model's elements per step.
    pub fn new(layout: &Layout, p: usize, k: u64, topup: bool, residual: bool) -> Self {
        DeftPlanner {
            pieces: pieces(layout, p),
            layout: layout.clone(),
            p: p.max(1),
            k,
            topup,
            residual,
            res: Vec::new(),
        }
    }

    /// Plans one step from every trace rank's flat gradient. Worker w searches with trace rank
    /// `w mod R`'s accumulator. The leader's norms give the k_x the bin-packing balances
    /// (and the rows carry); every worker then allocates k over the pieces from its *own*
    /// accumulator's norms and selects its own k_x in its pieces, as in the paper and in the
    /// DEFT collective (deft.md §1.2, §1.7), so the union's size is measured, not assumed.
    /// `select` picks the top-k of a slice; with `buildup`, plain top-k over each rank's whole
    /// accumulator is also run (and timed) to measure the union it would send.
    pub fn step(
        &mut self,
        step: u32,
        grads: &[Vec<f32>],
        select: Select,
        buildup: bool,
    ) -> DeftStep {
        self.step_owned(step, grads.to_vec(), select, buildup)
    }

    /// [`DeftPlanner::step`] consuming the gradients: each becomes its rank's accumulator in
    /// place, so a step is held once, not twice (docs/MEMORY.md).
    pub fn step_owned(
        &mut self,
        step: u32,
        grads: Vec<Vec<f32>>,
        select: Select,
        buildup: bool,
    ) -> DeftStep {
        let r = grads.len().max(1);
        if self.res.len() != grads.len() {
            self.res = vec![Residual::default(); grads.len()];
        }
        let accs: Vec<Vec<f32>> = if self.residual {
            self.res
                .iter()
                .zip(grads)
                .map(|(e, g)| e.accumulate(g))
                .collect()
        } else {
            grads
        };
        let p = self.p;
        let leader = (step as usize % p) % r;
        // Each trace rank's own allocation (one norm pass per rank).
        let rank_ks: Vec<Vec<u64>> = accs
            .iter()
            .map(|a| {
                let norms = piece_norms(&self.layout, &self.pieces, a);
                allocate_k(&self.pieces, &norms, self.k, self.topup)
            })
            .collect();
        let ks = rank_ks[leader].clone();
        let bins = bin_pack(&self.pieces, &ks, p);
        let rows = plan_rows(&self.layout, &self.pieces, &ks, &bins, p, step);
        let mut loads = vec![0.0; p];
        let mut worker_k = vec![0u64; p];
        let mut worker_elements = vec![0u64; p];
        let mut mine: Vec<Vec<usize>> = vec![Vec::new(); p];
        for (x, pc) in self.pieces.iter().enumerate() {
            let w = worker_of_bin(bins[x], step, p);
            loads[w] += cost(pc.size(), ks[x]);
            worker_k[w] += ks[x];
            worker_elements[w] += pc.size();
            mine[w].push(x);
        }
        let (chosen, worker_selected, worker_select_s) =
            self.select_assigned(&mine, &accs, &rank_ks, select);
        let union_deft = chosen.len() as u64;
        let (union_topk, topk_select_s) = match buildup && !accs.is_empty() {
            true => {
                let (u, t) = topk_union(&accs, self.k as usize, select);
                (Some(u), Some(t))
            }
            false => (None, None),
        };
        if self.residual {
            // DEFT Algorithm 1: every worker sends its values at the union, so all of it
            // leaves every residual.
            for (e, acc) in self.res.iter_mut().zip(accs) {
                e.settle(acc, Leaves::Result, &[], &chosen);
            }
        }
        DeftStep {
            step,
            leader,
            rows,
            ks,
            bins,
            loads,
            worker_k,
            worker_elements,
            worker_selected,
            worker_select_s,
            union_deft,
            union_topk,
            topk_select_s,
        }
    }
}

impl DeftPlanner {
    /// Each worker's top-k in the pieces assigned to it (`mine[w]`), on its accumulator with
    /// its own allocation: the union of the selections (sorted, deduplicated), and per worker
    /// the entries it selected and the seconds it took.
    fn select_assigned(
        &self,
        mine: &[Vec<usize>],
        accs: &[Vec<f32>],
        rank_ks: &[Vec<u64>],
        select: Select,
    ) -> (Vec<u32>, Vec<u64>, Vec<f64>) {
        let r = accs.len().max(1);
        let mut selected = vec![0u64; mine.len()];
        let mut secs = vec![0.0f64; mine.len()];
        let mut chosen: Vec<u32> = Vec::new();
        for (w, xs) in mine.iter().enumerate() {
            let acc = &accs[w % r];
            let own = &rank_ks[w % r];
            let t = std::time::Instant::now();
            let before = chosen.len();
            for &x in xs {
                let range = self.pieces[x].flat_range(&self.layout);
                let base = range.start as u32;
                chosen.extend(
                    select(&acc[range], own[x] as usize)
                        .into_iter()
                        .map(|i| i + base),
                );
            }
            secs[w] = t.elapsed().as_secs_f64();
            selected[w] = (chosen.len() - before) as u64;
        }
        chosen.sort_unstable();
        chosen.dedup();
        (chosen, selected, secs)
    }
}

/// Plain Top-k's build-up: the size of the union of every rank's top-k, and the mean seconds
/// one rank's top-k took.
fn topk_union(accs: &[Vec<f32>], k: usize, select: Select) -> (u64, f64) {
    let mut all: Vec<u32> = Vec::new();
    let mut secs = 0.0;
    for a in accs {
        let t = std::time::Instant::now();
        let s = select(a, k);
        secs += t.elapsed().as_secs_f64();
        all.extend(s);
    }
    all.sort_unstable();
    all.dedup();
    (all.len() as u64, secs / accs.len() as f64)
}

/// Plain Top-k's selection cost on the whole model, `n_g·log2 k` (deft.md §3).
pub fn topk_cost(n: u64, k: u64) -> f64 {
    cost(n, k)
}
