//! The tools' global allocator: large blocks straight from the kernel, on huge pages.
//!
//! docs/MEMORY.md: the tools churn model-sized buffers every step (decoded
//! values, a rank's rows, its flat input, the writer's arrays). glibc's malloc serves blocks
//! below its dynamic mmap threshold (which rises to 32 MiB) from its heap, and freed ones stay
//! there, fragmented: peak RSS was 1.6–4.7 × what the tools hold. glibc's own
//! `MALLOC_MMAP_THRESHOLD_=1048576` hands them back, but then every fresh buffer is faulted in
//! again 4 KiB at a time (2–2.5 s of system time per 765 MiB trace).
//!
//! [`BigAlloc`] keeps glibc for everything below [`BIG`] and maps every block of [`BIG`] or
//! more with `mmap` of its own: freed, it goes back to the kernel (`munmap`), except that up
//! to [`CACHE_BYTES`] of freed blocks are kept and handed to the next request of their size
//! class (eight classes per power of two), so the blocks a step frees and makes again are not
//! faulted in each time. A block of [`HUGE`] or more is aligned to 2 MiB and the 2 MiB pages it
//! covers are advised `MADV_HUGEPAGE`, so the kernel backs them with transparent huge pages
//! (one fault per 2 MiB, where the system allows it:
//! `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`). A block below
//! [`HUGE`] grows by `mremap`, which moves page tables, not bytes; a bigger one (its advice may
//! have split its mapping) is copied. `GRADKIT_BIG_ALLOC=off` in the environment hands every
//! block to glibc instead, `GRADKIT_BIG_ALLOC=BIG_MIB:CACHE_MIB` changes the two sizes.
//! Measured trade-offs: docs/MEMORY.md ("The allocator"). Every tool's `main` installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: gradkit_core::alloc::BigAlloc = gradkit_core::alloc::BigAlloc;
//! ```
//!
//! On systems other than Linux it is the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Blocks of this many bytes or more are mapped by [`BigAlloc`] itself.
pub const BIG: usize = 1 << 20;
/// No block below this many bytes is mapped, whatever `GRADKIT_BIG_ALLOC` says.
const FLOOR: usize = 1 << 20;
/// Blocks of this many bytes or more are aligned to and advised for 2 MiB huge pages.
pub const HUGE: usize = 2 << 20;
/// Freed large blocks kept for reuse, at most this many bytes (and 16 blocks). 16 MiB
/// saved a tenth of the faults of 8 MiB and cost 6–8 MiB of peak RSS (gradselect topk).
pub const CACHE_BYTES: usize = 8 << 20;
const PAGE: usize = 4096;

/// The global allocator of the `grad…` tools (module docs).
pub struct BigAlloc;

#[cfg(target_os = "linux")]
mod sys {
    use super::{HUGE, PAGE};
    use std::sync::Mutex;

    /// The length mapped for a block of `size` bytes: rounded up to one of eight classes per
    /// power of two (at most 12.5 % more address space), so that blocks of slightly different
    /// sizes share a class and a freed one can serve the next request of its class.
    pub fn class(size: usize) -> usize {
        let size = size.max(PAGE);
        let g = (1usize << (usize::BITS - 1 - size.leading_zeros())).max(8 * PAGE) / 8;
        size.next_multiple_of(g)
    }

    /// Freed blocks kept for reuse: `(address, class length)`, at most [`CACHE_BYTES`] in
    /// all. A block a tool frees and allocates again within a step (decoded pages and batches,
    /// a row's buffer) is then neither unmapped nor faulted in again.
    struct Cache {
        blocks: [(usize, usize); 16],
        len: usize,
        bytes: usize,
    }

    static CACHE: Mutex<Cache> = Mutex::new(Cache {
        blocks: [(0, 0); 16],
        len: 0,
        bytes: 0,
    });

    fn cache() -> std::sync::MutexGuard<'static, Cache> {
        CACHE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of class length `len` from the cache, if one is there.
    fn take(len: usize) -> Option<usize> {
        let mut c = cache();
        let n = c.len;
        let i = c.blocks[..n].iter().rposition(|b| b.1 == len)?;
        let (p, _) = c.blocks[i];
        c.blocks.copy_within(i + 1..n, i);
        c.len -= 1;
        c.bytes -= len;
        Some(p)
    }

