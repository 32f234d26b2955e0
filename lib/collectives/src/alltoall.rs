//! EmbRace's sparsity-aware hybrid communication (embrace.md §1): embedding tables are
//! sharded across the P ranks (by contiguous column slices, the paper's choice, or by row
//! slices for comparison) and their row-sparse gradients travel by **AlltoAll**; every other
//! ("dense") layer is ring-allreduced.
//!
//! Library functions for `gradtrain`: [`embedding_forward`] (§1.2 step 2: every rank looks up
//! its column slice for all ranks' token ids and alltoalls the slices back) and
//! [`embedding_backward`] (§1.2 step 4–5: coalesce duplicate rows, send each owner its column
//! slice with the row ids, owners sum); [`embedding_forward_unique`] is the forward with
//! each rank's duplicate lookups removed (one row per distinct id, expanded by the receiver;
//! docs/gradtrain.md, not the paper's). [`sparse_allgather`] (rows coalesced first) and
//! [`sparse_allgather_raw`] (one row per token, as Horovod/DDP send them) are the AllGather
//! baseline of §1.3.
//!
//! ## `--algo alltoall` on the flat index space
//! [`AllToAllReducer`] receives one rank's step as a [`Flat`]:
//! - `Flat::Dense`: no layer is an embedding; the whole vector is ring-allreduced.
//! - `Flat::Sparse`: every layer whose layout `shape` is 2-D `[V, d]` is an **embedding
//!   layer**; its entries must form whole rows (each present row has all d columns, given as
//!   the d consecutive flat indices `row·d .. row·d+d`; rows may repeat — duplicates are
//!   coalesced). Every other layer is dense: it is densified (absent entries are 0), fused with
//!   the other dense layers in `layer_id` order and ring-allreduced once.
//!
//! So the tool marks embeddings by passing sparse input with a 2-D `shape` on the embedding
//! layers; dense layers should carry a non-2-D shape (or none) — a dense 2-D layer passed in
//! a sparse input is treated as an embedding, which still gives the exact sum (all its rows
//! go through the AlltoAll) but not the ring's traffic. [`check_embedding_rows`] validates
//! `tensor/1` rows up front with one-line errors (a sparse layer without a 2-D `shape`,
//! indices that do not cover whole rows).
//!
//! The result is `Flat::Sparse`: embedding layers hold the union of the ranks' rows with the
//! summed values (gathered from the owners in the `gather_result` phase, which the real
//! system would not need: there each rank keeps only its shard); dense layers hold every
//! position. The sum, or the mean with `--op mean`.
//!
//! Traffic phases: `alltoall` (the gradient exchange), `gather_result`, and the ring's
//! `reduce_scatter` / `allgather` for the dense layers. Bytes sent by rank r in `alltoall`
//! (one table, column split): `4·|u_r|·(P−1)` row ids plus `4·|u_r|·(d − w_r)` values, where
//! |u_r| is the number of distinct rows on rank r and w_r its own slice width; with P | d
//! this is `(P−1)/P·α_r·M` plus the ids (embrace.md §1.3, one of the two AlltoAlls).

use std::ops::Range;

use anyhow::{bail, Result};
use gradkit_comm::{Comm, CommExt};
use gradkit_core::trace::{Layout, Sparse};
use gradkit_core::TensorRow;

use crate::dense::chunk_start;
use crate::params::Split;
use crate::{Flat, Op, Reducer, StepOutput};

/// Slice `k` of `n` items cut into `p` near-equal contiguous slices (sizes differ by ≤ 1).
pub fn slice(n: usize, p: usize, k: usize) -> Range<usize> {
    chunk_start(n, p, k)..chunk_start(n, p, k + 1)
}

/// Row-sparse block: `ids.len()` rows of `width` values each, row-major.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rows {
    pub ids: Vec<u32>,
    pub width: usize,
    pub values: Vec<f32>,
}

