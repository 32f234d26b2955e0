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

    /// Generic shared-memory allreduce: deposit, each rank sums its chunk, gather chunks.
    fn native_sum<T>(&self, data: &mut [T]) -> CommResult<()>
    where
        T: Copy + Default + std::ops::AddAssign + Send + Sync + 'static,
    {
        let p = self.shared.size;
        let n = data.len();
        if p == 1 {
            return Ok(());
        }
        let mine: Arc<Vec<T>> = Arc::new(data.to_vec());
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = Some(mine);
        self.barrier()?;
        let all: Vec<Arc<Vec<T>>> = {
            let s = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            s.iter()
                .map(|x| slot_vec::<T>(x, n))
                .collect::<CommResult<_>>()?
        };
        self.barrier()?;
        let (lo, hi) = (n * self.rank / p, n * (self.rank + 1) / p);
        let mut chunk = vec![T::default(); hi - lo];
        for v in &all {
            for (c, x) in chunk.iter_mut().zip(&v[lo..hi]) {
                *c += *x;
            }
        }
        drop(all);
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] =
            Some(Arc::new(chunk));
        self.barrier()?;
        {
            let s = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
            for (q, x) in s.iter().enumerate() {
                let (lo, hi) = (n * q / p, n * (q + 1) / p);
                let c = slot_vec::<T>(x, hi - lo)?;
                data[lo..hi].copy_from_slice(&c);
            }
        }
        self.barrier()
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

/// A native allreduce slot as a `Vec<T>` of `n` elements: another element type or length
/// on another rank is an error (every rank must call the same allreduce).
fn slot_vec<T: Send + Sync + 'static>(
    x: &Option<Arc<dyn Any + Send + Sync>>,
    n: usize,
) -> CommResult<Arc<Vec<T>>> {
    let v = x
        .clone()
        .ok_or(CommError::PeerFailed)?
        .downcast::<Vec<T>>()
        .map_err(|_| CommError::SizeMismatch("ranks called different native allreduces".into()))?;
    if v.len() != n {
        return Err(CommError::SizeMismatch(format!(
            "native allreduce of {} values on one rank, {n} on another",
            v.len()
        )));
    }
    Ok(v)
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
