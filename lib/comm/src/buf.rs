//! Message payloads: [`Buf`], a typed buffer that lives in host memory or on a device.
//!
//! Host buffers own a `Vec` of one element type; [`Elem::wrap`] and [`Elem::unwrap`] (or
//! [`Buf::from_vec`] / [`Buf::into_vec`]) move the `Vec` in and out without copying. Device
//! buffers hold an `Arc<dyn DeviceMemory>`: gradkit implements no device memory itself; a
//! GPU backend supplies its own type and moves it (a host-only backend refuses it with
//! [`CommError::UnsupportedLocation`]).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::CommError;

/// The element kinds that travel in messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    F32,
    F64,
    U32,
    U64,
    U8,
}

impl Kind {
    /// Every kind, in a fixed order.
    pub const ALL: [Kind; 5] = [Kind::F32, Kind::F64, Kind::U32, Kind::U64, Kind::U8];
    pub fn bytes(self) -> usize {
        match self {
            Kind::F32 | Kind::U32 => 4,
            Kind::F64 | Kind::U64 => 8,
            Kind::U8 => 1,
        }
    }
}

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    Host,
    /// An accelerator, by its ordinal (a CUDA device number, say).
    Device(usize),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => write!(f, "host"),
            Location::Device(d) => write!(f, "device {d}"),
        }
    }
}

/// Memory on an accelerator, owned by the backend or library that allocated it. gradkit
/// only carries it in a [`Buf`]; a backend that moves device memory downcasts it
/// ([`DeviceMemory::as_any`]) to its own type.
pub trait DeviceMemory: Send + Sync + fmt::Debug {
    /// The device the memory is on.
    fn ordinal(&self) -> usize;
    /// The size of the allocation in bytes.
    fn size_bytes(&self) -> usize;
    /// For downcasting to the implementation's type.
    fn as_any(&self) -> &dyn Any;
}

