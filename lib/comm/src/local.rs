//! The Local backend: P ranks as P threads of one process, exchanging owned buffers through
//! per-rank mailboxes (no serialization). The embedded default and the test harness.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::{check_exchange, Backend, Buf, Comm, CommError, CommResult, Kind, Traffic};

struct Msg {
    src: usize,
    tag: u32,
    buf: Buf,
}

#[derive(Default)]
struct Mailbox {
    queue: Mutex<Vec<Msg>>,
    cv: Condvar,
}

struct Shared {
    size: usize,
    boxes: Vec<Mailbox>,
    failed: AtomicBool,
    barrier: Mutex<(usize, u64)>,
    barrier_cv: Condvar,
    slots: Mutex<Vec<Option<Arc<dyn Any + Send + Sync>>>>,
}

impl Shared {
    fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        for b in &self.boxes {
            let _g = b.queue.lock().unwrap_or_else(|e| e.into_inner());
            b.cv.notify_all();
        }
        let _g = self.barrier.lock().unwrap_or_else(|e| e.into_inner());
        self.barrier_cv.notify_all();
    }
    fn check(&self) -> CommResult<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(CommError::PeerFailed);
        }
        Ok(())
    }
}

/// One rank of a Local world.
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    traffic: Traffic,
}

impl LocalComm {
    fn take(&self, src: usize, tag: u32) -> CommResult<Buf> {
        let mb = &self.shared.boxes[self.rank];
        let mut q = mb.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(i) = q.iter().position(|m| m.src == src && m.tag == tag) {
                return Ok(q.remove(i).buf);
            }
            self.shared.check()?;
            q = mb
                .cv
                .wait_timeout(q, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Shared-memory allreduce in place, copying no rank's input: every rank publishes
    /// where its buffer is; after a barrier, rank r sums chunk r (elements `r·n/P ..
    /// (r+1)·n/P`) of every rank's buffer, in rank order from `T::default()` (the order the
    /// deposit-and-copy version used: same bits), and writes the sum into that chunk of
    /// every buffer; a last barrier keeps each buffer alive until every rank has written.
    /// docs/MEMORY.md: no rank holds a copy of another's input (before, each rank deposited a
    /// full copy: P copies of the model in one process).
    fn native_sum<T>(&self, data: &mut [T]) -> CommResult<()>
    where
        T: Copy + Default + std::ops::AddAssign + Send + Sync + 'static,
    {
        let p = self.shared.size;
        let n = data.len();
        if p == 1 {
            return Ok(());
        }
        let mine = Published::<T> {
            addr: data.as_mut_ptr() as usize,
            len: n,
            _t: std::marker::PhantomData,
        };
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] =
            Some(Arc::new(mine));
        self.barrier()?;
        // Every rank reads the same P slots (a slot is overwritten only by the next native
        // allreduce, which no rank enters before passing one more barrier of this one), so
        // a length or type mismatch is seen by all of them, and all return it, after that
        // barrier, before anyone writes.
        let bufs: CommResult<Vec<usize>> = {
            let s = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            s.iter().map(|x| published::<T>(x, n)).collect()
        };
        let bufs = match bufs {
            Ok(b) => b,
            Err(e) => {
                self.barrier()?;
                return Err(e);
            }
        };
        let (lo, hi) = (n * self.rank / p, n * (self.rank + 1) / p);
        // SAFETY: every address is the start of a live `&mut [T]` of `n` elements, held by
        // its rank inside this call until the barrier below; its owner touches it only
        // through this pointer until then. Rank r reads and writes only elements lo..hi of
        // each buffer, and the ranks' ranges are disjoint, so no element is accessed by two
        // threads. Between the first barrier and the next no rank can fail (every rank is
        // in this call and `sum_chunk` neither allocates nor panics), so no rank returns
        // while another may still write into its buffer.
        unsafe { sum_chunk::<T>(&bufs, lo, hi) };
        self.barrier()
    }
}

/// One rank's native-allreduce buffer, published to the other ranks of the call.
struct Published<T> {
    addr: usize,
    len: usize,
    _t: std::marker::PhantomData<fn() -> T>,
}

/// The address of a published buffer of `n` elements of `T`: another element type or
/// length on another rank is an error (every rank must call the same allreduce).
fn published<T: 'static>(x: &Option<Arc<dyn Any + Send + Sync>>, n: usize) -> CommResult<usize> {
    let x = x.as_ref().ok_or(CommError::PeerFailed)?;
    let v = x.downcast_ref::<Published<T>>().ok_or_else(|| {
        CommError::SizeMismatch("ranks called different native allreduces".into())
    })?;
    if v.len != n {
        return Err(CommError::SizeMismatch(format!(
            "native allreduce of {} values on one rank, {n} on another",
            v.len
        )));
    }
    Ok(v.addr)
}

