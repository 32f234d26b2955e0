//! The device seam's CUDA implementation (`gradkit_cuda::resident::Resident`), driven by the
//! same host code as on a GPU over the emulated kernels, against the counting host device
//! (the CPU functions): each primitive on adversarial inputs, then whole sparse reducers
//! and the 1-bit reducers with their tensors resident on an emulated GPU per rank, against
//! the host path. A planted bug in the kernels fails the primitives' check.

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat};
use gradkit_comm::run_local;
use gradkit_core::keep::Keep;
use gradkit_core::trace::{Layout, Sparse};
use gradkit_cuda::check;
use gradkit_cuda::resident::Resident;
use gradkit_cuda_emu::{gpu, Emu, Variant};
use gradkit_sparsify::resident::DeviceKernels;

fn emulated(v: Variant) -> &'static Resident<Emu> {
    Box::leak(Box::new(Resident::new(Box::leak(Box::new(gpu(v))))))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check_all(g: &dyn DeviceKernels) -> Result<usize, String> {
    check::check_resident(g, &check::small_lengths())
}

#[test]
fn every_resident_primitive_equals_the_counting_device_under_emulation() {
    let g = emulated(Variant::Plain);
    let cases = check_all(g).unwrap_or_else(|e| panic!("{e}"));
    assert!(cases >= 6, "{cases}");
}

#[test]
fn a_planted_bug_fails_the_resident_check() {
    for (v, what) in [
        (Variant::CompactOffByOne, "topk"),
        (Variant::ThresholdGeForGt, "select_above"),
        (Variant::SignGtForGe, "onebit_compress_deferred"),
    ] {
        let e = check_all(emulated(v)).expect_err(&format!("{v:?} passed"));
        assert!(e.contains(what), "{v:?}: {e}");
    }
}

/// Sparse reducers on 2 ranks, each with its own emulated GPU, equal the host path.
#[test]
fn sparse_reducers_on_an_emulated_gpu_equal_the_host() {
    const N: usize = 2500;
    let lay = Layout::new(vec![
        (0, "a".into(), 700, None),
        (1, "b".into(), (N - 700) as u64, None),
    ]);
    let g: Vec<Vec<Vec<f32>>> = (0..4u64)
        .map(|t| {
            (0..2u64)
                .map(|r| check::inputs(N, 10 * t + r)[1].1.clone())
                .collect()
        })
        .collect();
    for algo in ["topka", "gtopk", "oktopk"] {
        let run = |device: bool| -> Vec<Vec<Sparse>> {
            run_local(2, |comm| {
                let params = Params {
                    keep: Keep::Density(0.02),
                    reeval: 2,
                    resident: device
                        .then(|| emulated(Variant::Plain) as &'static dyn DeviceKernels),
                    ..Params::default()
                };
                let mut red = make_reducer(algo, &params)?;
                let mut out = Vec::new();
                for (t, gt) in g.iter().enumerate() {
                    let o =
                        red.reduce(comm, t as u32, &lay, Flat::Dense(gt[comm.rank()].clone()))?;
                    let Flat::Sparse(s) = o.result else {
                        panic!("sparse result")
                    };
                    out.push(s);
                }
                Ok(out)
            })
            .unwrap()
        };
        let (host, dev) = (run(false), run(true));
        for (r, (h, d)) in host.iter().zip(&dev).enumerate() {
            for (t, (h, d)) in h.iter().zip(d).enumerate() {
                assert_eq!(h.indices, d.indices, "{algo} rank {r} step {t}");
                assert_eq!(bits(&h.values), bits(&d.values), "{algo} rank {r} step {t}");
            }
        }
    }
}

/// The 1-bit reducers on 3 ranks, each rank's errors resident on its own emulated GPU, over
/// several steps (a length not a multiple of 8·P): results and both errors equal the host
/// path's. The scales are f64 sums in the kernels' tree order, so equality is up to an ulp
/// of a scale in general (`check::check_onebit`); on these inputs they agree bit for bit.
#[test]
fn onebit_reducers_on_an_emulated_gpu_equal_the_host() {
    const N: usize = 2501;
    const P: usize = 3;
    let lay = Layout::new(vec![(0, "m".into(), N as u64, None)]);
    let g: Vec<Vec<Vec<f32>>> = (0..4u64)
        .map(|t| {
            (0..P as u64)
                .map(|r| check::inputs(N, 10 * t + r)[1].1.clone())
                .collect()
        })
        .collect();
    type Run = Vec<Vec<(Vec<f32>, Vec<(String, Vec<f32>)>)>>;
    for algo in ["onebit", "onebit-naive"] {
        let run = |device: bool| -> Run {
            run_local(P, |comm| {
                let params = Params {
                    resident: device
                        .then(|| emulated(Variant::Plain) as &'static dyn DeviceKernels),
                    ..Params::default()
                };
                let mut red = make_reducer(algo, &params)?;
                let mut out = Vec::new();
                for (t, gt) in g.iter().enumerate() {
                    let o =
                        red.reduce(comm, t as u32, &lay, Flat::Dense(gt[comm.rank()].clone()))?;
                    let Flat::Dense(d) = o.result else {
                        panic!("dense result")
                    };
                    out.push((d, red.state()));
                }
                Ok(out)
            })
            .unwrap()
        };
        let (host, dev) = (run(false), run(true));
        for (r, (h, d)) in host.iter().zip(&dev).enumerate() {
            for (t, ((hr, hs), (dr, ds))) in h.iter().zip(d).enumerate() {
                let at = format!("{algo} rank {r} step {t}");
                assert!(bits(hr) == bits(dr), "{at}: result");
                assert_eq!(hs.len(), ds.len(), "{at}: state");
                for ((hn, hv), (_, dv)) in hs.iter().zip(ds) {
                    assert!(bits(hv) == bits(dv), "{at}: {hn}");
                }
            }
        }
    }
}
