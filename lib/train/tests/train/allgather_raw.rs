//! `--exchange allgather-raw` (Horovod / PyTorch DDP sparse allreduce: one embedding-gradient
//! row per token, uncoalesced): its sum equals a dense sum written here, its per-rank bytes
//! equal the wire format derived here (a ring allgather of one message per rank of
//! tokens·(1 + d) u32 words: each rank sends P−1 of the P messages), and a training run with
//! SGD equals `--exchange dense`.

use gradkit_collectives::alltoall::{sparse_allgather, sparse_allgather_raw, Rows};
use gradkit_comm::World;
use gradkit_core::MetricRow;
use gradkit_train::data::DataSpec;
use gradkit_train::embrace::per_token_rows;
use gradkit_train::model::ModelSpec;
use gradkit_train::optim::OptConfig;
use gradkit_train::{train, TrainConfig};

const V: usize = 20;
const D: usize = 3;
const T: usize = 12;

/// Rank r's tokens: many duplicates (ids from a small range).
fn tokens(r: usize) -> Vec<u32> {
    (0..T).map(|k| ((k * k + 3 * r) % 7) as u32).collect()
}

fn token_grad(r: usize, k: usize, c: usize) -> f32 {
    ((r * 31 + k * 7 + c * 3) % 13) as f32 * 0.25 - 1.5
}

fn distinct(ids: &[u32]) -> usize {
    let mut u = ids.to_vec();
    u.sort();
    u.dedup();
    u.len()
}

#[test]
fn raw_allgather_sums_like_dense_and_sends_one_row_per_token() {
    for p in [1usize, 2, 3, 4] {
        // dense reference: Σ over ranks and tokens, scattered into a V×d table
        let mut dense = vec![0f64; V * D];
        for r in 0..p {
            for (k, &t) in tokens(r).iter().enumerate() {
                for c in 0..D {
                    dense[t as usize * D + c] += token_grad(r, k, c) as f64;
                }
            }
        }
        let out = World::local(p)
            .run(|comm| {
                let r = comm.rank();
                let ids = tokens(r);
                let vals: Vec<f32> = (0..ids.len())
                    .flat_map(|k| (0..D).map(move |c| token_grad(r, k, c)))
                    .collect();
                let rows = Rows::new(ids, D, vals)?;
                let s0 = comm.traffic().total().bytes_sent;
                let raw = sparse_allgather_raw(comm, &rows)?;
                let s1 = comm.traffic().total().bytes_sent;
                let co = sparse_allgather(comm, &rows)?;
                let s2 = comm.traffic().total().bytes_sent;
                Ok((raw, co, s1 - s0, s2 - s1))
            })
            .unwrap();
        for (r, (raw, co, b_raw, b_co)) in out.into_iter().enumerate() {
            let touched: Vec<usize> = (0..V)
                .filter(|&i| (0..p).any(|q| tokens(q).contains(&(i as u32))))
                .collect();
            assert_eq!(raw.ids.len(), touched.len());
            for (i, &id) in raw.ids.iter().enumerate() {
                assert_eq!(id as usize, touched[i]);
                for c in 0..D {
                    let want = dense[id as usize * D + c];
                    assert!((raw.row(i)[c] as f64 - want).abs() < 1e-5, "P={p}");
                }
            }
            assert_eq!(raw.ids, co.ids);
            for (a, b) in raw.values.iter().zip(&co.values) {
                assert!((a - b).abs() < 1e-5, "same sum as the coalesced baseline");
            }
            // Ring allgather: rank r forwards every message but rank r+1's.
            let others = (0..p).filter(|&q| q != (r + 1) % p);
            let want_raw: usize = others.clone().map(|_| 4 * T * (1 + D)).sum();
            let want_co: usize = others.map(|q| 4 * distinct(&tokens(q)) * (1 + D)).sum();
            assert_eq!(b_raw as usize, want_raw, "P={p} raw: T·(1+d)·4·(P−1)");
            assert_eq!(b_co as usize, want_co, "P={p} coalesced");
            if p > 1 {
                assert!(b_co < b_raw, "the tokens have duplicates");
            }
        }
    }
}

#[test]
fn per_token_rows_keep_the_token_order_and_the_row_sums() {
    let toks = [5u32, 2, 5, 9, 2, 5];
    let u = [2u32, 5, 9];
    let gu = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let r = per_token_rows(&toks, &u, &gu, 2).unwrap();
    assert_eq!(r.ids, toks.to_vec());
    assert_eq!(r.values.len(), toks.len() * 2);
    let c = r.coalesce();
    assert_eq!(c.ids, u.to_vec());
    assert_eq!(c.values, gu.to_vec());
    assert!(per_token_rows(&[7], &u, &gu, 2).is_err());
}

fn tiny(exchange: &str) -> TrainConfig {
    TrainConfig {
        model: ModelSpec {
            name: "transformer-lm".into(),
            d_model: 8,
            layers: 1,
            heads: 2,
            seq_len: 8,
            hidden: 8,
        },
        data: DataSpec {
            name: "synthetic-lm".into(),
            vocab: 300,
            corpus_seed: 3,
            tokens: 20_000,
            ..DataSpec::default()
        },
        exchange: exchange.parse().unwrap(),
        opt: OptConfig {
            method: "sgd".parse().unwrap(),
            ..OptConfig::default()
        },
        lr: 0.5,
        steps: 3,
        batch: 2,
        seed: 7,
        check_every: 1,
        ..TrainConfig::default()
    }
}

fn metric(m: &[MetricRow], name: &str, step: u32, rank: u32) -> f64 {
    m.iter()
        .find(|r| r.metric == name && r.step == step && r.rank == rank)
        .unwrap_or_else(|| panic!("no {name} at step {step} rank {rank}"))
        .value
}

#[test]
fn training_with_allgather_raw_equals_dense_sgd_and_sends_tokens_rows() {
    for p in [2usize, 3] {
        let dense = train(&World::local(p), &tiny("dense")).unwrap().unwrap();
        let raw = train(&World::local(p), &tiny("allgather-raw"))
            .unwrap()
            .unwrap();
        let worst = dense
            .params
            .iter()
            .zip(&raw.params)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "P={p}: {worst}");
        // tokens per rank = batch·seq_len = 16, every rank the same; d = 8
        let want = (4 * 16 * (1 + 8) * (p - 1)) as f64;
        for r in 0..p as u32 {
            for s in 0..3 {
                assert_eq!(metric(&raw.metrics, "bytes_emb_grad", s, r), want, "P={p}");
                assert_eq!(metric(&raw.metrics, "bytes_emb_forward", s, r), 0.0);
            }
        }
    }
}
