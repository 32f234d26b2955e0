//! EmbRace's horizontal (block-level) scheduling, embrace.md §2.1 (mechanism: §5.1), as used by
//! `--schedule 2d` ([`crate::embrace`]): one communication thread serves a non-preemptive
//! priority queue of communication operations; every operation's priority is its place in
//! the next forward pass (FP order), so the blocks the next FP needs first travel first.
//!
//! The order within one iteration (embrace.md §2.1, "priority order"):
//! prior embedding-gradient rows → the embedding's data AlltoAll of the next FP → the dense
//! blocks in FP order (embedding-level dense parameters, block 1 … L, final LN + head) →
//! delayed embedding-gradient rows. The next FP runs the embedding first (it reads only the
//! prior rows) and each block waits only for its own block's allreduce and update ([`Ready`]).
//!
//! Every rank must issue its collectives in the same order. The key of an operation is
//! (step, class): operations of an earlier step always go first, and the operations of one
//! step are pushed together ([`PriorityQueue::push_all`]), so the order the queue yields
//! depends only on what was pushed, never on timing: every rank pops the same sequence.
//! (The paper's hooks push each block as BP produces it; candle runs one fused backward, so
//! here every block of a step becomes ready at once, at the end of BP.)

use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// The kind of a communication operation and its priority within a step (smaller first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Embedding-gradient rows the next FP reads (embrace.md Algorithm 1).
    PriorGrad,
    /// The next FP's embedding data AlltoAll (it reads the prior rows just applied).
    Lookup,
    /// Dense block `k` in FP order.
    Dense(usize),
    /// Embedding-gradient rows the next FP does not read.
    DelayedGrad,
}

impl Class {
    /// Priority within a step: prior 0, lookup 1, dense block k 2 + k, delayed last.
    pub fn rank(self) -> u32 {
        match self {
            Class::PriorGrad => 0,
            Class::Lookup => 1,
            Class::Dense(k) => 2u32.saturating_add(k as u32).min(u32::MAX - 1),
            Class::DelayedGrad => u32::MAX,
        }
    }
}

/// The queue key of an operation of `step` (smaller is served first).
pub fn key(step: u32, class: Class) -> u64 {
    ((step as u64) << 32) | class.rank() as u64
}

struct Entry<T> {
    key: u64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.key, self.seq) == (o.key, o.seq)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Entry<T> {
    /// Reversed: `BinaryHeap` is a max-heap and the smallest (key, push order) goes first.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.key, o.seq).cmp(&(self.key, self.seq))
    }
}

struct Inner<T> {
    heap: BinaryHeap<Entry<T>>,
    seq: u64,
    closed: bool,
}

/// A non-preemptive priority queue shared by the threads that push operations and the
/// communication thread that runs them (Mutex + Condvar): smallest key first, push order
/// among equal keys.
pub struct PriorityQueue<T> {
    inner: Mutex<Inner<T>>,
    cv: Condvar,
}

impl<T> Default for PriorityQueue<T> {
    fn default() -> Self {
        PriorityQueue {
            inner: Mutex::new(Inner {
                heap: BinaryHeap::new(),
                seq: 0,
                closed: false,
            }),
            cv: Condvar::new(),
        }
    }
}

impl<T> PriorityQueue<T> {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pushes one operation.
    pub fn push(&self, key: u64, item: T) {
        self.push_all([(key, item)]);
    }

    /// Pushes several operations atomically: no pop sees only some of them.
    pub fn push_all(&self, items: impl IntoIterator<Item = (u64, T)>) {
        let mut g = self.lock();
        for (key, item) in items {
            let seq = g.seq;
            g.seq += 1;
            g.heap.push(Entry { key, seq, item });
        }
        drop(g);
        self.cv.notify_all();
    }

    /// The first operation, if any, without waiting.
    pub fn try_pop(&self) -> Option<T> {
        self.lock().heap.pop().map(|e| e.item)
    }

