//! EmbRace's AlltoAll exchange against dense sums computed here, and its exact volume.

// The references index arrays the way the papers write the maths.
#![allow(clippy::needless_range_loop)]

use gradkit_collectives::alltoall::{
    check_embedding_rows, embedding_backward, embedding_forward, embedding_forward_unique,
    sparse_allgather, Rows,
};
use gradkit_collectives::registry::Split;
use gradkit_collectives::{make_reducer, Flat, Params};
use gradkit_comm::run_local;
use gradkit_core::trace::{Layout, Sparse};
use gradkit_core::TensorRow;

/// gradkit-testkit's seeded generator (SplitMix64) with this file's helpers.
struct Rng(gradkit_testkit::rng::Rng);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(gradkit_testkit::rng::Rng::new(seed))
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
    /// Small integers as f32, so sums are exact in any order.
    fn val(&mut self) -> f32 {
        self.below(17) as f32 - 8.0
    }
}

/// Column slice widths, computed independently of the library: floor(d·k/P) boundaries.
fn width(d: usize, p: usize, k: usize) -> usize {
    d * (k + 1) / p - d * k / p
}

/// Layout: embedding [50, 7], bias [13], embedding [20, 3], dense [4, 5, 2] (3-D: dense).
fn layout() -> Layout {
    Layout::new(vec![
        (0, "emb".into(), 350, Some(vec![50, 7])),
        (1, "bias".into(), 13, Some(vec![13])),
        (2, "emb2".into(), 60, Some(vec![20, 3])),
        (3, "conv".into(), 40, Some(vec![4, 5, 2])),
    ])
}

/// One rank's flat sparse input: random rows (duplicates included, any order) of the two
/// embeddings, random entries of the dense layers.
fn input(seed: u64, rank: usize) -> Sparse {
    let mut g = Rng::new(seed * 1000 + rank as u64);
    let l = layout();
    let mut s = Sparse::default();
    for (li, (v, d)) in [(0usize, (50usize, 7usize)), (2, (20, 3))] {
        let off = l.layers[li].offset as u32;
        let nrows = 1 + g.below(12);
        for _ in 0..nrows {
            let row = g.below(v) as u32;
            for j in 0..d as u32 {
                s.indices.push(off + row * d as u32 + j);
                s.values.push(g.val());
            }
        }
    }
    for li in [1usize, 3] {
        let info = &l.layers[li];
        for i in 0..info.numel as u32 {
            if g.below(3) > 0 {
                s.indices.push(info.offset as u32 + i);
                s.values.push(g.val());
            }
        }
    }
    s
}

#[test]
fn alltoall_equals_dense_sum_for_column_and_row_splits() {
    let l = layout();
    let n = l.total() as usize;
    for split in [Split::Columns, Split::Rows] {
        for p in 1..=5usize {
            let inputs: Vec<Sparse> = (0..p).map(|r| input(p as u64, r)).collect();
            let mut want = vec![0f32; n];
            let mut present = vec![false; n];
            for s in &inputs {
                for (&i, &v) in s.indices.iter().zip(&s.values) {
                    want[i as usize] += v;
                    present[i as usize] = true;
                }
            }
            let params = Params {
                split,
                ..Params::default()
            };
            let got = run_local(p, |comm| {
                let mut red = make_reducer("alltoall", &params)?;
                Ok(red
                    .reduce(comm, 0, &l, Flat::Sparse(inputs[comm.rank()].clone()))?
                    .result)
            })
            .unwrap();
            for (r, res) in got.iter().enumerate() {
                let Flat::Sparse(s) = res else {
                    panic!("sparse result")
                };
                assert!(s.indices.windows(2).all(|w| w[0] < w[1]), "ascending");
                assert_eq!(s.to_dense(n), want, "{split:?} P={p} rank {r}");
                // Embedding entries: exactly the union of the input rows; dense layers: all.
                for (k, info) in l.layers.iter().enumerate() {
                    let lo = info.offset as usize;
                    let hi = lo + info.numel as usize;
                    let mine: Vec<usize> = s
                        .indices
                        .iter()
                        .map(|&i| i as usize)
                        .filter(|&i| i >= lo && i < hi)
                        .collect();
                    let expect: Vec<usize> = if k == 0 || k == 2 {
                        (lo..hi).filter(|&i| present[i]).collect()
                    } else {
                        (lo..hi).collect()
                    };
                    assert_eq!(mine, expect, "layer {}", info.name);
                }
            }
        }
    }
}

