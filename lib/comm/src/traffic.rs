//! Exact traffic accounting: bytes and messages sent and received per rank, per phase.

use std::cell::{Cell, RefCell};
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
    /// What of the messages sent now does not grow with the model's size ([`Fixed`]).
    pub(crate) fixed: Cell<Fixed>,
}

/// What part of a message's bytes does not grow with the model's size, for a replay that
/// scales a recording to another size (commtrace/1's `fixed_bytes`, docs/SIMULATE.md):
/// control messages (counts, thresholds, boundaries: [`Fixed::All`]), a header and the
/// padding of 1-bit's chunks ([`Fixed::Share`]). Set by the algorithms around their
/// exchanges ([`crate::CommExt::fixed`]); the counters do not change.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Fixed {
    /// Every byte is payload: it grows with n (or with k = density · n).
    #[default]
    None,
    /// Every byte is control.
    All,
    /// `header` bytes of each message, and the fraction `padding` of the rest, are fixed.
    Share { header: u64, padding: f64 },
}

impl Fixed {
    /// The fixed bytes of a message of `bytes` bytes.
    pub fn of(self, bytes: u64) -> u64 {
        match self {
            Fixed::None => 0,
            Fixed::All => bytes,
            Fixed::Share { header, padding } => {
                let h = header.min(bytes);
                h + ((bytes - h) as f64 * padding.clamp(0.0, 1.0)).round() as u64
            }
        }
    }
}

/// Restores the previous [`Fixed`] rule when dropped.
pub struct FixedGuard<'a> {
    t: &'a Traffic,
    prev: Fixed,
}

impl Drop for FixedGuard<'_> {
    fn drop(&mut self) {
        self.t.fixed.set(self.prev);
    }
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            phase: RefCell::new("default".into()),
            map: RefCell::new(BTreeMap::new()),
            rec: RefCell::new(None),
            fixed: Cell::new(Fixed::None),
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
    /// Marks what of the messages sent until the guard drops does not grow with the model's
    /// size ([`Fixed`]); nested guards restore the outer rule.
    pub fn fixed(&self, rule: Fixed) -> FixedGuard<'_> {
        FixedGuard {
            t: self,
            prev: self.fixed.replace(rule),
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