/// Host storage: one `Vec` per element kind (private: the public API is [`Buf`]'s methods).
#[derive(Clone, PartialEq)]
enum Host {
    F32(Vec<f32>),
    F64(Vec<f64>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    U8(Vec<u8>),
}

#[derive(Clone)]
enum Mem {
    Host(Host),
    Device {
        kind: Kind,
        len: usize,
        mem: Arc<dyn DeviceMemory>,
    },
}

/// An owned, typed message payload, in host memory or on a device. Cloning a device buffer
/// shares its memory (the `Arc`); cloning a host buffer copies it.
#[derive(Clone)]
pub struct Buf {
    mem: Mem,
}

impl Buf {
    /// A host buffer that owns `v` (no copy).
    pub fn from_vec<T: Elem>(v: Vec<T>) -> Buf {
        T::wrap(v)
    }
    /// The host `Vec` back (no copy); an error if the kind differs or the buffer is on a
    /// device.
    pub fn into_vec<T: Elem>(self) -> Result<Vec<T>, CommError> {
        T::try_unwrap(self)
    }
    /// The host elements, if this is a host buffer of `T`.
    pub fn as_slice<T: Elem>(&self) -> Option<&[T]> {
        T::slice(self)
    }
    /// An empty host buffer of `kind`.
    pub fn empty(kind: Kind) -> Buf {
        let h = match kind {
            Kind::F32 => Host::F32(Vec::new()),
            Kind::F64 => Host::F64(Vec::new()),
            Kind::U32 => Host::U32(Vec::new()),
            Kind::U64 => Host::U64(Vec::new()),
            Kind::U8 => Host::U8(Vec::new()),
        };
        Buf { mem: Mem::Host(h) }
    }
    /// A buffer of `len` elements of `kind` in device memory `mem`, which must hold at least
    /// `len × kind.bytes()` bytes.
    pub fn device(kind: Kind, len: usize, mem: Arc<dyn DeviceMemory>) -> Result<Buf, CommError> {
        let need = len.checked_mul(kind.bytes());
        if need.is_none_or(|n| n > mem.size_bytes()) {
            return Err(CommError::SizeMismatch(format!(
                "{len} elements of {kind:?} do not fit a device allocation of {} bytes",
                mem.size_bytes()
            )));
        }
        Ok(Buf {
            mem: Mem::Device { kind, len, mem },
        })
    }
    /// The device memory behind a device buffer.
    pub fn device_memory(&self) -> Option<&Arc<dyn DeviceMemory>> {
        match &self.mem {
            Mem::Host(_) => None,
            Mem::Device { mem, .. } => Some(mem),
        }
    }
    pub fn location(&self) -> Location {
        match &self.mem {
            Mem::Host(_) => Location::Host,
            Mem::Device { mem, .. } => Location::Device(mem.ordinal()),
        }
    }
    pub fn is_host(&self) -> bool {
        matches!(self.mem, Mem::Host(_))
    }
    pub fn kind(&self) -> Kind {
        match &self.mem {
            Mem::Host(Host::F32(_)) => Kind::F32,
            Mem::Host(Host::F64(_)) => Kind::F64,
            Mem::Host(Host::U32(_)) => Kind::U32,
            Mem::Host(Host::U64(_)) => Kind::U64,
            Mem::Host(Host::U8(_)) => Kind::U8,
            Mem::Device { kind, .. } => *kind,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.mem {
            Mem::Host(Host::F32(v)) => v.len(),
            Mem::Host(Host::F64(v)) => v.len(),
            Mem::Host(Host::U32(v)) => v.len(),
            Mem::Host(Host::U64(v)) => v.len(),
            Mem::Host(Host::U8(v)) => v.len(),
            Mem::Device { len, .. } => *len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Payload size in bytes (what the traffic counters add up).
    pub fn bytes(&self) -> usize {
        self.len() * self.kind().bytes()
    }
    /// A host buffer's memory as bytes, in this machine's byte order (no copy); `None` for a
    /// device buffer. What a transport that carries bytes sends (the Python transport, NCCL's
    /// host staging).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match &self.mem {
            Mem::Host(Host::F32(v)) => Some(elem_bytes(v)),
            Mem::Host(Host::F64(v)) => Some(elem_bytes(v)),
            Mem::Host(Host::U32(v)) => Some(elem_bytes(v)),
            Mem::Host(Host::U64(v)) => Some(elem_bytes(v)),
            Mem::Host(Host::U8(v)) => Some(v),
            Mem::Device { .. } => None,
        }
    }
    /// A host buffer of `kind` holding a copy of `bytes` ([`Buf::host_bytes`] of a buffer of
    /// that kind, received whole); an error when they are not a whole number of elements.
    pub fn from_host_bytes(kind: Kind, bytes: &[u8]) -> Result<Buf, CommError> {
        if !bytes.len().is_multiple_of(kind.bytes()) {
            return Err(CommError::SizeMismatch(format!(
                "{} bytes are not a whole number of {kind:?} elements",
                bytes.len()
            )));
        }
        fn copy<T: Elem>(bytes: &[u8]) -> Buf {
            let len = bytes.len() / std::mem::size_of::<T>();
            let mut v: Vec<T> = Vec::with_capacity(len);
            // SAFETY: `v` has room for `len` elements, `bytes.len()` bytes (a whole number of
            // them, checked), all written here before the length is set; every bit pattern is
            // a valid `Elem`. One pass: the memory is not zeroed first.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    v.as_mut_ptr().cast::<u8>(),
                    bytes.len(),
                );
                v.set_len(len);
            }
            T::wrap(v)
        }
        Ok(match kind {
            Kind::F32 => copy::<f32>(bytes),
            Kind::F64 => copy::<f64>(bytes),
            Kind::U32 => copy::<u32>(bytes),
            Kind::U64 => copy::<u64>(bytes),
            Kind::U8 => Buf::from_vec(bytes.to_vec()),
        })
    }
}

