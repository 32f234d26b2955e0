//! `BigAlloc` (lib/core/src/alloc.rs) as this test binary's global allocator: a large block
//! goes back to the kernel when freed (resident memory falls, read from /proc/self/statm),
//! where glibc's heap would keep it; and `Vec`s of every size through it keep their values.
//! One test in its own binary, so no other test allocates meanwhile.

#[global_allocator]
static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;

/// Resident bytes of this process.
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn large_blocks_are_returned_and_vectors_keep_their_values() {
    // GRADKIT_BIG_ALLOC=off hands every block to glibc: this test then fails, as it should
    // (that is how it was checked); any setting other than the default is not tested here.
    if !cfg!(target_os = "linux") || std::env::var_os("GRADKIT_BIG_ALLOC").is_some() {
        return;
    }
    const MIB: usize = 1 << 20;
    // glibc's heap would keep these: a freed 24 MiB block raises its mmap threshold above
    // 8 MiB, and the pin allocated after the blocks stops it trimming the heap's top.
    drop(vec![1u8; 24 * MIB]);
    let base = rss();
    let blocks: Vec<Vec<f32>> = (0..12)
        .map(|b| (0..2 * MIB).map(|i| (b * 2 * MIB + i) as f32).collect())
        .collect();
    let pin = vec![7u8; 64 << 10];
    let touched = rss();
    assert!(touched >= base + 80 * MIB, "{base} -> {touched}");
    // Reference: the values, checked independently of how they were stored.
    for (b, v) in blocks.iter().enumerate() {
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, x)| *x == (b * 2 * MIB + i) as f32));
    }
    drop(blocks);
    let after = rss();
    assert!(
        after + 64 * MIB <= touched,
        "12 freed blocks of 8 MiB stayed resident: {touched} -> {after} bytes"
    );
    assert_eq!(pin[123], 7);
    // Vectors that grow across the thresholds (mremap and copy paths) keep their values.
    let mut w: Vec<u32> = Vec::new();
    for i in 0..(40 * MIB / 4) as u32 {
        w.push(i.wrapping_mul(2_654_435_761));
    }
    assert!(w
        .iter()
        .enumerate()
        .all(|(i, x)| *x == (i as u32).wrapping_mul(2_654_435_761)));
    w.truncate(1000);
    w.shrink_to_fit();
    assert_eq!(w[999], 999u32.wrapping_mul(2_654_435_761));
}