#[test]
fn backward_coalesces_duplicates_and_sends_the_formula_bytes() {
    let (v, d) = (40usize, 8usize);
    for p in [2usize, 3, 4, 5] {
        // Rank r's token ids, with duplicates.
        let ids: Vec<Vec<u32>> = (0..p)
            .map(|r| {
                let mut g = Rng::new(77 + r as u64);
                (0..15).map(|_| g.below(v / 2) as u32 * 2).collect()
            })
            .collect();
        let grads: Vec<Vec<f32>> = (0..p)
            .map(|r| {
                let mut g = Rng::new(99 + r as u64);
                (0..15 * d).map(|_| g.val()).collect()
            })
            .collect();
        let mut full = vec![0f32; v * d];
        for r in 0..p {
            for (t, &id) in ids[r].iter().enumerate() {
                for c in 0..d {
                    full[id as usize * d + c] += grads[r][t * d + c];
                }
            }
        }
        let mut all_ids: Vec<u32> = ids.concat();
        all_ids.sort();
        all_ids.dedup();
        let res = run_local(p, |comm| {
            let r = comm.rank();
            let owned = embedding_backward(comm, v, d, &ids[r], &grads[r])?;
            Ok((owned, comm.traffic().total()))
        })
        .unwrap();
        let mut col = 0;
        for (r, (owned, t)) in res.iter().enumerate() {
            let w = width(d, p, r);
            assert_eq!(owned.width, w);
            assert_eq!(owned.ids, all_ids, "owner {r}: one row per distinct id");
            for (i, &id) in owned.ids.iter().enumerate() {
                for c in 0..w {
                    assert_eq!(owned.values[i * w + c], full[id as usize * d + col + c]);
                }
            }
            col += w;
            // Bytes: |u_r| ids to each of P−1 owners, plus the other owners' columns.
            let mut u = ids[r].clone();
            u.sort();
            u.dedup();
            let want = 4 * u.len() * (p - 1) + 4 * u.len() * (d - w);
            assert_eq!(t.bytes_sent as usize, want, "P={p} rank {r}");
            if d % p == 0 {
                // embrace.md §1.3: (P−1)/P·αM values (+ index bytes).
                assert_eq!(
                    t.bytes_sent as usize - 4 * u.len() * (p - 1),
                    (p - 1) * (4 * u.len() * d) / p
                );
            }
        }
    }
}

#[test]
fn forward_returns_the_rows_of_the_full_table_and_formula_bytes() {
    let (v, d) = (30usize, 10usize);
    let mut g = Rng::new(5);
    let table: Vec<f32> = (0..v * d).map(|_| g.val()).collect();
    for p in [1usize, 2, 3, 4] {
        let ids: Vec<Vec<u32>> = (0..p)
            .map(|r| (0..(5 + r)).map(|_| g.below(v) as u32).collect())
            .collect();
        let res = run_local(p, |comm| {
            let r = comm.rank();
            // This rank's column shard, cut here with the independent boundaries.
            let lo = d * r / p;
            let w = width(d, p, r);
            let shard: Vec<f32> = (0..v)
                .flat_map(|row| table[row * d + lo..row * d + lo + w].to_vec())
                .collect();
            let out = embedding_forward(comm, &shard, v, d, &ids)?;
            Ok((out, comm.traffic().total().bytes_sent))
        })
        .unwrap();
        for (r, (out, sent)) in res.iter().enumerate() {
            let want: Vec<f32> = ids[r]
                .iter()
                .flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec())
                .collect();
            assert_eq!(out, &want, "P={p} rank {r}");
            let others: usize = (0..p).filter(|&j| j != r).map(|j| ids[j].len()).sum();
            assert_eq!(*sent as usize, 4 * others * width(d, p, r));
        }
    }
}

#[test]
fn unique_forward_equals_per_token_forward_and_sends_distinct_rows_only() {
    // Batches longer than the vocabulary: every rank has duplicates (pigeonhole).
    let (v, d) = (12usize, 9usize);
    let mut g = Rng::new(11);
    let table: Vec<f32> = (0..v * d).map(|_| g.val()).collect();
    for p in 1usize..=5 {
        let ids: Vec<Vec<u32>> = (0..p)
            .map(|r| (0..(v + 1 + 3 * r)).map(|_| g.below(v) as u32).collect())
            .collect();
        let res = run_local(p, |comm| {
            let r = comm.rank();
            let lo = d * r / p;
            let w = width(d, p, r);
            let shard: Vec<f32> = (0..v)
                .flat_map(|row| table[row * d + lo..row * d + lo + w].to_vec())
                .collect();
            let per_token = embedding_forward(comm, &shard, v, d, &ids)?;
            let s0 = comm.traffic().total().bytes_sent;
            let uniq = embedding_forward_unique(comm, &shard, v, d, &ids)?;
            Ok((per_token, uniq, comm.traffic().total().bytes_sent - s0))
        })
        .unwrap();
        for (r, (per_token, uniq, sent)) in res.iter().enumerate() {
            assert_eq!(uniq, per_token, "P={p} rank {r}: unique = per-token lookup");
            let want: Vec<f32> = ids[r]
                .iter()
                .flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec())
                .collect();
            assert_eq!(uniq, &want, "P={p} rank {r}: rows of the full table");
            // Owner r sends each other rank j its w_r columns of j's distinct ids, no ids.
            let distinct = |x: &[u32]| {
                let mut seen = vec![false; v];
                x.iter()
                    .filter(|&&i| !std::mem::replace(&mut seen[i as usize], true))
                    .count()
            };
            let others: usize = (0..p).filter(|&j| j != r).map(|j| distinct(&ids[j])).sum();
            assert_eq!(
                *sent as usize,
                4 * others * width(d, p, r),
                "P={p} rank {r}"
            );
            if p > 1 && r == 0 {
                let tokens: usize = (1..p).map(|j| ids[j].len()).sum();
                assert!(others < tokens, "P={p}: the batches have duplicates");
            }
        }
    }
}