/// Sums elements `lo..hi` of the buffers at `bufs` (rank order, from `T::default()`) and
/// writes the sum into those elements of every buffer, a block at a time.
///
/// # Safety
/// Every address holds at least `hi` valid elements of `T`, and no other thread touches
/// elements `lo..hi` of any of them during the call.
unsafe fn sum_chunk<T: Copy + Default + std::ops::AddAssign>(bufs: &[usize], lo: usize, hi: usize) {
    const BLOCK: usize = 1024;
    let mut acc = [T::default(); BLOCK];
    let mut at = lo;
    while at < hi {
        let len = BLOCK.min(hi - at);
        let acc = &mut acc[..len];
        acc.fill(T::default());
        for &b in bufs {
            let src = std::slice::from_raw_parts((b as *const T).add(at), len);
            for (a, x) in acc.iter_mut().zip(src) {
                *a += *x;
            }
        }
        for &b in bufs {
            std::slice::from_raw_parts_mut((b as *mut T).add(at), len).copy_from_slice(acc);
        }
        at += len;
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn backend(&self) -> Backend {
        Backend::LOCAL
    }
    fn exchange_raw(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>> {
        self.shared.check()?;
        check_exchange(Backend::LOCAL, self.shared.size, &sends, recvs)?;
        for (d, buf) in sends {
            let mb = &self.shared.boxes[d];
            mb.queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Msg {
                    src: self.rank,
                    tag,
                    buf,
                });
            mb.cv.notify_all();
        }
        recvs
            .iter()
            .map(|&(s, k)| {
                let b = self.take(s, tag)?;
                if b.kind() != k {
                    return Err(CommError::KindMismatch {
                        from: Some(s),
                        expected: k,
                        got: b.kind(),
                    });
                }
                Ok(b)
            })
            .collect()
    }
    fn barrier(&self) -> CommResult<()> {
        let sh = &self.shared;
        let mut g = sh.barrier.lock().unwrap_or_else(|e| e.into_inner());
        let gen = g.1;
        g.0 += 1;
        if g.0 == sh.size {
            g.0 = 0;
            g.1 += 1;
            sh.barrier_cv.notify_all();
            return Ok(());
        }
        while g.1 == gen {
            drop(g);
            sh.check()?;
            g = sh.barrier.lock().unwrap_or_else(|e| e.into_inner());
            if g.1 != gen {
                break;
            }
            g = sh
                .barrier_cv
                .wait_timeout(g, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }
    fn allreduce_native_f32(&self, data: &mut [f32]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 4);
        self.native_sum(data)
    }
    fn allreduce_native_f64(&self, data: &mut [f64]) -> CommResult<()> {
        self.traffic.add_opaque(data.len() * 8);
        self.native_sum(data)
    }
    fn traffic(&self) -> &Traffic {
        &self.traffic
    }
}

fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "rank panicked".into()
    }
}

/// Runs `f` on `p` in-process ranks and returns every rank's result, in rank order.
/// The first rank's error (or panic) is returned; the other ranks' calls are woken and
/// return [`CommError::PeerFailed`], which is not reported when a rank's own error is.
pub fn run_local<R, F>(p: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(&dyn Comm) -> Result<R> + Sync,
{
    assert!(p >= 1, "at least one rank");
    let shared = Arc::new(Shared {
        size: p,
        boxes: (0..p).map(|_| Mailbox::default()).collect(),
        failed: AtomicBool::new(false),
        barrier: Mutex::new((0, 0)),
        barrier_cv: Condvar::new(),
        slots: Mutex::new(vec![None; p]),
    });
    let f = &f;
    let results: Vec<std::result::Result<Result<R>, Box<dyn Any + Send>>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..p)
                .map(|rank| {
                    let shared = shared.clone();
                    std::thread::Builder::new()
                        .name(format!("rank{rank}"))
                        .stack_size(64 << 20)
                        .spawn_scoped(s, move || {
                            let comm = LocalComm {
                                rank,
                                shared: shared.clone(),
                                traffic: Traffic::default(),
                            };
                            let r =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&comm)));
                            if !matches!(r, Ok(Ok(_))) {
                                shared.fail();
                            }
                            r
                        })
                        .expect("spawn rank thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(Err))
                .collect()
        });
    let mut out = Vec::with_capacity(p);
    let mut first_err: Option<anyhow::Error> = None;
    let mut peer_failed = false;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) if crate::is_peer_failure(&e) => peer_failed = true,
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(p) => {
                first_err
                    .get_or_insert(anyhow!("rank {rank} panicked: {}", panic_text(p.as_ref())));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None if peer_failed => Err(anyhow!("a rank failed")),
        None => Ok(out),
    }
}