impl Rows {
    pub fn new(ids: Vec<u32>, width: usize, values: Vec<f32>) -> Result<Self> {
        if values.len() != ids.len() * width {
            bail!(
                "{} row ids of width {width} need {} values, got {}",
                ids.len(),
                ids.len() * width,
                values.len()
            );
        }
        Ok(Rows { ids, width, values })
    }
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.width..(i + 1) * self.width]
    }

    /// Coalescing (embrace.md §2.2): one row per distinct id, ids ascending, duplicates summed
    /// in their input order.
    pub fn coalesce(&self) -> Rows {
        let w = self.width;
        let mut order: Vec<usize> = (0..self.ids.len()).collect();
        order.sort_by_key(|&i| self.ids[i]); // stable: duplicates keep input order
        let mut out = Rows {
            ids: Vec::with_capacity(order.len()),
            width: w,
            values: Vec::with_capacity(order.len() * w),
        };
        for i in order {
            let id = self.ids[i];
            if out.ids.last() == Some(&id) {
                let at = out.values.len() - w;
                for (o, v) in out.values[at..].iter_mut().zip(self.row(i)) {
                    *o += *v;
                }
            } else {
                out.ids.push(id);
                out.values.extend_from_slice(self.row(i));
            }
        }
        out
    }

    /// Concatenates blocks of equal width (in the order given).
    fn concat(blocks: Vec<Rows>, width: usize) -> Rows {
        let mut out = Rows {
            width,
            ..Default::default()
        };
        for b in blocks {
            out.ids.extend_from_slice(&b.ids);
            out.values.extend_from_slice(&b.values);
        }
        out
    }
}

/// One message: the row ids, then the bits of the values (one u32 buffer, one message).
fn encode(ids: &[u32], values: impl Iterator<Item = f32>) -> Vec<u32> {
    let mut m = Vec::with_capacity(ids.len());
    m.extend_from_slice(ids);
    m.extend(values.map(f32::to_bits));
    m
}

fn decode(m: Vec<u32>, width: usize) -> Result<Rows> {
    if !m.len().is_multiple_of(1 + width) {
        bail!(
            "AlltoAll message of {} words is not rows of width {width} plus ids",
            m.len()
        );
    }
    let n = m.len() / (1 + width);
    let values = m[n..].iter().map(|&b| f32::from_bits(b)).collect();
    let mut ids = m;
    ids.truncate(n);
    Ok(Rows { ids, width, values })
}

/// Width of the slice rank `k` owns (columns) or the full width (rows).
fn owner_width(split: Split, d: usize, p: usize, k: usize) -> usize {
    match split {
        Split::Columns => slice(d, p, k).len(),
        Split::Rows => d,
    }
}

/// The gradient AlltoAll (embrace.md §1.2 step 4–5) for a table of `v` rows: `rows` (full
/// width d, any order, duplicates allowed) are coalesced, each owner k gets its part (its
/// column slice of every row, or the rows in its row slice) with the row ids, and the owner
/// sums what it receives. Returns this rank's owned part of the summed gradient: ids
/// ascending, width = own column-slice width (columns) or d (rows).
pub fn exchange(comm: &dyn Comm, split: Split, v: usize, rows: &Rows) -> Result<Rows> {
    let (p, r, d) = (comm.size(), comm.rank(), rows.width);
    if let Some(bad) = rows.ids.iter().find(|&&i| i as usize >= v) {
        bail!("row id {bad} is outside the table's {v} rows");
    }
    let u = rows.coalesce();
    let sends: Vec<Vec<u32>> = (0..p)
        .map(|k| match split {
            Split::Columns => {
                let c = slice(d, p, k);
                encode(
                    &u.ids,
                    (0..u.len()).flat_map(|i| u.row(i)[c.clone()].iter().copied()),
                )
            }
            Split::Rows => {
                let rr = slice(v, p, k);
                let lo = u.ids.partition_point(|&i| (i as usize) < rr.start);
                let hi = u.ids.partition_point(|&i| (i as usize) < rr.end);
                encode(&u.ids[lo..hi], u.values[lo * d..hi * d].iter().copied())
            }
        })
        .collect();
    let got = {
        let _ph = comm.phase("alltoall");
        comm.alltoallv(sends)?
    };
    let w = owner_width(split, d, p, r);
    let blocks = got
        .into_iter()
        .map(|m| decode(m, w))
        .collect::<Result<Vec<_>>>()?;
    Ok(Rows::concat(blocks, w).coalesce())
}