    /// Keeps a freed block of class length `len` in the cache; `false` when it is full.
    fn keep(p: usize, len: usize) -> bool {
        let mut c = cache();
        let cap = super::settings().1;
        if len > cap || c.bytes + len > cap {
            return false;
        }
        if c.len == c.blocks.len() {
            return false;
        }
        let n = c.len;
        c.blocks[n] = (p, len);
        c.len += 1;
        c.bytes += len;
        true
    }

    /// Advises the 2 MiB pages that `size` bytes from `p` cover whole for huge pages (not
    /// the class's slack beyond `size`, which would then be faulted in whole).
    unsafe fn advise(p: usize, size: usize) {
        let end = (p + size) / HUGE * HUGE;
        let start = p.next_multiple_of(HUGE);
        if end > start {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }

    /// A block of at least `size` bytes (2 MiB-aligned from [`HUGE`] on), from the cache or
    /// freshly mapped (then zero), or null; `zeroed` asks for zero bytes either way.
    ///
    /// # Safety
    /// Only system calls on memory this module maps.
    pub unsafe fn map(size: usize, zeroed: bool) -> *mut u8 {
        let len = class(size);
        if let Some(p) = take(len) {
            if zeroed {
                std::ptr::write_bytes(p as *mut u8, 0, size);
            }
            return p as *mut u8;
        }
        let extra = if len >= HUGE { HUGE } else { 0 };
        let p = libc::mmap(
            std::ptr::null_mut(),
            len + extra,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return std::ptr::null_mut();
        }
        let base = p as usize;
        if extra == 0 {
            return p as *mut u8;
        }
        // Trim the over-allocation to a 2 MiB-aligned start.
        let start = base.next_multiple_of(HUGE);
        if start > base {
            libc::munmap(p, start - base);
        }
        let tail = base + len + extra - (start + len);
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
        advise(start, size);
        start as *mut u8
    }

    /// # Safety
    /// `p` and `size` as [`map`] returned and was given them.
    pub unsafe fn unmap(p: *mut u8, size: usize) {
        let len = class(size);
        if !keep(p as usize, len) {
            libc::munmap(p as *mut libc::c_void, len);
        }
    }

    /// Whether [`remap`] serves a resize: within the block's class, or by `mremap` of a
    /// block below [`HUGE`] (a bigger one's 2 MiB advice may have split it into several
    /// mappings, and `mremap` takes one: it is copied instead).
    pub fn remap_ok(old: usize, new: usize) -> bool {
        class(old) == class(new) || (class(old) < HUGE && class(new) < HUGE)
    }

    /// # Safety
    /// `p` and `old` as [`map`] (or this function) returned and was given them.
    pub unsafe fn remap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
        let (lo, ln) = (class(old), class(new));
        if lo == ln {
            return p;
        }
        let q = libc::mremap(p as *mut libc::c_void, lo, ln, libc::MREMAP_MAYMOVE);
        if q == libc::MAP_FAILED {
            return std::ptr::null_mut();
        }
        advise(q as usize, new);
        q as *mut u8
    }
}

/// The threshold and the cache's size in force: [`BIG`] and [`CACHE_BYTES`], or what
/// `GRADKIT_BIG_ALLOC` says, read once at the first large allocation: `off` (every block from
/// the system allocator, glibc's behaviour before), or `BIG_MIB:CACHE_MIB` (e.g. `4:0`).
static SETTINGS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

