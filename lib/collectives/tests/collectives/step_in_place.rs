//! `step::reduce_step_in_place` (the Python module's path: a DDP bucket reduced where it lies)
//! against `step::reduce_step` (gradallreduce's, on an owned vector): the same result bits and
//! the same metric rows (times aside) for every algorithm, the dense ones without a copy and
//! the others through one; and the dense result equals an f64 sum written here, its `nnz`
//! row a count made here.

use gradkit_collectives::{step, Flat, Op, Params};
use gradkit_comm::{run_local, Comm};
use gradkit_core::keep::Keep;
use gradkit_core::trace::{Layout, MetricSink};

fn input(r: usize, s: u32, n: usize) -> Vec<f32> {
    let mut g = gradkit_testkit::rng::Rng::new((s as u64) * 977 + r as u64 + 3);
    // A few exact zeros, so that `nnz` is not simply n.
    (0..n)
        .map(|i| {
            if i % 11 == 0 {
                0.0
            } else {
                g.unit_f32() * 2.0 - 1.0
            }
        })
        .collect()
}

/// (metric, step, rank, value) of the rows that do not measure time.
fn rows(sink: &MetricSink) -> Vec<(String, u32, u32, u64)> {
    sink.rows
        .iter()
        .filter(|r| !r.metric.starts_with("time"))
        .map(|r| (r.metric.clone(), r.step, r.rank, r.value.to_bits()))
        .collect()
}

#[test]
fn in_place_equals_the_owned_path_for_every_algorithm() {
    let (p, n, steps) = (3usize, 4_099usize, 3u32);
    let layout = Layout::new(vec![
        (0, "a".into(), 1_000, None),
        (1, "b".into(), (n - 1_000) as u64, None),
    ]);
    for &algo in gradkit_collectives::registry::ALL {
        if algo.name() == "embrace" {
            continue; // its input is embedding rows, not one dense vector
        }
        for op in [Op::Sum, Op::Mean] {
            let params = Params {
                keep: Keep::Density(0.05),
                op,
                ..Params::default()
            };
            let got = run_local(p, |c: &dyn Comm| {
                let mut owned = gradkit_collectives::reducer_for(algo, &params)?;
                let mut placed = gradkit_collectives::reducer_for(algo, &params)?;
                let (mut so, mut sp) = (
                    MetricSink::new("r", "t", algo.name(), p as u32),
                    MetricSink::new("r", "t", algo.name(), p as u32),
                );
                let k = params.k_for(n as u64);
                let mut out = Vec::new();
                for s in 0..steps {
                    let x = input(c.rank(), s, n);
                    let a = step::reduce_step(
                        c,
                        owned.as_mut(),
                        algo,
                        &layout,
                        s,
                        Flat::Dense(x.clone()),
                        k,
                        &mut so,
                    )?
                    .into_dense(n);
                    let mut b = x;
                    step::reduce_step_in_place(
                        c,
                        placed.as_mut(),
                        algo,
                        &layout,
                        s,
                        &mut b,
                        k,
                        &mut sp,
                    )?;
                    out.push((a, b));
                }
                Ok((out, rows(&so), rows(&sp)))
            })
            .unwrap_or_else(|e| panic!("{} {op:?}: {e:#}", algo.name()));
            for (r, (steps_out, ro, rp)) in got.iter().enumerate() {
                let what = format!("{} {op:?} rank {r}", algo.name());
                assert_eq!(ro, rp, "{what}: metric rows differ");
                for (s, (a, b)) in steps_out.iter().enumerate() {
                    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same && a.len() == b.len(),
                        "{what} step {s}: results differ"
                    );
                    let nnz = b.iter().filter(|v| **v != 0.0).count() as f64;
                    let row = rp
                        .iter()
                        .find(|(m, st, _, _)| m == "nnz" && *st == s as u32)
                        .map(|x| f64::from_bits(x.3));
                    assert_eq!(row, Some(nnz), "{what} step {s}: nnz row");
                    if algo.family() == gradkit_collectives::Family::Dense
                        && algo.name() != "ring-fp16"
                    {
                        let all: Vec<Vec<f32>> = (0..p).map(|q| input(q, s as u32, n)).collect();
                        for i in 0..n {
                            let mut want: f64 = all.iter().map(|x| x[i] as f64).sum();
                            if op == Op::Mean {
                                want /= p as f64;
                            }
                            assert!(
                                (b[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{what} step {s} i={i}: {} vs {want}",
                                b[i]
                            );
                        }
                    }
                }
            }
        }
    }
}