/// Backward exchange for `gradtrain` (column split): this rank's token `ids` with their
/// gradient rows `grads` (`ids.len() × d`) → the owner's summed gradient for its column
/// slice (ids ascending, width = its slice width).
pub fn embedding_backward(
    comm: &dyn Comm,
    v: usize,
    d: usize,
    ids: &[u32],
    grads: &[f32],
) -> Result<Rows> {
    let rows = Rows::new(ids.to_vec(), d, grads.to_vec())?;
    exchange(comm, Split::Columns, v, &rows)
}

/// Forward exchange for `gradtrain` (embrace.md §1.2 step 1–2): `shard` is this rank's
/// column slice of the `v × d` table (`v × w_r`, row-major), `ids_per_rank[j]` the token ids
/// of rank j's batch (the gathered batch, identical on every rank). Looks up its columns for
/// every rank's ids, alltoalls the slices back and returns this rank's `T_r × d` rows.
/// Bytes sent by rank r: `4·w_r·Σ_{j≠r} T_j` (one row slice per token, the paper's).
pub fn embedding_forward(
    comm: &dyn Comm,
    shard: &[f32],
    v: usize,
    d: usize,
    ids_per_rank: &[Vec<u32>],
) -> Result<Vec<f32>> {
    lookup_exchange(comm, shard, v, d, ids_per_rank)
}

/// Deduplicated forward exchange (docs/gradtrain.md; not in the paper): as [`embedding_forward`],
/// but owner r sends rank j only its columns of the **distinct** ids of rank j's batch, in
/// ascending id order. No index map travels: the owner derives the distinct ids from the
/// gathered batch it already holds, and rank j expands the `|U_j|` rows to its `T_j` tokens
/// with the inverse index of its own ids. Returns the same `T_r × d` rows as
/// [`embedding_forward`], bit for bit. Bytes sent by rank r: `4·w_r·Σ_{j≠r} |U_j|`.
pub fn embedding_forward_unique(
    comm: &dyn Comm,
    shard: &[f32],
    v: usize,
    d: usize,
    ids_per_rank: &[Vec<u32>],
) -> Result<Vec<f32>> {
    let uniq: Vec<Vec<u32>> = ids_per_rank
        .iter()
        .map(|ids| {
            let mut u = ids.clone();
            u.sort_unstable();
            u.dedup();
            u
        })
        .collect();
    let rows = lookup_exchange(comm, shard, v, d, &uniq)?;
    let (mine, u) = (&ids_per_rank[comm.rank()], &uniq[comm.rank()]);
    let mut out = Vec::with_capacity(mine.len() * d);
    for id in mine {
        let k = u
            .binary_search(id)
            .expect("every id is among the distinct ids");
        out.extend_from_slice(&rows[k * d..(k + 1) * d]);
    }
    Ok(out)
}

/// The forward AlltoAll itself: owner r sends rank j its columns of the rows `req[j]` (in
/// that order); returns the full-width rows of `req[this rank]`. Phase `alltoall_forward`.
fn lookup_exchange(
    comm: &dyn Comm,
    shard: &[f32],
    v: usize,
    d: usize,
    req: &[Vec<u32>],
) -> Result<Vec<f32>> {
    let (p, r) = (comm.size(), comm.rank());
    let my_cols = slice(d, p, r);
    let w = my_cols.len();
    if req.len() != p {
        bail!("embedding_forward needs the ids of all {p} ranks");
    }
    if shard.len() != v * w {
        bail!(
            "embedding shard has {} values, expected {v} rows × {w} columns",
            shard.len()
        );
    }
    let mut sends = Vec::with_capacity(p);
    for ids in req {
        let mut m = Vec::with_capacity(ids.len() * w);
        for &id in ids {
            if id as usize >= v {
                bail!("token id {id} is outside the vocabulary of {v}");
            }
            let at = id as usize * w;
            m.extend_from_slice(&shard[at..at + w]);
        }
        sends.push(m);
    }
    let got = {
        let _ph = comm.phase("alltoall_forward");
        comm.alltoallv(sends)?
    };
    let t = req[r].len();
    let mut out = vec![0f32; t * d];
    for (i, block) in got.into_iter().enumerate() {
        let c = slice(d, p, i);
        if block.len() != t * c.len() {
            bail!("forward block from rank {i} has {} values", block.len());
        }
        for (row, src) in out
            .chunks_exact_mut(d)
            .zip(block.chunks_exact(c.len().max(1)))
        {
            row[c.clone()].copy_from_slice(&src[..c.len()]);
        }
    }
    Ok(out)
}