fn settings() -> (usize, usize) {
    let big = SETTINGS[0].load(Ordering::Relaxed);
    if big != 0 {
        return (big, SETTINGS[1].load(Ordering::Relaxed));
    }
    let (mut big, mut cache) = (BIG, CACHE_BYTES);
    // SAFETY: getenv with a NUL-terminated name; the value is read before any other call.
    let v = unsafe { libc::getenv(c"GRADKIT_BIG_ALLOC".as_ptr()) };
    if !v.is_null() {
        // SAFETY: getenv returned a NUL-terminated string.
        let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
        if v == b"off" {
            big = usize::MAX;
        } else if let Some((b, c)) = std::str::from_utf8(v).ok().and_then(|s| s.split_once(':')) {
            if let (Ok(b), Ok(c)) = (b.parse::<usize>(), c.parse::<usize>()) {
                (big, cache) = ((b << 20).max(FLOOR), c << 20);
            }
        }
    }
    SETTINGS[1].store(cache, Ordering::Relaxed);
    SETTINGS[0].store(big, Ordering::Relaxed);
    (big, cache)
}

#[inline]
fn mapped(layout: &Layout) -> bool {
    cfg!(target_os = "linux") && layout.size() >= FLOOR && {
        layout.size() >= settings().0 && layout.align() <= PAGE
    }
}

// SAFETY: blocks are mapped by `sys` exactly when `mapped(layout)` holds, and the caller of
// `dealloc`/`realloc` passes the layout the block was allocated (or last reallocated) with, so
// each block goes back to the allocator it came from. Mappings are page-aligned, which covers
// every alignment up to `PAGE` that `mapped` admits.
unsafe impl GlobalAlloc for BigAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        #[cfg(target_os = "linux")]
        if mapped(&layout) {
            return sys::map(layout.size(), false);
        }
        System.alloc(layout)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        #[cfg(target_os = "linux")]
        if mapped(&layout) {
            return sys::map(layout.size(), true);
        }
        System.alloc_zeroed(layout)
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        #[cfg(target_os = "linux")]
        if mapped(&layout) {
            return sys::unmap(ptr, layout.size());
        }
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = Layout::from_size_align_unchecked(new_size, layout.align());
        match (mapped(&layout), mapped(&new)) {
            (false, false) => System.realloc(ptr, layout, new_size),
            #[cfg(target_os = "linux")]
            (true, true) if sys::remap_ok(layout.size(), new_size) => {
                sys::remap(ptr, layout.size(), new_size)
            }
            _ => {
                let q = self.alloc(new);
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path (small, mapped, huge; grow and shrink across the thresholds) keeps the
    /// bytes written, checked against a copy kept in a plain `Vec`.
    #[test]
    fn blocks_keep_their_bytes_across_every_path() {
        let a = BigAlloc;
        let sizes = [
            100,
            BIG - 1,
            BIG,
            BIG + 5,
            HUGE,
            3 * HUGE + 17,
            BIG / 2,
            5 * HUGE,
            64,
        ];
        unsafe {
            let l = Layout::from_size_align(sizes[0], 8).unwrap();
            let mut p = a.alloc(l);
            assert!(!p.is_null());
            let mut cur = sizes[0];
            let mut want: Vec<u8> = Vec::new();
            let fill = |p: *mut u8, from: usize, to: usize, want: &mut Vec<u8>| {
                for i in from..to {
                    let b = (i * 131 % 251) as u8;
                    *p.add(i) = b;
                    want.push(b);
                }
            };
            fill(p, 0, cur, &mut want);
            for &s in &sizes[1..] {
                p = a.realloc(p, Layout::from_size_align(cur, 8).unwrap(), s);
                assert!(!p.is_null());
                want.truncate(s.min(cur));
                if s > cur {
                    fill(p, cur, s, &mut want);
                }
                cur = s;
                let got = std::slice::from_raw_parts(p, cur);
                assert!(got == &want[..], "bytes changed at size {s}");
            }
            a.dealloc(p, Layout::from_size_align(cur, 8).unwrap());
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_and_huge_ones_aligned() {
        let a = BigAlloc;
        for size in [10, BIG, HUGE + 1, 4 * HUGE] {
            unsafe {
                let l = Layout::from_size_align(size, 4).unwrap();
                let p = a.alloc_zeroed(l);
                assert!(!p.is_null());
                assert!(std::slice::from_raw_parts(p, size).iter().all(|b| *b == 0));
                if cfg!(target_os = "linux") && size >= HUGE {
                    assert_eq!(p as usize % HUGE, 0, "size {size}");
                }
                a.dealloc(p, l);
            }
        }
    }
}
