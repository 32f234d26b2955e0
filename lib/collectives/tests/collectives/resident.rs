//! The device seam (`Params::resident`, docs/GPU.md §7): each sparse reducer that selects
//! from dense input, run with its tensors resident on a counting device (host memory, every
//! host ↔ device copy explicit and counted), gives the plain host path's results and
//! residuals bit for bit, and per step the counters show the gradient uploaded once and
//! nothing model-sized coming down: only the selection that goes on the wire, and the index
//! lists the residual rule needs going up. The 1-bit reducers likewise: their errors stay
//! on the device, and besides the gradient up and the result down only packed signs cross.

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat, StepOutput};
use gradkit_comm::run_local;
use gradkit_core::keep::Keep;
use gradkit_core::trace::Layout;
use gradkit_sparsify::oktopk::{Adjust, Bands};
use gradkit_sparsify::resident::{Counting, DeviceKernels, Transfers};

use crate::common;
use common::{res, Rng};

const P: usize = 3;
const N: usize = 6000;
const STEPS: usize = 7;

/// Gradients with many ties and exact zeros: k/16 for k in −8..=8, a few larger.
fn grads(seed: u64) -> Vec<Vec<Vec<f32>>> {
    grads_of(seed, P, N)
}

/// [`grads`] for `p` ranks and `n` values.
fn grads_of(seed: u64, p: usize, n: usize) -> Vec<Vec<Vec<f32>>> {
    let mut rng = Rng::new(seed);
    (0..STEPS)
        .map(|_| {
            (0..p)
                .map(|_| {
                    (0..n)
                        .map(|_| match rng.below(100) {
                            0..=29 => 0.0,
                            30 => rng.val() * 4.0,
                            _ => (rng.below(17) as i64 - 8) as f32 / 16.0,
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

type Step = (StepOutput, Vec<(String, Vec<f32>)>, Option<Transfers>);

/// Every rank's outputs, states and per-step transfers (with a device).
fn run(algo: &str, params: &Params, device: bool, g: &[Vec<Vec<f32>>]) -> Vec<Vec<Step>> {
    let lay = Layout::new(vec![
        (0, "a".into(), (N / 4) as u64, None),
        (1, "b".into(), (N - N / 4) as u64, None),
    ]);
    steps(algo, params, P, &lay, g, device, None)
}

/// Every rank's steps of `algo` on `p` ranks over `g`, on the counting device or not; at step
/// `switch` the state is taken out and loaded into a fresh reducer (a checkpoint).
fn steps(
    algo: &str,
    params: &Params,
    p: usize,
    lay: &Layout,
    g: &[Vec<Vec<f32>>],
    device: bool,
    switch: Option<usize>,
) -> Vec<Vec<Step>> {
    run_local(p, |comm| {
        let dev: Option<&'static dyn DeviceKernels> =
            device.then(|| &*Box::leak(Box::new(Counting::new())) as &'static dyn DeviceKernels);
        let params = Params {
            resident: dev,
            ..params.clone()
        };
        let mut red = make_reducer(algo, &params)?;
        let mut out = Vec::new();
        for (t, gt) in g.iter().enumerate() {
            if Some(t) == switch {
                let saved = red.take_state();
                red = make_reducer(algo, &params)?;
                red.load_state_owned(saved)?;
            }
            let before = dev.map(|d| d.transfers());
            let o = red.reduce(comm, t as u32, lay, Flat::Dense(gt[comm.rank()].clone()))?;
            let moved = dev.map(|d| d.transfers().since(&before.unwrap()));
            out.push((o, red.state(), moved));
        }
        Ok(out)
    })
    .unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `algo` both ways and checks equality and the counters; `extra_up` and `down` give
/// the expected upload count beyond the gradient and download count per step, from the
/// step's output.
fn check(algo: &str, params: Params, extra_up: u64, down: impl Fn(usize, &StepOutput) -> u64) {
    let g = grads(7);
    let host = run(algo, &params, false, &g);
    let dev = run(algo, &params, true, &g);
    for r in 0..P {
        for t in 0..STEPS {
            let (h, hs, _) = &host[r][t];
            let (d, ds, moved) = &dev[r][t];
            let at = format!("{algo} rank {r} step {t}");
            assert_eq!(res(d).indices, res(h).indices, "{at}: result indices");
            assert_eq!(bits(&res(d).values), bits(&res(h).values), "{at}: values");
            assert_eq!(d.contributed, h.contributed, "{at}: contributed");
            assert_eq!(hs.len(), ds.len(), "{at}: state");
            for ((hn, hv), (dn, dv)) in hs.iter().zip(ds) {
                assert_eq!(hn, dn);
                assert_eq!(bits(hv), bits(dv), "{at}: residual");
            }
            let m = moved.unwrap();
            let sent = d.contributed.as_ref().map_or(0, |c| c.len()) as u64;
            let got = res(d).len() as u64;
            // The gradient goes up once; every other copy is message-sized.
            assert_eq!(m.uploads, 1 + extra_up, "{at}: uploads {m:?}");
            assert!(m.upload_bytes >= 4 * N as u64, "{at}: {m:?}");
            assert!(
                m.upload_bytes - 4 * N as u64 <= 4 * (sent + 2 * got),
                "{at}: more than index lists went up: {m:?}"
            );
            assert_eq!(m.downloads, down(r, d), "{at}: downloads {m:?}");
            assert!(
                m.download_bytes <= 8 * sent + 4 * got,
                "{at}: more than the selection came down: {m:?}"
            );
            assert!(
                m.download_bytes < 4 * N as u64,
                "{at}: model-sized download {m:?}"
            );
        }
    }
}

fn sparse(reeval: u32, adjust: Adjust) -> Params {
    Params {
        keep: Keep::Density(0.01),
        reeval,
        period: 3,
        adjust,
        residual: true,
        ..Params::default()
    }
}

#[test]
fn topka_topkdsa_gtopk_on_the_device_equal_the_host_and_copy_only_messages() {
    for algo in ["topka", "topkdsa", "gtopk"] {
        // Up: the gradient, the indices that leave the residual; down: indices, values.
        check(algo, sparse(32, Adjust::Ladder), 1, |_, _| 2);
    }
}

#[test]
fn gaussiank_on_the_device_equals_the_host() {
    check("gaussiank", sparse(32, Adjust::Ladder), 1, |_, _| 2);
}

#[test]
fn oktopk_on_the_device_equals_the_host_under_every_reuse_policy() {
    for adjust in [
        Adjust::Ladder,
        Adjust::Paper,
        Adjust::Reference(Bands::preset("vgg").expect("preset")),
    ] {
        // Re-evaluation every 3 calls: exact top-k steps and reuse steps both run.
        check("oktopk", sparse(3, adjust), 1, |_, _| 2);
    }
}

#[test]
fn deft_on_the_device_equals_the_host() {
    // Up: the gradient, the gathered union (to read the values at it), the union again as
    // the indices that leave. Down: each own range's indices, then the values at the union.
    check("deft", sparse(32, Adjust::Ladder), 2, |_, o| {
        let pieces = o.metrics.iter().find(|(k, _)| k == "pieces").unwrap().1;
        pieces as u64 + 1
    });
}

#[test]
fn cltk_and_topk_union_on_the_device_equal_the_host() {
    // Up: the gradient, the indices whose values are summed, the same indices leaving the
    // residual. Down: the leader's top-k indices (CLT-k: the leader only), the values.
    check("cltk", sparse(32, Adjust::Ladder), 2, |r, o| {
        let leader = o.metrics.iter().find(|(k, _)| k == "leader").unwrap().1;
        1 + u64::from(r == leader as usize)
    });
    check("topk-union", sparse(32, Adjust::Ladder), 2, |_, _| 2);
}

/// The padded length of the 1-bit buffer, from the definitions (onebit-lamb.md §2,
/// DeepSpeed): the next multiple of `P·lcm(P, 8)` for the server variant, of 8 for the naive.
fn onebit_padded(server: bool, p: usize, n: usize) -> usize {
    let lcm = (1..=8 * p).find(|m| m % p == 0 && m % 8 == 0).unwrap();
    let unit = if server { p * lcm } else { 8 };
    n.div_ceil(unit) * unit
}

/// Every rank's 1-bit steps on `p` ranks and `n` values, on the counting device or not;
/// after `switch` steps the state is taken out and loaded into a fresh reducer (a checkpoint).
fn run_onebit(algo: &str, p: usize, n: usize, device: bool, switch: usize) -> Vec<Vec<Step>> {
    let g = grads_of(11 + p as u64, p, n);
    let lay = Layout::new(vec![
        (0, "a".into(), (n / 3) as u64, None),
        (1, "b".into(), (n - n / 3) as u64, None),
    ]);
    steps(algo, &Params::default(), p, &lay, &g, device, Some(switch))
}

/// `a` and `b` equal bit for bit, else a panic naming the first difference.
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: [{i}] {:?} vs {:?}", a[i], b[i]);
    }
}

fn dense(o: &StepOutput) -> &[f32] {
    match &o.result {
        Flat::Dense(d) => d,
        Flat::Sparse(_) => panic!("dense result expected"),
    }
}

/// The 1-bit reducer `algo` on `p` ranks and `n` values: with its errors on the counting
/// device, the results, both errors and the metrics equal the host path's bit for bit, and
/// each step copies the gradient up and the result down once and otherwise packed signs only.
fn check_onebit(algo: &str, p: usize, n: usize) {
    let server = algo == "onebit";
    let npad = onebit_padded(server, p, n);
    let (nbits, cb) = (npad / 8, npad / (8 * p));
    // Up: the gradient, (server) the P received chunks, the P gathered chunks; naive: every
    // rank's signs. Down: this rank's signs, (server) its server chunk, the result.
    let (up, down) = if server {
        ((2, 4 * n + 2 * p * cb), (3, nbits + cb + 4 * n))
    } else {
        ((1, 4 * n + p * nbits), (2, nbits + 4 * n))
    };
    const SWITCH: usize = 3;
    let host = run_onebit(algo, p, n, false, SWITCH);
    let dev = run_onebit(algo, p, n, true, SWITCH);
    for r in 0..p {
        for t in 0..STEPS {
            let (h, hs, _) = &host[r][t];
            let (d, ds, moved) = &dev[r][t];
            let at = format!("{algo} P={p} n={n} rank {r} step {t}");
            same(dense(d), dense(h), &format!("{at}: result"));
            assert_eq!(hs.len(), 2, "{at}: state");
            assert_eq!(hs.len(), ds.len(), "{at}: state");
            for ((hn, hv), (dn, dv)) in hs.iter().zip(ds) {
                assert_eq!(hn, dn);
                same(dv, hv, &format!("{at}: {hn}"));
            }
            let m = |o: &StepOutput| {
                o.metrics
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(m(d), m(h), "{at}: metrics");
            let m = moved.unwrap();
            // The step after the checkpoint also uploads the loaded errors.
            let loaded = if t == SWITCH {
                (2, 4 * (npad + if server { npad / p } else { 0 }))
            } else {
                (0, 0)
            };
            let want = Transfers {
                uploads: 1 + up.0 + loaded.0,
                upload_bytes: (up.1 + loaded.1) as u64,
                downloads: down.0,
                download_bytes: down.1 as u64,
            };
            assert_eq!(m, want, "{at}: transfers");
        }
    }
}

#[test]
fn onebit_on_the_device_equals_the_host_and_copies_packed_signs_only() {
    // Lengths not a multiple of 8·P (nor of 8), so the padding is read and never written.
    for (p, n) in [(3, 4001), (4, 3003), (3, 17)] {
        check_onebit("onebit", p, n);
    }
}

#[test]
fn onebit_naive_on_the_device_equals_the_host_and_copies_packed_signs_only() {
    for (p, n) in [(3, 4001), (4, 3003)] {
        check_onebit("onebit-naive", p, n);
    }
}