/// The Horovod-AllGather baseline (embrace.md §1.3): every rank's rows (ids + full rows)
/// are ring-allgathered and summed on every rank, each rank's duplicates merged before
/// sending. Phase `allgather_sparse`.
pub fn sparse_allgather(comm: &dyn Comm, rows: &Rows) -> Result<Rows> {
    allgather_rows(comm, &rows.coalesce())
}

/// The raw AllGather baseline, as Horovod's and PyTorch DDP's sparse allreduce do it: every
/// rank's rows are allgathered **as given** (no coalescing before sending: one row per
/// token, duplicates included), then summed on every rank. A rank's message is
/// `rows.len()·(1 + width)` u32 words. Phase `allgather_sparse`.
pub fn sparse_allgather_raw(comm: &dyn Comm, rows: &Rows) -> Result<Rows> {
    allgather_rows(comm, rows)
}

/// Allgathers `rows` as they are and sums every rank's rows by id.
fn allgather_rows(comm: &dyn Comm, rows: &Rows) -> Result<Rows> {
    let m = encode(&rows.ids, rows.values.iter().copied());
    let all = {
        let _ph = comm.phase("allgather_sparse");
        comm.allgatherv(m)?
    };
    let blocks = all
        .into_iter()
        .map(|m| decode(m, rows.width))
        .collect::<Result<Vec<_>>>()?;
    Ok(Rows::concat(blocks, rows.width).coalesce())
}

/// Gathers the owners' parts into the full reduced rows (every rank; phase `gather_result`).
fn gather_owned(comm: &dyn Comm, split: Split, d: usize, owned: &Rows) -> Result<Rows> {
    let p = comm.size();
    let all = {
        let _ph = comm.phase("gather_result");
        comm.allgatherv(encode(&owned.ids, owned.values.iter().copied()))?
    };
    let parts = all
        .into_iter()
        .enumerate()
        .map(|(k, m)| decode(m, owner_width(split, d, p, k)))
        .collect::<Result<Vec<_>>>()?;
    Ok(match split {
        Split::Rows => Rows::concat(parts, d),
        Split::Columns => {
            // Every owner received every rank's rows, so all parts have the same ids.
            let ids = parts[0].ids.clone();
            let mut values = vec![0f32; ids.len() * d];
            for (k, part) in parts.iter().enumerate() {
                if part.ids != ids {
                    bail!("column owners disagree on the reduced rows (algorithm bug)");
                }
                let c = slice(d, p, k);
                for (i, row) in values.chunks_exact_mut(d).enumerate() {
                    row[c.clone()].copy_from_slice(part.row(i));
                }
            }
            Rows {
                ids,
                width: d,
                values,
            }
        }
    })
}

/// `[V, d]` of an embedding layer, checked against `numel`.
fn table_shape(name: &str, numel: u64, shape: &[u32]) -> Result<(usize, usize)> {
    let (v, d) = (shape[0] as usize, shape[1] as usize);
    if (v as u64) * (d as u64) != numel || d == 0 {
        bail!("layer `{name}`: shape {shape:?} does not match numel {numel} (column `shape`)");
    }
    Ok((v, d))
}