#[test]
fn allgather_baseline_sum_and_volume_beside_alltoall() {
    let (v, d, p) = (64usize, 16usize, 4usize);
    let rows: Vec<Rows> = (0..p)
        .map(|r| {
            let mut g = Rng::new(200 + r as u64);
            let ids: Vec<u32> = (0..10).map(|_| g.below(v) as u32).collect();
            let vals = (0..10 * d).map(|_| g.val()).collect();
            Rows::new(ids, d, vals).unwrap()
        })
        .collect();
    let uniq: Vec<usize> = rows
        .iter()
        .map(|r| {
            let mut u = r.ids.clone();
            u.sort();
            u.dedup();
            u.len()
        })
        .collect();
    let res = run_local(p, |comm| {
        let r = comm.rank();
        let ag = sparse_allgather(comm, &rows[r])?;
        let t_ag = comm.traffic().total().bytes_sent;
        comm.traffic().reset();
        gradkit_collectives::alltoall::exchange(comm, Split::Columns, v, &rows[r])?;
        let t_a2a = comm.traffic().total().bytes_sent;
        Ok((ag, t_ag, t_a2a))
    })
    .unwrap();
    let mut full = vec![0f32; v * d];
    for r in &rows {
        for (i, &id) in r.ids.iter().enumerate() {
            for c in 0..d {
                full[id as usize * d + c] += r.values[i * d + c];
            }
        }
    }
    for (r, (ag, t_ag, t_a2a)) in res.iter().enumerate() {
        assert_eq!(ag.to_dense_check(v), full);
        // Ring allgather: every block but rank r+1's, each with ids and full rows.
        let want: usize = (0..p)
            .filter(|&i| i != (r + 1) % p)
            .map(|i| 4 * uniq[i] * (1 + d))
            .sum();
        assert_eq!(*t_ag as usize, want);
        assert_eq!(
            *t_a2a as usize,
            4 * uniq[r] * (p - 1) + 4 * uniq[r] * (d - d / p)
        );
        assert!(t_a2a < t_ag);
    }
}

trait DenseCheck {
    fn to_dense_check(&self, v: usize) -> Vec<f32>;
}
impl DenseCheck for Rows {
    fn to_dense_check(&self, v: usize) -> Vec<f32> {
        let mut out = vec![0f32; v * self.width];
        for (i, &id) in self.ids.iter().enumerate() {
            out[id as usize * self.width..(id as usize + 1) * self.width]
                .copy_from_slice(self.row(i));
        }
        out
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let l = layout();
    // Partial row of the embedding.
    let partial = Sparse {
        indices: vec![7, 8, 9],
        values: vec![1.0; 3],
    };
    let err = run_local(2, |comm| {
        let mut red = make_reducer("alltoall", &Params::default())?;
        red.reduce(comm, 0, &l, Flat::Sparse(partial.clone()))?;
        Ok(())
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("whole rows"), "{err:#}");
    // Shape that does not match numel.
    let bad = Layout::new(vec![(0, "emb".into(), 30, Some(vec![4, 7]))]);
    let err = run_local(1, |comm| {
        let mut red = make_reducer("alltoall", &Params::default())?;
        red.reduce(comm, 0, &bad, Flat::Sparse(Sparse::default()))?;
        Ok(())
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("shape"), "{err:#}");
    // tensor/1 rows: a sparse (embedding) layer without a shape, and a partial row.
    let row = |shape: Option<Vec<u32>>, idx: Vec<u32>| TensorRow {
        step: 0,
        rank: 0,
        layer_id: 0,
        layer: "emb".into(),
        numel: 12,
        shape,
        values: vec![1.0; idx.len()],
        indices: Some(idx),
    };
    let e = check_embedding_rows(&[row(None, vec![0, 1, 2])]).unwrap_err();
    assert!(format!("{e}").contains("shape"), "{e}");
    let e = check_embedding_rows(&[row(Some(vec![4, 3]), vec![3, 4])]).unwrap_err();
    assert!(format!("{e}").contains("whole rows"), "{e}");
    let e = check_embedding_rows(&[row(Some(vec![12]), vec![3])]).unwrap_err();
    assert!(format!("{e}").contains("2-D"), "{e}");
    check_embedding_rows(&[row(Some(vec![4, 3]), vec![3, 4, 5, 9, 10, 11])]).unwrap();
}
