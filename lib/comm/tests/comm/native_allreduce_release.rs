//! The Local native allreduce sums in place from the ranks' own buffers
//! (no deposited copies), and `release` / `release_into` / `copy_release` give dead pages
//! back without changing what is copied. Checked against references written here: the
//! rank-order f32 sum the native allreduce documents, computed by brute force, and an f64 sum.

use gradkit_comm::{copy_release, release, release_into, run_local, Comm};

/// Rank r's input: pseudo-random values of mixed magnitudes and signs (sums round), with a
/// negative zero every 97 elements (0 + −0 = +0: the sum must start from `T::default()`).
fn input(r: usize, n: usize) -> Vec<f32> {
    let mut g = gradkit_testkit::rng::Rng::new(r as u64 * 7919 + n as u64);
    (0..n)
        .map(|i| {
            if i.is_multiple_of(97) && r.is_multiple_of(2) {
                -0.0
            } else {
                (g.unit_f32() * 2.0 - 1.0) * 10f32.powi((i % 7) as i32 - 3)
            }
        })
        .collect()
}

/// The documented order: 0.0, then every rank's value in rank order, in f32 (one rank
/// keeps its input as it is).
fn rank_order_sum(p: usize, n: usize) -> Vec<f32> {
    if p == 1 {
        return input(0, n);
    }
    let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, n)).collect();
    (0..n)
        .map(|i| {
            let mut acc = 0.0f32;
            for x in &inputs {
                acc += x[i];
            }
            acc
        })
        .collect()
}

#[test]
fn native_allreduce_gives_every_rank_the_rank_order_sum_bit_for_bit() {
    for p in 1..=6usize {
        // Empty, shorter than P, one block of the summing loop and a bit, uneven, large.
        for n in [0usize, 1, 3, 1025, 4099, 300_001] {
            let res = run_local(p, |c: &dyn Comm| {
                let mut x = input(c.rank(), n);
                c.allreduce_native_f32(&mut x)?;
                let mut y: Vec<f64> = input(c.rank(), n).iter().map(|v| *v as f64).collect();
                c.allreduce_native_f64(&mut y)?;
                Ok((x, y))
            })
            .unwrap();
            let want = rank_order_sum(p, n);
            let inputs: Vec<Vec<f32>> = (0..p).map(|r| input(r, n)).collect();
            for (r, (x, y)) in res.iter().enumerate() {
                assert_eq!(x.len(), n);
                for i in 0..n {
                    assert_eq!(
                        x[i].to_bits(),
                        want[i].to_bits(),
                        "P={p} n={n} rank {r} element {i}: {} vs {}",
                        x[i],
                        want[i]
                    );
                    let exact: f64 = inputs.iter().map(|v| v[i] as f64).sum();
                    assert!((y[i] - exact).abs() <= 1e-12 * (1.0 + exact.abs()));
                }
            }
        }
    }
}

#[test]
fn native_allreduce_of_mismatched_calls_fails_on_every_rank_without_a_hang() {
    // Lengths differ: every rank sees it and returns an error.
    let r = run_local(3, |c: &dyn Comm| {
        let mut x = vec![1.0f32; 10 + c.rank()];
        let e = c.allreduce_native_f32(&mut x);
        assert!(e.is_err(), "rank {} got {e:?}", c.rank());
        // Nothing was written into the buffer.
        assert!(x.iter().all(|v| *v == 1.0));
        Ok(())
    });
    assert!(r.is_ok());
    // Element types differ.
    let r = run_local(2, |c: &dyn Comm| {
        if c.rank() == 0 {
            let mut x = vec![1.0f32; 8];
            assert!(c.allreduce_native_f32(&mut x).is_err());
        } else {
            let mut x = vec![1.0f64; 8];
            assert!(c.allreduce_native_f64(&mut x).is_err());
        }
        Ok(())
    });
    assert!(r.is_ok());
}

/// Whether the page holding `addr` is resident (`mincore`).
#[cfg(target_os = "linux")]
fn resident(addr: usize) -> bool {
    let page = 4096usize;
    let mut v = [0u8; 1];
    // SAFETY: one page-aligned page of a live allocation of this test; mincore only reads
    // the page tables.
    let rc = unsafe {
        libc::mincore(
            (addr / page * page) as *mut libc::c_void,
            page,
            v.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore");
    v[0] & 1 == 1
}

#[test]
fn release_into_and_copy_release_copy_exactly_at_any_offset() {
    for off in [0usize, 1, 3, 1000, 1024] {
        for len in [0usize, 1, 5000, 600_000, 1_300_000] {
            let src: Vec<f32> = (0..off + len).map(|i| i as f32 * 0.5 - 7.0).collect();
            let mut a = src.clone();
            let mut out = vec![42.0f32];
            release_into(&mut out, &mut a[off..]);
            assert_eq!(out.len(), len + 1);
            assert_eq!(out[0], 42.0);
            assert_eq!(&out[1..], &src[off..], "release_into off={off} len={len}");
            // What precedes the released slice is untouched (its page is shared).
            assert_eq!(&a[..off], &src[..off]);
            let mut b = src.clone();
            let mut dst = vec![0.0f32; len];
            copy_release(&mut dst, &mut b[off..]);
            assert_eq!(&dst[..], &src[off..], "copy_release off={off} len={len}");
            assert_eq!(&b[..off], &src[..off]);
        }
    }
}

#[test]
fn released_pages_leave_memory_and_read_as_valid_values_after() {
    let n = 4 << 20; // 16 MiB of f32
    let mut v: Vec<f32> = vec![1.5; n];
    let first = v.as_ptr() as usize;
    #[cfg(target_os = "linux")]
    assert!(resident(first + (8 << 20)));
    // Keep the first and last elements' pages: only whole pages inside the slice go.
    release(&mut v[1..n - 1]);
    #[cfg(target_os = "linux")]
    {
        assert!(
            !resident(first + (8 << 20)),
            "a page in the middle was released"
        );
        assert!(
            resident(first),
            "the first page is shared with v[0] and kept"
        );
        assert_eq!(v[0], 1.5);
        assert_eq!(v[n - 1], 1.5);
    }
    // The released elements hold valid values (zeros) and can be written again.
    assert!(v[1..n - 1].iter().all(|x| *x == 0.0 || *x == 1.5));
    v.iter_mut().for_each(|x| *x = 2.0);
    assert!(v.iter().all(|x| *x == 2.0));
}