/// Whole-row entries of one layer (indices relative to the layer) → rows of width d.
fn parse_rows(name: &str, d: usize, idx: &[u32], vals: &[f32]) -> Result<Rows> {
    if !idx.len().is_multiple_of(d) {
        bail!(
            "layer `{name}`: {} sparse indices do not cover whole rows of width {d} (column `indices`)",
            idx.len()
        );
    }
    let mut ids = Vec::with_capacity(idx.len() / d);
    for (k, c) in idx.chunks_exact(d).enumerate() {
        let row = c[0] as usize / d;
        if c.iter()
            .enumerate()
            .any(|(j, &i)| i as usize != row * d + j)
        {
            bail!(
                "layer `{name}`: sparse indices near position {} do not cover whole rows of width {d} (column `indices`)",
                k * d
            );
        }
        ids.push(row as u32);
    }
    Ok(Rows {
        ids,
        width: d,
        values: vals.to_vec(),
    })
}

/// Validates `tensor/1` rows for `--algo alltoall`: every sparse row is an embedding layer
/// and needs a 2-D `shape` `[V, d]` matching `numel` and indices covering whole rows.
pub fn check_embedding_rows(rows: &[TensorRow]) -> Result<()> {
    for r in rows {
        let Some(idx) = &r.indices else { continue };
        let at = format!("step {} rank {} layer `{}`", r.step, r.rank, r.layer);
        let shape = match &r.shape {
            Some(s) if s.len() == 2 => s,
            Some(s) => bail!(
                "{at}: an alltoall embedding layer needs a 2-D shape [V, d], got {s:?} (column `shape`)"
            ),
            None => bail!(
                "{at}: an alltoall embedding layer needs a 2-D shape [V, d] (column `shape` is null)"
            ),
        };
        let (_, d) =
            table_shape(&r.layer, r.numel, shape).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        parse_rows(&r.layer, d, idx, &r.values)
            .map_err(|e| anyhow::anyhow!("step {} rank {}: {e}", r.step, r.rank))?;
    }
    Ok(())
}

/// `--algo embrace` (old spelling `alltoall`).
pub const DESCRIPTOR: crate::algo::Descriptor = crate::algo::Descriptor {
    name: "embrace",
    aliases: &["alltoall"],
    family: crate::algo::Family::Embedding,
    paper: "EmbRace §3 (hybrid communication), Table 2",
    description: "EmbRace's AlltoAll of row-sparse embedding gradients + ring",
    reads: &[crate::algo::Knob::Op, crate::algo::Knob::Split],
    exchange: crate::algo::AsExchange::new(
        "EmbRace: token embedding sharded by columns, AlltoAll lookups and row gradients, ring for the rest (--schedule)",
    ),
    ..crate::algo::Descriptor::base(|params| {
        Ok(Box::new(AllToAllReducer::new(params.split, params.op)))
    })
};

/// EmbRace's algorithm, the embedding family's one.
pub const ALGOS: &[crate::Algo] = &[crate::Algo(&DESCRIPTOR)];

/// `--algo alltoall` (EmbRace hybrid communication) as a [`Reducer`]; see the module docs
/// for how layers are classified. Reads `params.split` and `params.op`.
pub struct AllToAllReducer {
    split: Split,
    op: Op,
}

impl AllToAllReducer {
    pub fn new(split: Split, op: Op) -> Self {
        AllToAllReducer { split, op }
    }
}