    /// The first operation, waiting for one; `None` once the queue is closed and empty.
    pub fn pop(&self) -> Option<T> {
        let mut g = self.lock();
        loop {
            if let Some(e) = g.heap.pop() {
                return Some(e.item);
            }
            if g.closed {
                return None;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// No more pushes: [`PriorityQueue::pop`] returns `None` once the queue is empty.
    pub fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }

    pub fn len(&self) -> usize {
        self.lock().heap.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Completion flags the forward pass waits on, set by the communication thread: slot `k` is
/// set when operation `k` (a block's allreduce and update, the lookup) has finished. A
/// failed communication thread [`Ready::fail`]s, so no waiter hangs.
pub struct Ready {
    state: Mutex<(Vec<bool>, Option<String>)>,
    cv: Condvar,
}

impl Ready {
    pub fn new(slots: usize) -> Self {
        Ready {
            state: Mutex::new((vec![false; slots], None)),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (Vec<bool>, Option<String>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks slot `k` done.
    pub fn set(&self, k: usize) {
        if let Some(s) = self.lock().0.get_mut(k) {
            *s = true;
        }
        self.cv.notify_all();
    }

    /// Wakes every waiter with an error.
    pub fn fail(&self, why: &str) {
        self.lock().1 = Some(why.to_string());
        self.cv.notify_all();
    }

    pub fn is_set(&self, k: usize) -> bool {
        self.lock().0.get(k).copied().unwrap_or(false)
    }

    /// Waits until slot `k` is done; returns how long it waited.
    pub fn wait(&self, k: usize) -> Result<Duration> {
        let t = Instant::now();
        let mut g = self.lock();
        if k >= g.0.len() {
            bail!("no completion slot {k} (of {})", g.0.len());
        }
        loop {
            if g.0[k] {
                return Ok(t.elapsed());
            }
            if let Some(why) = &g.1 {
                bail!("communication thread failed: {why}");
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The dense parameter groups ("blocks", embrace.md §2.1) in FP order, as indices into
/// `names` (the layout's layer names), leaving out the sharded embedding `skip`: group 0 the
/// embedding-level layers (`wpe`, other `wte*`/`emb*`), groups 1 … L the transformer blocks
/// `h0.` … `h{L-1}.`, and the last group everything else (final LN, head, an LSTM). The
/// model calls its stage hook `k` before group `k` is read ([`crate::model::Model`]).
pub fn fp_groups(names: &[String], skip: usize) -> Vec<(String, Vec<usize>)> {
    let block = |n: &str| -> Option<usize> {
        let rest = n.strip_prefix('h')?;
        let (num, _) = rest.split_once('.')?;
        num.parse().ok()
    };
    let blocks = names
        .iter()
        .filter_map(|n| block(n))
        .max()
        .map_or(0, |m| m + 1);
    let mut groups: Vec<(String, Vec<usize>)> = Vec::with_capacity(blocks + 2);
    groups.push(("emb".into(), Vec::new()));
    groups.extend((0..blocks).map(|i| (format!("h{i}"), Vec::new())));
    groups.push(("head".into(), Vec::new()));
    for (i, n) in names.iter().enumerate() {
        if i == skip {
            continue;
        }
        let g = if n.starts_with("wte") || n.starts_with("wpe") || n.starts_with("emb") {
            0
        } else if let Some(b) = block(n) {
            1 + b
        } else {
            blocks + 1
        };
        groups[g].1.push(i);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_step_pops_in_embrace_priority_order_whatever_the_push_order() {
        let q = PriorityQueue::new();
        // Pushed in gradient-generation (BP) order: head, blocks backwards, embedding.
        let ops = [
            Class::DelayedGrad,
            Class::Dense(3),
            Class::Dense(2),
            Class::Dense(1),
            Class::Dense(0),
            Class::PriorGrad,
            Class::Lookup,
        ];
        q.push_all(ops.iter().map(|&c| (key(5, c), c)));
        let got: Vec<Class> = std::iter::from_fn(|| q.try_pop()).collect();
        let want = vec![
            Class::PriorGrad,
            Class::Lookup,
            Class::Dense(0),
            Class::Dense(1),
            Class::Dense(2),
            Class::Dense(3),
            Class::DelayedGrad,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn an_earlier_step_goes_first_and_equal_keys_keep_push_order() {
        let q = PriorityQueue::new();
        q.push(key(2, Class::PriorGrad), "s2-prior");
        q.push(key(1, Class::DelayedGrad), "s1-delayed-a");
        q.push(key(1, Class::DelayedGrad), "s1-delayed-b");
        q.push(key(1, Class::Dense(0)), "s1-dense0");
        let got: Vec<&str> = std::iter::from_fn(|| q.try_pop()).collect();
        assert_eq!(
            got,
            ["s1-dense0", "s1-delayed-a", "s1-delayed-b", "s2-prior"]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn a_communication_thread_serves_pushes_from_another_thread_then_stops_on_close() {
        let q = Arc::new(PriorityQueue::new());
        let q2 = q.clone();
        let server =
            std::thread::spawn(move || std::iter::from_fn(|| q2.pop()).collect::<Vec<u64>>());
        for step in 0..3u32 {
            q.push_all(
                (0..4)
                    .rev()
                    .map(|k| (key(step, Class::Dense(k)), (step * 10 + k as u32) as u64)),
            );
        }
        q.close();
        let got = server.join().unwrap();
        // Batches pushed atomically, each served in FP order, steps in order.
        let want: Vec<u64> = (0..3)
            .flat_map(|s| (0..4).map(move |k| s * 10 + k))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn ready_wakes_a_waiter_and_reports_failure() {
        let r = Arc::new(Ready::new(3));
        let r2 = r.clone();
        let h = std::thread::spawn(move || r2.wait(2).map(|_| r2.is_set(1)));
        r.set(1);
        r.set(2);
        assert!(h.join().unwrap().unwrap());
        assert!(!r.is_set(0));
        let r3 = r.clone();
        let h = std::thread::spawn(move || r3.wait(0));
        r.fail("allreduce of h0 failed");
        let e = h.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("allreduce of h0 failed"), "{e}");
        assert!(r.wait(7).is_err());
    }

    #[test]
    fn groups_follow_the_forward_pass() {
        // The layout's sorted names: h10 sorts before h2, the head before the final LN.
        let mut names: Vec<String> = ["wte.weight", "wpe.weight", "lnf.weight", "lnf.bias"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for i in 0..12 {
            names.push(format!("h{i}.attn_qkv.weight"));
            names.push(format!("h{i}.ln1.bias"));
        }
        names.push("lm_head.weight".into());
        names.sort();
        let skip = names.iter().position(|n| n == "wte.weight").unwrap();
        let g = fp_groups(&names, skip);
        assert_eq!(g.len(), 14);
        let named = |k: usize| -> Vec<&str> { g[k].1.iter().map(|&i| names[i].as_str()).collect() };
        assert_eq!(named(0), ["wpe.weight"]);
        assert_eq!(g[3].0, "h2");
        assert_eq!(named(3), ["h2.attn_qkv.weight", "h2.ln1.bias"]);
        assert_eq!(named(13), ["lm_head.weight", "lnf.bias", "lnf.weight"]);
        // Every layer but the sharded embedding is in exactly one group.
        let mut all: Vec<usize> = g.iter().flat_map(|x| x.1.clone()).collect();
        all.sort();
        let want: Vec<usize> = (0..names.len()).filter(|&i| i != skip).collect();
        assert_eq!(all, want);
        // An LSTM LM: the embedding level is empty, everything else is the last group.
        let lstm: Vec<String> = ["emb.weight", "lm_head.bias", "lstm.w_ih"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let g = fp_groups(&lstm, 0);
        assert_eq!(g.len(), 2);
        assert!(g[0].1.is_empty());
        assert_eq!(g[1].1, [1, 2]);
    }
}
