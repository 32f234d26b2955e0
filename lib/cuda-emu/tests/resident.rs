//! The device seam's CUDA implementation (`gradkit_cuda::resident::Resident`), driven by the
//! same host code as on a GPU over the emulated kernels, against the counting host device
//! (the CPU functions): each primitive on adversarial inputs, then whole sparse reducers
//! with their tensors resident on an emulated GPU per rank, against the host path. A planted
//! bug in the kernels fails the primitives' check.

use gradkit_collectives::registry::Params;
use gradkit_collectives::{make_reducer, Flat};
use gradkit_comm::run_local;
use gradkit_core::trace::{Layout, Sparse};
use gradkit_cuda::check;
use gradkit_cuda::resident::Resident;
use gradkit_cuda_emu::{gpu, Emu, Variant};
use gradkit_sparsify::resident::{Counting, DeviceKernels};

fn emulated(v: Variant) -> &'static Resident<Emu> {
    Box::leak(Box::new(Resident::new(Box::leak(Box::new(gpu(v))))))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Equal bits, any NaN equal to any NaN (the GPU's arithmetic NaN is canonical).
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    a == b || (a - b).abs() <= rel * a.abs().max(b.abs()) || (a.is_nan() && b.is_nan())
}

/// Every primitive of `g` against the counting device on `x`; the first difference.
fn check_one(g: &dyn DeviceKernels, name: &str, x: &[f32]) -> Result<(), String> {
    let c = Counting::new();
    let n = x.len();
    let (xg, xc) = (g.upload_f32(x), c.upload_f32(x));
    let err = |what: &str| Err(format!("{what} differs on {name} (n = {n})"));
    if bits(&g.download_f32(&xg)) != bits(x) {
        return err("upload/download");
    }
    let ranges = [0..n, n / 3..n - n / 5];
    for r in &ranges {
        for k in [0, 1, 2, r.len() / 2, r.len()] {
            let (gi, gv, gt) = g.topk(&xg, r.clone(), k);
            let (ci, cv, ct) = c.topk(&xc, r.clone(), k);
            if g.download_u32(&gi) != c.download_u32(&ci)
                || !same(&g.download_f32(&gv), &c.download_f32(&cv))
                || gt.map(f32::to_bits) != ct.map(f32::to_bits)
            {
                return err(&format!("topk k = {k} in {r:?}"));
            }
        }
    }
    let mut ths = vec![-1.0, 0.0, f32::from_bits(1), f32::INFINITY, f32::NAN];
    if n > 0 {
        ths.extend([x[n / 2].abs(), c.kth_largest_magnitude(&xc, n.div_ceil(3))]);
        for k in [1, n.div_ceil(3), n] {
            if g.kth_largest_magnitude(&xg, k).to_bits()
                != c.kth_largest_magnitude(&xc, k).to_bits()
            {
                return err(&format!("kth_largest_magnitude k = {k}"));
            }
        }
    }
    for th in ths {
        let (gi, gv) = g.select_above(&xg, th);
        let (ci, cv) = c.select_above(&xc, th);
        if g.download_u32(&gi) != c.download_u32(&ci)
            || !same(&g.download_f32(&gv), &c.download_f32(&cv))
        {
            return err(&format!("select_above th = {th}"));
        }
        if g.count_above(&xg, th) != c.count_above(&xc, th) {
            return err(&format!("count_above th = {th}"));
        }
    }
    let idx: Vec<u32> = (0..n as u32).filter(|i| i % 3 == 1).collect();
    let (ig, ic) = (g.upload_u32(&idx), c.upload_u32(&idx));
    if !same(
        &g.download_f32(&g.gather(&xg, &ig)),
        &c.download_f32(&c.gather(&xc, &ic)),
    ) {
        return err("gather");
    }
    // acc = x + y, then the entries at idx zeroed: the residual of error feedback.
    let y: Vec<f32> = x.iter().rev().copied().collect();
    let (mut ag, mut ac) = (g.upload_f32(x), c.upload_f32(x));
    let (sg, sc) = (
        g.add_squared(&mut ag, &g.upload_f32(&y)),
        c.add_squared(&mut ac, &c.upload_f32(&y)),
    );
    if !same(&g.download_f32(&ag), &c.download_f32(&ac)) || !close(sg, sc, 1e-12) {
        return err("add_squared");
    }
    let (lg, lc) = (g.zero_at(&mut ag, &ig), c.zero_at(&mut ac, &ic));
    if !same(&g.download_f32(&ag), &c.download_f32(&ac)) || !close(lg, lc, 1e-12) {
        return err("zero_at");
    }
    let (ng, nc) = (g.range_norms(&xg, &ranges), c.range_norms(&xc, &ranges));
    if ng.iter().zip(&nc).any(|(a, b)| !close(*a, *b, 1e-12)) {
        return err("range_norms");
    }
    if n > 0 {
        let ((mg, sg), (mc, sc)) = (g.mean_std(&xg), c.mean_std(&xc));
        if !close(mg, mc, 1e-9) || !close(sg, sc, 1e-9) {
            return err("mean_std");
        }
    }
    Ok(())
}

fn check_all(g: &dyn DeviceKernels) -> Result<usize, String> {
    let mut cases = 0;
    for n in check::small_lengths() {
        for (name, x) in check::inputs(n, 5) {
            check_one(g, &name, &x)?;
            cases += 1;
        }
    }
    Ok(cases)
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
                    density: 0.02,
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