impl Reducer for AllToAllReducer {
    fn name(&self) -> &'static str {
        "embrace"
    }

    fn reduce(
        &mut self,
        comm: &dyn Comm,
        _step: u32,
        layout: &Layout,
        input: Flat,
    ) -> Result<StepOutput> {
        let p = comm.size();
        let scale = |x: &mut [f32]| {
            if self.op == Op::Mean {
                let inv = 1.0 / p as f32;
                x.iter_mut().for_each(|v| *v *= inv);
            }
        };
        let s = match input {
            Flat::Dense(mut v) => {
                if v.len() as u64 != layout.total() {
                    bail!(
                        "input has {} values, layout has {}",
                        v.len(),
                        layout.total()
                    );
                }
                crate::dense::ring(comm, &mut v)?;
                scale(&mut v);
                return Ok(StepOutput::new(Flat::Dense(v)));
            }
            Flat::Sparse(s) => s,
        };
        let (per, is_emb) = split_by_layer(&s, layout)?;
        // Parse every embedding layer before any communication, so bad input fails early.
        let mut tables = Vec::new();
        for (l, info) in layout.layers.iter().enumerate() {
            if is_emb[l] {
                let shape = info.shape.as_deref().expect("2-D");
                let (v, d) = table_shape(&info.name, info.numel, shape)?;
                let rows = parse_rows(&info.name, d, &per[l].0, &per[l].1)?;
                tables.push((l, v, d, rows));
            }
        }
        // Dense layers: fused, ring-allreduced once.
        let mut fused = fuse_dense(layout, &per, &is_emb);
        if !fused.is_empty() {
            crate::dense::ring(comm, &mut fused)?;
            scale(&mut fused);
        }
        let mut metrics = Vec::new();
        let mut reduced = Vec::with_capacity(tables.len());
        let (mut local_rows, mut owned_values) = (0usize, 0usize);
        for (l, v, d, rows) in tables {
            local_rows += rows.coalesce().len();
            let owned = exchange(comm, self.split, v, &rows)?;
            owned_values += owned.values.len();
            let mut full = gather_owned(comm, self.split, d, &owned)?;
            scale(&mut full.values);
            reduced.push((l, d, full));
        }
        metrics.push(("emb_rows_local".into(), local_rows as f64));
        metrics.push(("emb_values_owned".into(), owned_values as f64));
        let out = assemble(layout, &is_emb, &fused, reduced);
        Ok(StepOutput {
            result: Flat::Sparse(out),
            metrics,
            contributed: None,
        })
    }
}

/// Each layer's entries (indices relative to the layer, in input order), and which layers are
/// embedding tables (a 2-D shape).
#[allow(clippy::type_complexity)]
fn split_by_layer(s: &Sparse, layout: &Layout) -> Result<(Vec<(Vec<u32>, Vec<f32>)>, Vec<bool>)> {
    let nl = layout.layers.len();
    let mut per: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); nl];
    for (&i, &x) in s.indices.iter().zip(&s.values) {
        if i as u64 >= layout.total() {
            bail!(
                "flat index {i} is outside the layout's {} elements",
                layout.total()
            );
        }
        let l = layout.layer_of(i as u64);
        per[l].0.push(i - layout.layers[l].offset as u32);
        per[l].1.push(x);
    }
    let is_emb = layout
        .layers
        .iter()
        .map(|l| l.shape.as_ref().is_some_and(|s| s.len() == 2))
        .collect();
    Ok((per, is_emb))
}

/// The dense layers' entries, one fused vector in layer order.
fn fuse_dense(layout: &Layout, per: &[(Vec<u32>, Vec<f32>)], is_emb: &[bool]) -> Vec<f32> {
    let mut fused = Vec::new();
    for (l, info) in layout.layers.iter().enumerate() {
        if !is_emb[l] {
            let at = fused.len();
            fused.resize(at + info.numel as usize, 0.0);
            for (&i, &x) in per[l].0.iter().zip(&per[l].1) {
                fused[at + i as usize] += x;
            }
        }
    }
    fused
}

/// The flat sparse result in layer order: each table's reduced rows, each dense layer whole.
fn assemble(
    layout: &Layout,
    is_emb: &[bool],
    fused: &[f32],
    reduced: Vec<(usize, usize, Rows)>,
) -> Sparse {
    let mut out = Sparse::default();
    let mut fpos = 0usize;
    let mut red = reduced.into_iter();
    for (l, info) in layout.layers.iter().enumerate() {
        let off = info.offset as u32;
        if is_emb[l] {
            let (_, d, full) = red.next().expect("one result per table");
            for (k, &id) in full.ids.iter().enumerate() {
                let base = off + id * d as u32;
                out.indices.extend((0..d as u32).map(|j| base + j));
                out.values.extend_from_slice(full.row(k));
            }
        } else {
            let n = info.numel as usize;
            out.indices.extend((0..n as u32).map(|j| off + j));
            out.values.extend_from_slice(&fused[fpos..fpos + n]);
            fpos += n;
        }
    }
    out
}
