//! 1-bit compressed allreduce against a straightforward dense simulation of DeepSpeed's
//! steps 1–4 (as `tests/onebit/test_nccl_backend.py`'s `torch_sim` does), plus properties.

// The references index arrays the way the papers write the maths.
#![allow(clippy::needless_range_loop)]

use gradkit_collectives::onebit::{compress_into, pack_signs, unpack_scaled, OneBitState, Variant};
use gradkit_collectives::{make_reducer, Flat, Params};
use gradkit_comm::run_local;
use gradkit_core::trace::Layout;

/// gradkit-testkit's seeded generator (SplitMix64) with this file's helpers.
struct Rng(gradkit_testkit::rng::Rng);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(gradkit_testkit::rng::Rng::new(seed))
    }
    fn unit(&mut self) -> f32 {
        self.0.unit_f32()
    }
    /// Roughly normal: sum of 4 uniforms, centred.
    fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.unit()).sum::<f32>() - 2.0
    }
}

fn data(seed: u64, p: usize, n: usize, step: usize) -> Vec<Vec<f32>> {
    (0..p)
        .map(|r| {
            let mut g = Rng::new(seed ^ ((r as u64) << 32) ^ ((step as u64) << 48));
            (0..n).map(|_| g.normal() + 0.1 * r as f32).collect()
        })
        .collect()
}

fn layout_of(n: usize) -> Layout {
    // Three layers so that fusion in layer_id order matters (ids given out of order).
    let a = n / 3;
    let b = n / 2 - a.min(n / 2);
    let c = n - a - b;
    Layout::new(vec![
        (7, "c".into(), c as u64, None),
        (0, "a".into(), a as u64, None),
        (3, "b".into(), b as u64, None),
    ])
}

fn rms64(x: &[f32]) -> f32 {
    let s: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    (s / x.len() as f64).sqrt() as f32
}

fn sgn(x: f32) -> f32 {
    if x >= 0.0 {
        1.0
    } else {
        -1.0
    }
}

/// The dense simulation: every rank's worker error, every chunk's server error.
struct Sim {
    p: usize,
    n: usize,
    npad: usize,
    werr: Vec<Vec<f32>>,
    serr: Vec<Vec<f32>>,
}

impl Sim {
    fn new(p: usize, n: usize) -> Sim {
        let lcm = (1..).map(|m| m * p).find(|m| m % 8 == 0).unwrap();
        let unit = p * lcm;
        let npad = n.div_ceil(unit) * unit;
        Sim {
            p,
            n,
            npad,
            werr: vec![vec![0.0; npad]; p],
            serr: vec![vec![0.0; npad / p]; p],
        }
    }
    /// Returns (output, smallest pre-sign magnitude per element).
    fn step(&mut self, xs: &[Vec<f32>]) -> (Vec<f32>, Vec<f32>) {
        let (p, npad) = (self.p, self.npad);
        if p == 1 {
            return (xs[0].clone(), vec![f32::INFINITY; self.n]);
        }
        let mut minmag = vec![f32::INFINITY; npad];
        let mut scales = vec![0f32; p];
        let mut signs = vec![vec![0f32; npad]; p];
        for i in 0..p {
            let mut buf = vec![0f32; npad];
            for k in 0..npad {
                let x = if k < self.n { xs[i][k] } else { 0.0 };
                buf[k] = x + self.werr[i][k];
                minmag[k] = minmag[k].min(buf[k].abs());
            }
            let s = rms64(&buf);
            for k in 0..npad {
                signs[i][k] = sgn(buf[k]);
                self.werr[i][k] = buf[k] - s * signs[i][k];
            }
            scales[i] = s;
        }
        let c = npad / p;
        let mut out = vec![0f32; npad];
        for j in 0..p {
            let mut z = vec![0f32; c];
            for (i, sg) in signs.iter().enumerate() {
                for m in 0..c {
                    z[m] += scales[i] / p as f32 * sg[j * c + m];
                }
            }
            for m in 0..c {
                z[m] += self.serr[j][m];
                minmag[j * c + m] = minmag[j * c + m].min(z[m].abs());
            }
            let ss = rms64(&z);
            for m in 0..c {
                out[j * c + m] = ss * sgn(z[m]);
                self.serr[j][m] = z[m] - ss * sgn(z[m]);
            }
        }
        out.truncate(self.n);
        minmag.truncate(self.n);
        (out, minmag)
    }
}