/// A slice of plain numbers as its bytes, in this machine's byte order (no copy).
pub fn elem_bytes<T: Elem>(v: &[T]) -> &[u8] {
    // SAFETY: every `Elem` (f32, f64, u32, u64, u8; the trait is sealed) is a plain number
    // without padding, so its memory is `size_of_val(v)` initialised bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// [`elem_bytes`] to write: every bit pattern is a valid value of each `Elem`.
pub fn elem_bytes_mut<T: Elem>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as `elem_bytes`, and any bytes written make valid values.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl PartialEq for Buf {
    /// Host buffers compare by contents; device buffers by identity (same memory, kind and
    /// length), since their contents are not readable here.
    fn eq(&self, other: &Buf) -> bool {
        match (&self.mem, &other.mem) {
            (Mem::Host(a), Mem::Host(b)) => a == b,
            (
                Mem::Device { kind, len, mem },
                Mem::Device {
                    kind: k2,
                    len: l2,
                    mem: m2,
                },
            ) => kind == k2 && len == l2 && Arc::ptr_eq(mem, m2),
            _ => false,
        }
    }
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.mem {
            Mem::Host(Host::F32(v)) => f.debug_tuple("Buf::F32").field(v).finish(),
            Mem::Host(Host::F64(v)) => f.debug_tuple("Buf::F64").field(v).finish(),
            Mem::Host(Host::U32(v)) => f.debug_tuple("Buf::U32").field(v).finish(),
            Mem::Host(Host::U64(v)) => f.debug_tuple("Buf::U64").field(v).finish(),
            Mem::Host(Host::U8(v)) => f.debug_tuple("Buf::U8").field(v).finish(),
            Mem::Device { kind, len, mem } => f
                .debug_struct("Buf::Device")
                .field("kind", kind)
                .field("len", len)
                .field("mem", mem)
                .finish(),
        }
    }
}

impl Buf {
    /// Elements a host buffer holds without reallocating (its length on a device).
    fn capacity(&self) -> usize {
        match &self.mem {
            Mem::Host(Host::F32(v)) => v.capacity(),
            Mem::Host(Host::F64(v)) => v.capacity(),
            Mem::Host(Host::U32(v)) => v.capacity(),
            Mem::Host(Host::U64(v)) => v.capacity(),
            Mem::Host(Host::U8(v)) => v.capacity(),
            Mem::Device { len, .. } => *len,
        }
    }
}

/// Large host message buffers a backend keeps for reuse (docs/MEMORY.md): a send buffer whose
/// message has gone out is [`BufPool::put`] here, and a later receive of a similar size
/// [`BufPool::take`]s it instead of allocating, so the steady state of a ring, where each
/// step sends one chunk and receives one, allocates and page-faults nothing. At most
/// [`BufPool::MAX_BUFS`] buffers of at least [`BufPool::MIN_BYTES`] each are kept (the
/// largest ones), so a pool holds at most two of the largest messages it has seen.
#[derive(Default)]
pub(crate) struct BufPool {
    bufs: Mutex<Vec<Buf>>,
}

impl BufPool {
    /// Buffers kept at most.
    pub(crate) const MAX_BUFS: usize = 2;
    /// Smaller buffers are not kept: the allocator reuses them cheaply on its own.
    pub(crate) const MIN_BYTES: usize = 64 << 10;
    /// A taken buffer's capacity is at most this many times the length asked for, so a
    /// small message never pins a large buffer.
    const MAX_SLACK: usize = 4;

    /// Keeps `b` for reuse if it is a large host buffer; the smallest buffer is dropped when
    /// more than [`BufPool::MAX_BUFS`] would be kept.
    pub(crate) fn put(&self, b: Buf) {
        if !b.is_host() || b.capacity() * b.kind().bytes() < Self::MIN_BYTES {
            return;
        }
        let mut bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        bufs.push(b);
        if bufs.len() > Self::MAX_BUFS {
            let small = (0..bufs.len())
                .min_by_key(|&i| bufs[i].capacity() * bufs[i].kind().bytes())
                .unwrap_or(0);
            bufs.swap_remove(small);
        }
    }

