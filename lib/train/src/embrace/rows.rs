//! EmbRace's row bookkeeping (embrace.md §2.2, §2.3): the row-wise ("lazy") optimiser of the
//! embedding rows ([`RowOpt`]), distinct ids and the vertical split into prior and delayed rows
//! (Algorithm 1, [`split_prior`]), picking gradient rows out of a flat gradient or a coalesced
//! one, one exchange of embedding-gradient rows (AlltoAll for embrace, AllGather for the
//! baselines), the raw per-token message of `allgather-raw` ([`per_token_rows`]), and the
//! whole table gathered on rank 0 for the final report.

use std::collections::BTreeSet;

use anyhow::{bail, Result};
use gradkit_collectives::alltoall::{embedding_backward, slice, sparse_allgather, Rows};
use gradkit_comm::{Comm, CommExt};

/// Row-local optimiser for embedding rows (see the `embrace` module docs, "Row-wise
/// optimiser").
#[derive(Clone, Debug)]
pub struct RowOpt {
    pub adam: Option<(f32, f32, f32)>,
    pub width: usize,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl RowOpt {
    /// `adam = Some((β1, β2, ε))` for lazy Adam, `None` for SGD; state for `rows × width`.
    pub fn new(adam: Option<(f32, f32, f32)>, rows: usize, width: usize) -> Self {
        let n = if adam.is_some() { rows * width } else { 0 };
        RowOpt {
            adam,
            width,
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// Bytes of optimiser state.
    pub fn state_bytes(&self) -> usize {
        4 * (self.m.len() + self.v.len())
    }

    /// Updates rows `ids` of `table` (row-major, `width` columns) with gradient rows `grads`
    /// multiplied by `scale` (1/P: the mean), learning rate `lr`, 0-based `step`.
    /// Same arithmetic as `optim::Sgd`/`optim::Adam` element by element.
    pub fn apply(
        &mut self,
        table: &mut [f32],
        ids: &[u32],
        grads: &[f32],
        scale: f32,
        lr: f32,
        step: u32,
    ) {
        let w = self.width;
        for (k, &id) in ids.iter().enumerate() {
            let base = id as usize * w;
            for j in 0..w {
                let g = grads[k * w + j] * scale;
                let i = base + j;
                match self.adam {
                    None => table[i] -= lr * g,
                    Some((b1, b2, eps)) => {
                        let t = step as i32 + 1;
                        let bc1 = 1.0 - b1.powi(t);
                        let bc2 = 1.0 - b2.powi(t);
                        self.m[i] = b1 * self.m[i] + (1.0 - b1) * g;
                        self.v[i] = b2 * self.v[i] + (1.0 - b2) * g * g;
                        let mh = self.m[i] / bc1;
                        let vh = self.v[i] / bc2;
                        table[i] -= lr * mh / (vh.sqrt() + eps);
                    }
                }
            }
        }
    }
}

/// Sorted distinct ids.
pub fn unique(ids: &[u32]) -> Vec<u32> {
    let s: BTreeSet<u32> = ids.iter().copied().collect();
    s.into_iter().collect()
}

/// Vertical split (embrace.md Algorithm 1): `coalesced` (sorted distinct rows of this step)
/// into prior rows (those in `next_all`, the next step's gathered batch of all ranks) and
/// delayed rows (the rest); both sorted.
pub fn split_prior(coalesced: &[u32], next_all: &[Vec<u32>]) -> (Vec<u32>, Vec<u32>) {
    let next: BTreeSet<u32> = next_all.iter().flatten().copied().collect();
    coalesced.iter().partition(|i| next.contains(i))
}

/// Gradient rows `ids` (sorted) of the table at `off` (width d) in the flat gradient `g`.
pub(super) fn rows_of(g: &[f32], off: usize, d: usize, ids: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * d);
    for &i in ids {
        let a = off + i as usize * d;
        out.extend_from_slice(&g[a..a + d]);
    }
    out
}

/// The rows `ids` (a subset of `co.ids`, any order) of the coalesced gradient `co`.
pub(super) fn pick_rows(co: &Rows, ids: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * co.width);
    for i in ids {
        let k = co
            .ids
            .binary_search(i)
            .expect("a subset of the coalesced rows");
        out.extend_from_slice(co.row(k));
    }
    out
}

/// One exchange of embedding-gradient rows `ids` (sorted, with full-width rows `grads`); returns the summed rows this rank must apply (its columns for embrace,
/// all columns for allgather).
pub(super) fn grad_exchange(
    comm: &dyn Comm,
    allgather: bool,
    v: usize,
    d: usize,
    ids: &[u32],
    grads: &[f32],
) -> Result<Rows> {
    if allgather {
        sparse_allgather(comm, &Rows::new(ids.to_vec(), d, grads.to_vec())?)
    } else {
        embedding_backward(comm, v, d, ids, grads)
    }
}

/// A raw (one row per token, duplicates included) message rebuilt from coalesced rows
/// `u`/`gu` when only the table gradient is known: the first occurrence of a row carries
/// its summed gradient, later occurrences zero rows. `allgather-raw` itself now sends each
/// token's own row gradient (the model returns them); this keeps the same volume and sum.
pub fn per_token_rows(tokens: &[u32], u: &[u32], gu: &[f32], d: usize) -> Result<Rows> {
    let mut seen = BTreeSet::new();
    let mut vals = Vec::with_capacity(tokens.len() * d);
    for &t in tokens {
        if seen.insert(t) {
            let k = u
                .binary_search(&t)
                .map_err(|_| anyhow::anyhow!("token {t} has no coalesced gradient row"))?;
            vals.extend_from_slice(&gu[k * d..(k + 1) * d]);
        } else {
            vals.extend(std::iter::repeat_n(0.0f32, d));
        }
    }
    Rows::new(tokens.to_vec(), d, vals)
}

/// The whole V × d table on rank 0, `None` on the others (the column shards sent to rank
/// 0 by one AlltoAll in which only rank 0 receives; phase `final_gather`, outside the
/// per-step counters).
pub(super) fn full_table(
    comm: &dyn Comm,
    allgather: bool,
    table: &[f32],
    v: usize,
    d: usize,
) -> Result<Option<Vec<f32>>> {
    if allgather {
        return Ok((comm.rank() == 0).then(|| table.to_vec()));
    }
    let p = comm.size();
    let mut sends = vec![Vec::new(); p];
    sends[0] = table.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let parts = {
        let _ph = comm.phase("final_gather");
        comm.alltoallv(sends)?
    };
    if comm.rank() != 0 {
        return Ok(None);
    }
    let mut full = vec![0f32; v * d];
    for (k, part) in parts.iter().enumerate() {
        let c = slice(d, p, k);
        let wk = c.len();
        if part.len() != v * wk {
            bail!(
                "column shard of rank {k} has {} values, expected {}",
                part.len(),
                v * wk
            );
        }
        for (row, src) in full.chunks_exact_mut(d).zip(part.chunks_exact(wk.max(1))) {
            for (o, b) in row[c.clone()].iter_mut().zip(src) {
                *o = f32::from_bits(*b);
            }
        }
    }
    Ok(Some(full))
}
