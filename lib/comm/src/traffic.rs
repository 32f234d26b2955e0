//! Exact traffic accounting: bytes and messages sent and received per rank, per phase.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

/// Counts of one phase on one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseCounts {
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub msgs_sent: u64,
    pub msgs_recv: u64,
    /// Wall time spent inside the phase (summed over entries).
    pub seconds: f64,
}

impl PhaseCounts {
    pub fn add(&mut self, o: &PhaseCounts) {
        self.bytes_sent += o.bytes_sent;
        self.bytes_recv += o.bytes_recv;
        self.msgs_sent += o.msgs_sent;
        self.msgs_recv += o.msgs_recv;
        self.seconds += o.seconds;
    }
}

/// The counters of one rank. A rank is driven by one thread, so interior mutability is a
/// `RefCell`; the counters travel with the communicator.
#[derive(Debug)]
pub struct Traffic {
    pub(crate) phase: RefCell<String>,
    map: RefCell<BTreeMap<String, PhaseCounts>>,
    /// The message recorder ([`crate::record`]) and its rank, when on.
    pub(crate) rec: RefCell<Option<(u32, crate::record::Recorder)>>,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            phase: RefCell::new("default".into()),
            map: RefCell::new(BTreeMap::new()),
            rec: RefCell::new(None),
        }
    }
}

/// Restores the previous phase and charges the elapsed time when dropped.
pub struct PhaseGuard<'a> {
    t: &'a Traffic,
    prev: String,
    start: Instant,
}

impl Drop for PhaseGuard<'_> {
    fn drop(&mut self) {
        let cur = self.t.phase.borrow().clone();
        self.t.map.borrow_mut().entry(cur).or_default().seconds +=
            self.start.elapsed().as_secs_f64();
        *self.t.phase.borrow_mut() = std::mem::take(&mut self.prev);
    }
}

impl Traffic {
    pub fn enter(&self, name: &str) -> PhaseGuard<'_> {
        let prev = self.phase.replace(name.to_string());
        self.map.borrow_mut().entry(name.to_string()).or_default();
        PhaseGuard {
            t: self,
            prev,
            start: Instant::now(),
        }
    }
    pub fn add_sent(&self, bytes: usize) {
        let p = self.phase.borrow().clone();
        let mut m = self.map.borrow_mut();
        let c = m.entry(p).or_default();
        c.bytes_sent += bytes as u64;
        c.msgs_sent += 1;
    }
    pub fn add_recv(&self, bytes: usize) {
        let p = self.phase.borrow().clone();
        let mut m = self.map.borrow_mut();
        let c = m.entry(p).or_default();
        c.bytes_recv += bytes as u64;
        c.msgs_recv += 1;
    }
    /// Adds counts that the backend reports for an opaque operation (native allreduce).
    pub fn add_opaque(&self, bytes: usize) {
        self.record_opaque(bytes);
        let p = self.phase.borrow().clone();
        let mut m = self.map.borrow_mut();
        let c = m.entry(p).or_default();
        c.bytes_sent += bytes as u64;
        c.bytes_recv += bytes as u64;
    }
    /// Per-phase counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, PhaseCounts> {
        self.map.borrow().clone()
    }
    /// Sum over phases, leaving out `io` (scatter/gather of the tool's input and output).
    pub fn total(&self) -> PhaseCounts {
        let mut t = PhaseCounts::default();
        for (k, v) in self.map.borrow().iter() {
            if k != crate::dist::IO_PHASE {
                t.add(v);
            }
        }
        t
    }
    /// Forgets every count (keeps the current phase).
    pub fn reset(&self) {
        self.map.borrow_mut().clear();
    }
}
