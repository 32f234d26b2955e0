//! The CUDA kernels, compiled for the host under the emulation header and driven by
//! gradkit-cuda's own host code (`exec::Gpu`), against the CPU `Kernels` on adversarial
//! inputs (`gradkit_cuda::check`); and each planted bug caught by the same checks.

use gradkit_cuda::check;
use gradkit_cuda::exec::{Gpu, BLOCK, KERNEL_NAMES, SOURCE, TILE};
use gradkit_cuda_emu::{gpu, Emu, Variant};

fn checked(g: &Gpu<Emu>, lengths: &[usize]) -> Result<check::Tally, String> {
    let t = check::check_all(g, lengths, 1)?;
    let be = g.backend();
    if be.overruns() != 0 {
        return Err(format!(
            "{} device buffers written past their end",
            be.overruns()
        ));
    }
    if be.live() != 0 {
        return Err(format!("{} device buffers not freed", be.live()));
    }
    Ok(t)
}

#[test]
fn every_kernel_equals_the_cpu_reference_under_emulation() {
    let g = gpu(Variant::Plain);
    let t = checked(&g, &check::small_lengths()).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "emulation: {} calls over {} elements, {} kernel launches: equal to the CPU kernels",
        t.cases,
        t.elements,
        g.backend().launches()
    );
    assert!(t.cases > 500, "{t:?}");
}

#[test]
fn the_fp16_wire_equals_the_half_crate_on_every_pattern() {
    check::check_f16_exhaustive(&gpu(Variant::Plain)).unwrap_or_else(|e| panic!("{e}"));
}

/// Each planted bug (an off-by-one in the compaction, `>` for `≥` in the 1-bit sign, `≥`
/// for `>` in threshold selection) makes the checks fail, with a message that names the
/// method.
#[test]
fn every_planted_bug_is_caught() {
    for v in Variant::PLANTED {
        let e = checked(&gpu(v), &check::small_lengths())
            .map(|t| format!("{t:?}"))
            .expect_err(&format!("{v:?} passed the checks"));
        let method = match v {
            Variant::CompactOffByOne => "top",
            Variant::SignGtForGe => "onebit",
            Variant::ThresholdGeForGt => "select_above",
            Variant::Plain | Variant::PlainThreads => unreachable!(),
        };
        assert!(e.contains(method), "{v:?}: {e}");
        eprintln!("planted {v:?}: caught: {e}");
    }
}

/// The host code and the source agree on the launch geometry and the kernel list.
#[test]
fn the_source_and_the_host_code_agree() {
    assert!(SOURCE.contains(&format!("#define GK_BLOCK {BLOCK}")));
    assert_eq!(TILE, BLOCK * 8);
    assert!(SOURCE.contains("#define GK_ITEMS 8"));
    for k in KERNEL_NAMES {
        assert!(SOURCE.contains(&format!("GK_KERNEL void {k}(")), "{k}");
        assert!(
            SOURCE.contains(&format!("X({k})")),
            "{k} missing from GK_KERNELS"
        );
    }
    assert_eq!(
        SOURCE.matches("GK_KERNEL void ").count(),
        KERNEL_NAMES.len()
    );
}

/// The same kernels with the threads of a block as OS threads (true concurrency between
/// barriers; about 1 ms a barrier here, so a part of the matrix): top-k with ties across
/// tiles, threshold selection at a tied threshold, the 1-bit kernels, on a length that is not
/// a multiple of the tile.
#[test]
fn with_os_threads_the_kernels_still_equal_the_cpu() {
    use gradkit_sparsify::kernels::{cpu, Kernels};
    let g = gpu(Variant::PlainThreads);
    let n = 2 * TILE as usize + 3;
    let inputs = check::inputs(n, 2);
    let (_, ties) = &inputs[1];
    let k = n / 3;
    let (gi, gv, gt) = g.topk_with_values(ties, k);
    let (ci, cv, ct) = cpu().topk_with_values(ties, k);
    assert_eq!(gi, ci);
    assert_eq!(gv, cv);
    assert_eq!(gt.map(f32::to_bits), ct.map(f32::to_bits));
    let th = cpu().kth_largest_magnitude(ties, k);
    assert_eq!(g.select_above(ties, th), cpu().select_above(ties, th));
    let mut t = check::Tally::default();
    let (name, mixed) = &inputs[0];
    check::check_onebit(&g, name, mixed, &mut t).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(g.backend().overruns(), 0);
    eprintln!("OS-thread emulation: {} launches", g.backend().launches());
}

/// The per-size check a GPU node runs at 2^10 … 2^26 (`check_large`), here at a small size:
/// every row equal, and a planted bug shows as a failing row.
#[test]
fn the_large_size_check_passes_and_catches_a_plant() {
    let rows = check::check_large(&gpu(Variant::Plain), 3001, 3);
    assert_eq!(rows.len(), 6);
    for (m, ok, detail) in &rows {
        assert!(ok, "{m}: {detail}");
    }
    let rows = check::check_large(&gpu(Variant::ThresholdGeForGt), 3001, 3);
    assert!(
        rows.iter()
            .any(|(m, ok, _)| !ok && m.starts_with("select_above")),
        "{rows:?}"
    );
}