    /// A kept buffer of `T` resized to `len` elements (its contents are stale values, to be
    /// overwritten by a receive), or `None` when no kept buffer fits: `len` elements below
    /// [`BufPool::MIN_BYTES`], none of kind `T` with room for `len`, or only much larger
    /// ones. Picks the smallest that fits; resizing within capacity allocates nothing.
    pub(crate) fn take<T: Elem>(&self, len: usize) -> Option<Vec<T>> {
        if len.saturating_mul(T::KIND.bytes()) < Self::MIN_BYTES {
            return None;
        }
        let mut bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |b: &Buf| {
            b.kind() == T::KIND
                && (len..=len.saturating_mul(Self::MAX_SLACK)).contains(&b.capacity())
        };
        let i = (0..bufs.len())
            .filter(|&i| fits(&bufs[i]))
            .min_by_key(|&i| bufs[i].capacity())?;
        let mut v = T::try_unwrap(bufs.swap_remove(i)).ok()?;
        // Within capacity: truncates, or writes the few elements a longer message adds.
        v.resize(len, T::default());
        Some(v)
    }

    /// Bytes of memory the kept buffers hold.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        let bufs = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        bufs.iter().map(|b| b.capacity() * b.kind().bytes()).sum()
    }
}

/// Buffers of at least this many bytes get [`huge_vec`]'s huge-page advice (numpy's
/// threshold for the same advice).
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// Buffers of at least this many bytes get room for a whole number of 2 MiB huge pages
/// ([`huge_vec`]).
pub const HUGE_ROUND_MIN_BYTES: usize = 1 << 20;
/// The size of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// An empty `Vec` with room for at least `cap` elements. When that is at least
/// [`HUGE_PAGE_MIN_BYTES`], its memory is advised to be backed by transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`, as numpy does for its large arrays) before anything touches it,
/// so that filling it faults 2 MiB pages instead of 4 KiB ones and a memory-bound pass over it
/// misses the TLB far less. docs/MEMORY.md: Open MPI's in-place allreduce of 64 MiB at P = 4 took
/// 1.6× as long on a 4 KiB-page buffer as on numpy's huge-page one. No effect where THP is
/// off ("never") or not on Linux.
///
/// From [`HUGE_ROUND_MIN_BYTES`] (1 MiB) up, the room is rounded up to a multiple of 2 MiB
/// (at most 2× for a 1 MiB buffer, less than 2 MiB more above that), so that an allocator
/// that maps such blocks 2 MiB-aligned on huge pages (the tools' `BigAlloc` does from 2 MiB)
/// backs the whole buffer with huge pages. docs/MEMORY.md: a ring message is read by its receiver
/// with Open MPI's single-copy `process_vm_readv`, which pins and walks the sender's pages
/// one by one; on the 1 MiB chunks of a 2^20-element ring at P = 4 that page walk
/// (`follow_page_pte`, `unpin_user_pages`, …) took as much CPU as the copy itself, and on
/// huge pages walk and copy together take a quarter of the CPU they took on 4 KiB pages
/// (docs/results/dense.md).
pub fn huge_vec<T: Copy>(cap: usize) -> Vec<T> {
    let size = std::mem::size_of::<T>().max(1);
    let cap = match cap.checked_mul(size) {
        Some(b) if b >= HUGE_ROUND_MIN_BYTES => b.next_multiple_of(HUGE_PAGE_BYTES) / size,
        _ => cap,
    };
    let v: Vec<T> = Vec::with_capacity(cap);
    let bytes = v.capacity() * std::mem::size_of::<T>();
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGE_MIN_BYTES {
        // The page-aligned part of the allocation (madvise wants an aligned start).
        let page = 4096usize;
        let start = v.as_ptr() as usize;
        let lo = start.next_multiple_of(page);
        let hi = (start + bytes) / page * page;
        if hi > lo {
            // SAFETY: [lo, hi) lies inside this live allocation; MADV_HUGEPAGE only changes
            // how the kernel backs the pages, never their contents or validity. A failure
            // (THP not built in) leaves the memory as it was.
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
    v
}

/// Makes room for `len` elements in `v`: a `v` with less capacity is replaced by an empty
/// [`huge_vec`] (its contents are dropped: for buffers about to be overwritten); one with
/// enough room is left as it is.
pub fn reserve_huge<T: Copy>(v: &mut Vec<T>, len: usize) {
    if v.capacity() < len {
        *v = huge_vec(len);
    }
}

/// Regions below this many bytes are not released ([`release`]): a system call costs more
/// than the few pages it could give back.
const RELEASE_MIN_BYTES: usize = 64 << 10;
/// [`release_into`] copies and releases in blocks ending on multiples of this many bytes of
/// address (a huge page), so that every whole page of the source is released.
const RELEASE_BLOCK_BYTES: usize = 2 << 20;

/// Gives the whole memory pages of `[start, start + bytes)` back to the kernel.
fn dontneed(start: usize, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        let page = 4096usize;
        let lo = start.next_multiple_of(page);
        let hi = (start + bytes) / page * page;
        if hi > lo && hi - lo >= RELEASE_MIN_BYTES {
            // SAFETY: [lo, hi) lies inside memory the caller holds exclusively (a `&mut`
            // slice or a `Vec`'s spare capacity). MADV_DONTNEED on private memory only makes
            // its pages read as zeros (an anonymous mapping) or as the file's contents (a
            // file mapping) when next touched; the memory stays mapped and valid. A failure
            // leaves the pages as they were.
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, bytes);
}

/// Declares the contents of `s` dead: its whole memory pages go back to the kernel
/// (`madvise(MADV_DONTNEED)`), so they stop counting in the process's resident memory until
/// written again. For a part of a buffer that an algorithm overwrites before it reads it
/// again (a ring's chunk once sent, a received message once added). The elements keep a
/// valid value of `T` (zero, or what they held: the pages at either end that `s` shares
/// with its neighbours are kept, as are regions below 64 KiB), never a meaningful one.
/// docs/MEMORY.md: P in-process ranks each hold their input and their messages; released dead
/// chunks make room for the messages. No effect off Linux.
pub fn release<T: Elem>(s: &mut [T]) {
    dontneed(s.as_mut_ptr() as usize, std::mem::size_of_val(s));
}

/// [`release`] for the spare capacity of `v` (the memory past its length): a kept buffer
/// whose stale contents would otherwise stay resident.
pub fn release_spare<T: Elem>(v: &mut Vec<T>) {
    let spare = v.spare_capacity_mut();
    dontneed(spare.as_mut_ptr() as usize, std::mem::size_of_val(spare));
}

/// The blocks of `src` that [`release_into`] and [`copy_release`] work in: each ends on a
/// multiple of 2 MiB of address (the last at the end of `src`), so that every whole page of
/// `src` lies inside one block and is released with it.
fn release_blocks<T>(src: &[T]) -> impl Iterator<Item = std::ops::Range<usize>> {
    let size = std::mem::size_of::<T>().max(1);
    let (base, len) = (src.as_ptr() as usize, src.len());
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let addr = base + at * size;
        let end = (addr + 1).next_multiple_of(RELEASE_BLOCK_BYTES);
        let take = ((end - addr) / size).clamp(1, len - at);
        at += take;
        Some(at - take..at)
    })
}