#[test]
fn onebit_matches_dense_simulation_over_five_steps() {
    for &p in &[1usize, 2, 3, 4, 5, 8] {
        for &n in &[1usize, 13, 1003, 4099] {
            let layout = layout_of(n);
            let steps = 5;
            let inputs: Vec<Vec<Vec<f32>>> = (0..steps).map(|s| data(11, p, n, s)).collect();
            let mut sim = Sim::new(p, n);
            let want: Vec<(Vec<f32>, Vec<f32>)> = inputs.iter().map(|x| sim.step(x)).collect();
            let got = run_local(p, |comm| {
                let mut red = make_reducer("onebit", &Params::default())?;
                let mut outs = Vec::new();
                for (s, x) in inputs.iter().enumerate() {
                    let o =
                        red.reduce(comm, s as u32, &layout, Flat::Dense(x[comm.rank()].clone()))?;
                    outs.push(o.result);
                }
                Ok(outs)
            })
            .unwrap();
            for (s, (w, mag)) in want.iter().enumerate() {
                for (r, outs) in got.iter().enumerate() {
                    let Flat::Dense(o) = &outs[s] else {
                        panic!("dense output")
                    };
                    assert_eq!(o.len(), n);
                    // Bit-identical on all ranks.
                    let Flat::Dense(o0) = &got[0][s] else {
                        unreachable!()
                    };
                    assert_eq!(o, o0, "P={p} n={n} step {s}: rank {r} differs from rank 0");
                    for k in 0..n {
                        if mag[k] < 1e-6 {
                            continue;
                        }
                        let tol = 1e-6 * w[k].abs().max(1e-30);
                        assert!(
                            (o[k] - w[k]).abs() <= tol,
                            "P={p} n={n} step {s} rank {r} elem {k}: {} vs {}",
                            o[k],
                            w[k]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn identical_inputs_give_compressed_input_and_zero_server_error() {
    for &p in &[2usize, 3, 4, 8] {
        let n = 1001;
        let x = data(5, 1, n, 0).remove(0);
        let res = run_local(p, |comm| {
            let mut st = OneBitState::new(Variant::Server, p, n);
            let mut d = x.clone();
            st.allreduce(comm, &mut d)?;
            Ok((d, st.server_error()))
        })
        .unwrap();
        // Reference C(x): one scale over the padded buffer.
        let npad = Sim::new(p, n).npad;
        let mut padded = x.clone();
        padded.resize(npad, 0.0);
        let s = rms64(&padded);
        for (d, serr) in &res {
            assert!(
                serr.iter().all(|&e| e == 0.0),
                "P={p}: server error not zero"
            );
            for k in 0..n {
                let want = s * sgn(x[k]);
                assert!((d[k] - want).abs() <= 1e-6 * want.abs(), "P={p} elem {k}");
            }
        }
    }
}

#[test]
fn compressor_preserves_norm_and_error_feedback_identity() {
    let mut g = Rng::new(3);
    for &n in &[8usize, 64, 4096] {
        let x: Vec<f32> = (0..n).map(|_| g.normal()).collect();
        let e: Vec<f32> = (0..n).map(|_| 0.1 * g.normal()).collect();
        let buf: Vec<f32> = x.iter().zip(&e).map(|(a, b)| a + b).collect();
        let mut work = buf.clone();
        let mut bits = vec![0u8; n / 8];
        let s = compress_into(&mut work, &mut bits);
        let mut c = vec![0f32; n];
        unpack_scaled(&bits, s, &mut c);
        // ‖C(x)‖₂ = ‖x‖₂
        let norm = |v: &[f32]| v.iter().map(|&a| a as f64 * a as f64).sum::<f64>().sqrt();
        assert!((norm(&c) - norm(&buf)).abs() <= 1e-6 * norm(&buf));
        // C(x+e) + e' = x + e
        for k in 0..n {
            assert_eq!(c[k], s * sgn(buf[k]));
            assert!((c[k] + work[k] - buf[k]).abs() <= 1e-6 * (buf[k].abs() + s));
        }
    }
}

#[test]
fn worker_error_feedback_identity_inside_the_allreduce() {
    let (p, n) = (4usize, 777usize);
    let steps: Vec<Vec<Vec<f32>>> = (0..3).map(|s| data(9, p, n, s)).collect();
    run_local(p, |comm| {
        let r = comm.rank();
        let mut st = OneBitState::new(Variant::Server, p, n);
        for x in &steps {
            let old = st.worker_error();
            let mut d = x[r].clone();
            st.allreduce(comm, &mut d)?;
            // x + e_old − e_new must be s_w·sign(x + e_old) with s_w = RMS(x + e_old).
            let mut buf = old.clone();
            for k in 0..n {
                buf[k] += x[r][k];
            }
            let s = rms64(&buf);
            let new_err = st.worker_error();
            for k in 0..buf.len() {
                let c = buf[k] - new_err[k];
                let want = s * sgn(buf[k]);
                assert!((c - want).abs() <= 1e-6 * (buf[k].abs() + s), "elem {k}");
            }
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn bytes_per_rank_match_the_formula_exactly() {
    for &p in &[2usize, 3, 4, 5, 8] {
        for &n in &[100usize, 12345] {
            let npad = Sim::new(p, n).npad;
            let layout = layout_of(n);
            let x = data(1, p, n, 0);
            let counts = run_local(p, |comm| {
                let mut red = make_reducer("onebit", &Params::default())?;
                red.reduce(comm, 0, &layout, Flat::Dense(x[comm.rank()].clone()))?;
                Ok(comm.traffic().total())
            })
            .unwrap();
            let want = 2 * (p - 1) * npad / (8 * p) + 2 * (p - 1) * 4;
            for (r, c) in counts.iter().enumerate() {
                assert_eq!(c.bytes_sent as usize, want, "P={p} n={n} rank {r} sent");
                assert_eq!(c.bytes_recv as usize, want, "P={p} n={n} rank {r} recv");
                assert_eq!(c.msgs_sent as usize, 2 * (p - 1));
            }
        }
    }
}

#[test]
fn naive_matches_average_of_compressed_inputs() {
    for &p in &[1usize, 2, 3, 5] {
        let n: usize = 1003;
        let npad = n.div_ceil(8) * 8;
        let x = data(4, p, n, 0);
        let want: Vec<f32> = if p == 1 {
            x[0].clone()
        } else {
            let mut acc = vec![0f32; n];
            for xi in &x {
                let mut b = xi.clone();
                b.resize(npad, 0.0);
                let s = rms64(&b);
                for k in 0..n {
                    acc[k] += s / p as f32 * sgn(xi[k]);
                }
            }
            acc
        };
        let layout = layout_of(n);
        let got = run_local(p, |comm| {
            let mut red = make_reducer("onebit-naive", &Params::default())?;
            let o = red.reduce(comm, 0, &layout, Flat::Dense(x[comm.rank()].clone()))?;
            Ok((o.result, comm.traffic().total().bytes_sent))
        })
        .unwrap();
        for (o, sent) in &got {
            let Flat::Dense(o) = o else { panic!() };
            for k in 0..n {
                assert!(
                    (o[k] - want[k]).abs() <= 1e-6 * want[k].abs().max(1e-6),
                    "elem {k}"
                );
            }
            assert_eq!(*sent as usize, (p - 1) * (npad / 8 + 4));
        }
    }
}

#[test]
fn pack_is_msb_first_and_zero_counts_positive() {
    let x = [1.0f32, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, 0.0];
    let mut b = [0u8; 1];
    pack_signs(&x, &mut b);
    assert_eq!(b[0], 0b1000_0001);
    let x = [-0.0f32, 2.0, -1.0, 5.0, -1.0, -1.0, -1.0, -1.0];
    pack_signs(&x, &mut b);
    assert_eq!(b[0], 0b1101_0000);
}

/// `(name, values)` of one rank's 1-bit state, as `Reducer::state` names them.
fn named(w: &[f32], s: &[f32]) -> Vec<(String, Vec<f32>)> {
    vec![
        ("worker_error".to_string(), w.to_vec()),
        ("server_error".to_string(), s.to_vec()),
    ]
}

#[test]
fn state_round_trip_continues_the_run() {
    let (p, n) = (3usize, 501usize);
    let layout = layout_of(n);
    let inputs: Vec<Vec<Vec<f32>>> = (0..5).map(|s| data(21, p, n, s)).collect();
    type Run = (Vec<Flat>, Vec<(String, Vec<f32>)>);
    let run = |range: std::ops::Range<usize>, saved: Option<&Vec<Run>>| {
        run_local(p, |comm| {
            let mut red = make_reducer("onebit", &Params::default())?;
            assert!(red.state().is_empty(), "no state before the first step");
            if let Some(saved) = saved {
                red.load_state(&saved[comm.rank()].1)?;
            }
            let mut outs = Vec::new();
            for s in range.clone() {
                let o = red.reduce(
                    comm,
                    s as u32,
                    &layout,
                    Flat::Dense(inputs[s][comm.rank()].clone()),
                )?;
                outs.push(o.result);
            }
            red.finish(comm)?;
            Ok((outs, red.state()))
        })
    };
    let straight = run(0..5, None).unwrap();
    let first = run(0..3, None).unwrap();
    let second = run(3..5, Some(&first)).unwrap();
    // The saved state is the simulation's worker error of the rank and server error of its
    // chunk after three steps.
    let mut sim = Sim::new(p, n);
    for x in &inputs[..3] {
        sim.step(x);
    }
    for r in 0..p {
        assert_eq!(&straight[r].0[..3], &first[r].0[..]);
        assert_eq!(
            &straight[r].0[3..],
            &second[r].0[..],
            "rank {r}: resumed run differs"
        );
        assert_eq!(straight[r].1, second[r].1, "rank {r}: final state differs");
        let st = &first[r].1;
        let names: Vec<&str> = st.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["worker_error", "server_error"]);
        for (got, want) in [(&st[0].1, &sim.werr[r]), (&st[1].1, &sim.serr[r])] {
            assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "rank {r} elem {k}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn loaded_errors_act_as_the_simulations_starting_errors() {
    let (p, n) = (4usize, 300usize);
    let layout = layout_of(n);
    let mut sim = Sim::new(p, n);
    let start_w = data(31, p, sim.npad, 0);
    let start_s = data(32, p, sim.npad / p, 0);
    sim.werr = start_w
        .iter()
        .map(|v| v.iter().map(|x| 0.3 * x).collect())
        .collect();
    sim.serr = start_s
        .iter()
        .map(|v| v.iter().map(|x| 0.2 * x).collect())
        .collect();
    let (w0, s0) = (sim.werr.clone(), sim.serr.clone());
    let inputs: Vec<Vec<Vec<f32>>> = (0..2).map(|s| data(33, p, n, s)).collect();
    let want: Vec<(Vec<f32>, Vec<f32>)> = inputs.iter().map(|x| sim.step(x)).collect();
    let got = run_local(p, |comm| {
        let r = comm.rank();
        let mut red = make_reducer("onebit", &Params::default())?;
        red.load_state(&named(&w0[r], &s0[r]))?;
        // Before the first step the reducer hands back what it was given.
        assert_eq!(red.state(), named(&w0[r], &s0[r]));
        let mut outs = Vec::new();
        for (s, x) in inputs.iter().enumerate() {
            outs.push(
                red.reduce(comm, s as u32, &layout, Flat::Dense(x[r].clone()))?
                    .result,
            );
        }
        Ok(outs)
    })
    .unwrap();
    for (s, (w, mag)) in want.iter().enumerate() {
        for outs in &got {
            let Flat::Dense(o) = &outs[s] else {
                panic!("dense output")
            };
            for k in 0..n {
                if mag[k] < 1e-6 {
                    continue;
                }
                assert!(
                    (o[k] - w[k]).abs() <= 1e-6 * w[k].abs().max(1e-30),
                    "step {s} elem {k}"
                );
            }
        }
    }
}

#[test]
fn load_state_refuses_what_does_not_fit() {
    let n = 501usize;
    let layout = layout_of(n);
    let err = |r: anyhow::Result<()>| format!("{:#}", r.unwrap_err());
    // Names: unknown, missing, given twice.
    let mut red = make_reducer("onebit", &Params::default()).unwrap();
    let e = err(red.load_state(&[("residual".to_string(), vec![0.0])]));
    assert!(e.contains("unknown state `residual`"), "{e}");
    let e = err(red.load_state(&named(&[0.0], &[0.0])[..1]));
    assert!(
        e.contains("needs both `worker_error` and `server_error`"),
        "{e}"
    );
    let mut twice = named(&[0.0], &[0.0]);
    twice.push(("worker_error".to_string(), vec![0.0]));
    assert!(err(red.load_state(&twice)).contains("given twice"));
    // A state sized for 3 ranks does not load on 2: refused at the first step.
    let s3 = OneBitState::new(Variant::Server, 3, n);
    let e = run_local(2, |comm| {
        let mut red = make_reducer("onebit", &Params::default())?;
        red.load_state(&named(&s3.worker_error(), &s3.server_error()))?;
        red.reduce(comm, 0, &layout, Flat::Dense(vec![0.0; n]))?;
        Ok(())
    })
    .unwrap_err();
    let e = format!("{e:#}");
    // padded_len(2, 501) = 512 (unit 2·8 = 16); server chunks 256. 3 ranks: unit 3·24 = 72,
    // 504 values, server chunks 168.
    assert!(e.contains("onebit: loaded state `worker_error` holds 504 values, but 2 ranks with 501 elements need 512"), "{e}");
    // After a step, lengths are checked at once, and the running state is kept.
    let e = run_local(2, |comm| {
        let mut red = make_reducer("onebit-naive", &Params::default())?;
        red.reduce(comm, 0, &layout, Flat::Dense(vec![1.0; n]))?;
        let before = red.state();
        // Naive: padded to a multiple of 8 (504), no server error.
        assert_eq!(before[0].1.len(), 504);
        assert!(before[1].1.is_empty());
        let r = red.load_state(&named(&[0.0; 8], &[]));
        assert_eq!(red.state(), before);
        r
    })
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("onebit-naive: loaded state `worker_error` holds 8 values"),
        "{e}"
    );
}