/// Appends `src` to `out` and [`release`]s `src` as it goes, a block (up to 2 MiB of
/// address) at a time, so that the copy and its source are never both resident in full:
/// for a source that is dead once copied (a chunk sent and not read again before it is
/// overwritten).
pub fn release_into<T: Elem>(out: &mut Vec<T>, src: &mut [T]) {
    out.reserve(src.len());
    for b in release_blocks(src) {
        out.extend_from_slice(&src[b.clone()]);
        release(&mut src[b]);
    }
}

/// Copies `src` into `dst` (same length) and [`release`]s `src` as it goes, a block at a
/// time ([`release_into`]): for a received message that is dead once copied into place.
pub fn copy_release<T: Elem>(dst: &mut [T], src: &mut [T]) {
    assert_eq!(dst.len(), src.len(), "copy_release of unequal lengths");
    for b in release_blocks(src) {
        dst[b.clone()].copy_from_slice(&src[b.clone()]);
        release(&mut src[b]);
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can travel in a [`Buf`]: `f32`, `f64`, `u32`, `u64`, `u8` (sealed).
pub trait Elem: sealed::Sealed + Copy + Send + Sync + Default + fmt::Debug + 'static {
    const KIND: Kind;
    /// A host buffer that owns `v` (no copy).
    fn wrap(v: Vec<Self>) -> Buf;
    /// The host `Vec` back (no copy), or why not.
    fn try_unwrap(b: Buf) -> Result<Vec<Self>, CommError>;
    /// The host elements of `b`, if it is a host buffer of this type.
    fn slice(b: &Buf) -> Option<&[Self]>;
    /// [`Elem::try_unwrap`] that panics on a wrong kind or a device buffer (an algorithm
    /// bug). Prefer `try_unwrap` in code that returns `Result`.
    fn unwrap(b: Buf) -> Vec<Self> {
        Self::try_unwrap(b).unwrap_or_else(|e| panic!("{e}"))
    }
}

macro_rules! elem {
    ($t:ty, $k:ident) => {
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const KIND: Kind = Kind::$k;
            fn wrap(v: Vec<Self>) -> Buf {
                Buf {
                    mem: Mem::Host(Host::$k(v)),
                }
            }
            fn try_unwrap(b: Buf) -> Result<Vec<Self>, CommError> {
                match b.mem {
                    Mem::Host(Host::$k(v)) => Ok(v),
                    Mem::Device {
                        kind: Kind::$k,
                        mem,
                        ..
                    } => Err(CommError::NotOnHost {
                        location: Location::Device(mem.ordinal()),
                    }),
                    _ => Err(CommError::KindMismatch {
                        from: None,
                        expected: Kind::$k,
                        got: b.kind(),
                    }),
                }
            }
            fn slice(b: &Buf) -> Option<&[Self]> {
                match &b.mem {
                    Mem::Host(Host::$k(v)) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
elem!(f32, F32);
elem!(f64, F64);
elem!(u32, U32);
elem!(u64, U64);
elem!(u8, U8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_bytes_round_trip_in_the_machines_byte_order() {
        let b = Buf::from_vec(vec![1.5f32, -2.0]);
        let want: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        assert_eq!(b.host_bytes(), Some(&want[..]));
        assert_eq!(Buf::from_host_bytes(Kind::F32, &want).unwrap(), b);
        let u: Vec<u8> = 7u64
            .to_ne_bytes()
            .into_iter()
            .chain(9u64.to_ne_bytes())
            .collect();
        assert_eq!(
            Buf::from_host_bytes(Kind::U64, &u).unwrap(),
            Buf::from_vec(vec![7u64, 9])
        );
        assert_eq!(
            Buf::from_host_bytes(Kind::U8, &[3, 4]).unwrap(),
            Buf::from_vec(vec![3u8, 4])
        );
        let e = Buf::from_host_bytes(Kind::F64, &[0; 12])
            .unwrap_err()
            .to_string();
        assert!(e.contains("12 bytes are not a whole number of F64"), "{e}");
    }

    #[derive(Debug)]
    struct FakeDev(usize, usize);
    impl DeviceMemory for FakeDev {
        fn ordinal(&self) -> usize {
            self.0
        }
        fn size_bytes(&self) -> usize {
            self.1
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn host_vectors_move_in_and_out_without_a_copy() {
        let v: Vec<f32> = vec![1.0, 2.0, 3.0];
        let ptr = v.as_ptr();
        let b = Buf::from_vec(v);
        assert_eq!(b.as_slice::<f32>().unwrap().as_ptr(), ptr);
        assert_eq!((b.kind(), b.len(), b.bytes()), (Kind::F32, 3, 12));
        assert_eq!(b.location(), Location::Host);
        let back: Vec<f32> = b.into_vec().unwrap();
        assert_eq!(back.as_ptr(), ptr);
        assert_eq!(back, vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn huge_vecs_are_ordinary_vecs_of_the_room_asked_for() {
        for cap in [
            0usize,
            1,
            1000,
            (1 << 18) - 1,
            1 << 18,
            HUGE_PAGE_MIN_BYTES / 4 + 3,
        ] {
            let mut v: Vec<f32> = huge_vec(cap);
            assert!(v.is_empty() && v.capacity() >= cap);
            if cap * 4 >= HUGE_ROUND_MIN_BYTES {
                // Whole 2 MiB pages: the room asked for, rounded up to the next 2 MiB.
                assert_eq!(v.capacity(), (cap * 4).div_ceil(2 << 20) * (2 << 20) / 4);
            }
            v.extend((0..cap).map(|i| i as f32));
            assert!(v.iter().enumerate().all(|(i, x)| *x == i as f32));
        }
        let mut v = vec![1f32; 10];
        reserve_huge(&mut v, 5);
        assert_eq!(v, vec![1f32; 10], "enough room: untouched");
        reserve_huge(&mut v, 20);
        assert!(v.is_empty() && v.capacity() >= 20);
    }

    #[test]
    fn the_pool_hands_back_kept_buffers_without_allocating_and_stays_bounded() {
        let pool = BufPool::default();
        let n = BufPool::MIN_BYTES / 4; // f32 elements in the smallest kept buffer
                                        // Small buffers, device buffers and nothing at all are not kept.
        pool.put(Buf::from_vec(vec![1f32; 10]));
        pool.put(Buf::device(Kind::F32, 4, Arc::new(FakeDev(0, 16))).unwrap());
        assert_eq!(pool.held_bytes(), 0);
        assert!(pool.take::<f32>(n).is_none());
        // A kept buffer comes back (same memory), resized, for the right kind only.
        let v = vec![7f32; 2 * n];
        let ptr = v.as_ptr();
        pool.put(Buf::from_vec(v));
        assert!(pool.take::<u32>(2 * n).is_none());
        assert!(
            pool.take::<f32>(2 * n + 1).is_none(),
            "no room for one more"
        );
        let w = pool.take::<f32>(2 * n - 1).unwrap();
        assert_eq!((w.as_ptr(), w.len()), (ptr, 2 * n - 1));
        assert!(w.iter().all(|x| *x == 7.0));
        assert!(pool.take::<f32>(n).is_none(), "taken once");
        // Much larger buffers are not handed out for a small message.
        pool.put(Buf::from_vec(w));
        assert!(pool.take::<f32>(n / 2).is_none());
        assert!(pool.take::<f32>(n / 2 * 3).is_some());
        // At most MAX_BUFS are kept, the largest ones.
        for k in 1..=4 {
            pool.put(Buf::from_vec(vec![0f32; k * n]));
        }
        assert_eq!(pool.held_bytes(), (3 + 4) * n * 4);
        assert_eq!(pool.take::<f32>(4 * n).map(|v| v.len()), Some(4 * n));
        assert_eq!(pool.take::<f32>(3 * n).map(|v| v.len()), Some(3 * n));
        assert_eq!(pool.held_bytes(), 0);
    }

    #[test]
    fn a_wrong_kind_or_a_device_buffer_is_an_error_not_a_panic() {
        let b = u32::wrap(vec![1, 2]);
        assert_eq!(
            f64::try_unwrap(b).unwrap_err(),
            CommError::KindMismatch {
                from: None,
                expected: Kind::F64,
                got: Kind::U32
            }
        );
        let d = Buf::device(Kind::F32, 4, Arc::new(FakeDev(3, 16))).unwrap();
        assert_eq!(d.location(), Location::Device(3));
        assert_eq!((d.kind(), d.len(), d.bytes()), (Kind::F32, 4, 16));
        assert!(d.as_slice::<f32>().is_none());
        assert_eq!(d, d.clone());
        assert_eq!(
            f32::try_unwrap(d).unwrap_err(),
            CommError::NotOnHost {
                location: Location::Device(3)
            }
        );
        assert!(matches!(
            Buf::device(Kind::F64, 4, Arc::new(FakeDev(0, 31))),
            Err(CommError::SizeMismatch(_))
        ));
    }
}
