//! The communication recorder: every point-to-point message a rank sends and receives, and
//! the compute intervals between its communication calls, as `commtrace/1` rows
//! ([`gradkit_core::CommRow`], docs/FORMAT.md). It hooks the one place every message passes
//! ([`crate::Comm::exchange`], beside the traffic counters) and the backends' opaque
//! allreduce, so every algorithm on every backend is recorded by the same code, and the
//! recorded bytes are the counted bytes.
//!
//! A tool turns it on per rank ([`Traffic::start_recording`]) and brackets each step with
//! [`Traffic::begin_step`] / [`Traffic::end_step`]; only calls inside a step are recorded
//! (the scatter of the tool's input and the gather of its output happen between steps).
//! [`gather_recording`] brings every rank's rows to rank 0, which writes them
//! ([`gradkit_core::write_comm_trace`]).

use std::collections::HashMap;
use std::time::Instant;

use gradkit_core::{CommRow, EventKind};

use crate::{Comm, CommError, CommResult, Elem, Kind, Traffic};

/// One rank's recording state.
#[derive(Debug)]
pub(crate) struct Recorder {
    origin: Instant,
    /// The open step and its label.
    step: Option<(u32, String)>,
    rows: Vec<CommRow>,
    /// Steps opened so far.
    begun: u32,
    event: u64,
    call: u64,
    /// End of the last call (or the start of the step), seconds since `origin`.
    last: f64,
    /// Messages sent to / received from (peer, tag) so far: the rows' `seq`.
    sent: HashMap<(u32, u32), u64>,
    recvd: HashMap<(u32, u32), u64>,
}

impl Recorder {
    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }
    /// Adds an event of the open step (none: nothing); `what` is (kind, peer, tag, seq,
    /// bytes, fixed bytes).
    fn push(
        &mut self,
        rank: u32,
        what: (EventKind, u32, u32, u64, u64, u64),
        phase: &str,
        span: (f64, f64),
    ) {
        let (kind, peer, tag, seq, bytes, fixed_bytes) = what;
        let Some((step, label)) = &self.step else {
            return;
        };
        self.rows.push(CommRow {
            step: *step,
            rank,
            event: self.event,
            call: self.call,
            kind,
            peer,
            tag,
            seq,
            bytes,
            fixed_bytes,
            phase: phase.to_string(),
            label: label.clone(),
            start_s: span.0,
            end_s: span.1,
        });
        self.event += 1;
    }
    /// The interval since the last call, as compute, when a step is open.
    fn compute_until(&mut self, rank: u32, t: f64, phase: &str) {
        if self.step.is_some() && t > self.last {
            let span = (self.last, t);
            self.push(rank, (EventKind::Compute, rank, 0, 0, 0, 0), phase, span);
            self.call += 1;
        }
        self.last = t;
    }
    fn close_step(&mut self, rank: u32, phase: &str) {
        if self.step.is_some() {
            let t = self.now();
            self.compute_until(rank, t, phase);
            self.step = None;
        }
    }
}

/// The rank a recorder's rows carry is set at [`Traffic::start_recording`].
impl Traffic {
    /// Starts recording this rank's messages (rank `rank`); times count from now.
    pub fn start_recording(&self, rank: usize) {
        *self.rec.borrow_mut() = Some((
            rank as u32,
            Recorder {
                origin: Instant::now(),
                step: None,
                rows: Vec::new(),
                begun: 0,
                event: 0,
                call: 0,
                last: 0.0,
                sent: HashMap::new(),
                recvd: HashMap::new(),
            },
        ));
    }
    /// Opens step `step` (closing an open one): the calls until [`Traffic::end_step`] are
    /// recorded under it, with `label` saying what ran. Nothing when not recording.
    pub fn begin_step(&self, step: u32, label: &str) {
        let phase = self.phase.borrow().clone();
        if let Some((rank, r)) = self.rec.borrow_mut().as_mut() {
            r.close_step(*rank, &phase);
            r.step = Some((step, label.to_string()));
            r.begun += 1;
            r.event = 0;
            r.call = 0;
            r.last = r.now();
        }
    }
    /// How many steps [`Traffic::begin_step`] opened so far: the next step's number for a
    /// tool that numbers its recorded calls in order (bench).
    pub fn steps_recorded(&self) -> u32 {
        self.rec.borrow().as_ref().map_or(0, |(_, r)| r.begun)
    }
    /// Closes the open step: the time since its last call is its last compute interval.
    pub fn end_step(&self) {
        let phase = self.phase.borrow().clone();
        if let Some((rank, r)) = self.rec.borrow_mut().as_mut() {
            r.close_step(*rank, &phase);
        }
    }
    /// Stops recording and returns the rows (empty when it was not recording).
    pub fn take_recording(&self) -> Vec<CommRow> {
        self.end_step();
        self.rec
            .borrow_mut()
            .take()
            .map(|(_, r)| r.rows)
            .unwrap_or_default()
    }
    /// When recording: the instant a call starts (seconds since the origin).
    pub(crate) fn call_start(&self) -> Option<f64> {
        self.rec.borrow().as_ref().map(|(_, r)| r.now())
    }
    /// Records one call of [`crate::Comm::exchange`] that started at `t0`: its messages to
    /// and from other ranks, `(peer, bytes)`, with the time before it as compute.
    pub(crate) fn record_call(
        &self,
        t0: f64,
        tag: u32,
        sends: &[(usize, usize)],
        recvs: &[(usize, usize)],
    ) {
        let phase = self.phase.borrow().clone();
        let fixed = self.fixed.get();
        let mut rec = self.rec.borrow_mut();
        let Some((rank, r)) = rec.as_mut() else {
            return;
        };
        let rank = *rank;
        r.compute_until(rank, t0, &phase);
        let span = (t0, r.now());
        for &(peer, bytes) in sends {
            let n = r.sent.entry((peer as u32, tag)).or_default();
            let seq = *n;
            *n += 1;
            r.push(
                rank,
                (
                    EventKind::Send,
                    peer as u32,
                    tag,
                    seq,
                    bytes as u64,
                    fixed.of(bytes as u64),
                ),
                &phase,
                span,
            );
        }
        for &(peer, bytes) in recvs {
            let n = r.recvd.entry((peer as u32, tag)).or_default();
            let seq = *n;
            *n += 1;
            r.push(
                rank,
                (
                    EventKind::Recv,
                    peer as u32,
                    tag,
                    seq,
                    bytes as u64,
                    fixed.of(bytes as u64),
                ),
                &phase,
                span,
            );
        }
        r.last = span.1;
        if r.step.is_some() {
            r.call += 1;
        }
    }
    /// Records the backend's own allreduce of `bytes` bytes, starting now.
    pub(crate) fn record_opaque(&self, bytes: usize) {
        let phase = self.phase.borrow().clone();
        let mut rec = self.rec.borrow_mut();
        if let Some((rank, r)) = rec.as_mut() {
            let rank = *rank;
            let t = r.now();
            r.compute_until(rank, t, &phase);
            r.push(
                rank,
                (
                    EventKind::Allreduce,
                    rank,
                    0,
                    0,
                    bytes as u64,
                    self.fixed.get().of(bytes as u64),
                ),
                &phase,
                (t, t),
            );
            if r.step.is_some() {
                r.call += 1;
            }
        }
    }
}

/// Every rank calls this: stops its recording and sends its rows to rank 0 (in the `io`
/// phase, which the counters' totals leave out), which gets every rank's rows in rank order;
/// the other ranks get None.
pub fn gather_recording(comm: &dyn Comm) -> CommResult<Option<Vec<CommRow>>> {
    let mine = comm.traffic().take_recording();
    let (p, r) = (comm.size(), comm.rank());
    let _io = comm.traffic().enter(crate::dist::IO_PHASE);
    if r != 0 {
        comm.exchange(0, vec![(0, crate::Buf::from_vec(encode(&mine)))], &[])?;
        return Ok(None);
    }
    let srcs: Vec<(usize, Kind)> = (1..p).map(|q| (q, Kind::U8)).collect();
    let got = comm.exchange(0, vec![], &srcs)?;
    let mut all = mine;
    for b in got {
        let bytes = u8::try_unwrap(b)?;
        all.extend(decode(&bytes).ok_or_else(|| CommError::Transport {
            backend: "comm",
            message: "a rank's recording arrived damaged".into(),
        })?);
    }
    Ok(Some(all))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn encode(rows: &[CommRow]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 96);
    for r in rows {
        for v in [r.step, r.rank, r.peer, r.tag] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [r.event, r.call, r.seq, r.bytes, r.fixed_bytes] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [r.start_s, r.end_s] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put_str(&mut out, r.kind.name());
        put_str(&mut out, &r.phase);
        put_str(&mut out, &r.label);
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (a, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*a)
    }
    fn str(&mut self) -> Option<String> {
        let n = u32::from_le_bytes(self.take()?) as usize;
        if self.0.len() < n {
            return None;
        }
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        String::from_utf8(s.to_vec()).ok()
    }
}

fn decode(bytes: &[u8]) -> Option<Vec<CommRow>> {
    let mut rd = Reader(bytes);
    let mut rows = Vec::new();
    while !rd.0.is_empty() {
        let mut u32s = [0u32; 4];
        for v in &mut u32s {
            *v = u32::from_le_bytes(rd.take()?);
        }
        let mut u64s = [0u64; 5];
        for v in &mut u64s {
            *v = u64::from_le_bytes(rd.take()?);
        }
        let start_s = f64::from_le_bytes(rd.take()?);
        let end_s = f64::from_le_bytes(rd.take()?);
        let kind = EventKind::parse(&rd.str()?)?;
        rows.push(CommRow {
            step: u32s[0],
            rank: u32s[1],
            peer: u32s[2],
            tag: u32s[3],
            event: u64s[0],
            call: u64s[1],
            seq: u64s[2],
            bytes: u64s[3],
            fixed_bytes: u64s[4],
            kind,
            phase: rd.str()?,
            label: rd.str()?,
            start_s,
            end_s,
        });
    }
    Some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        let rows = vec![CommRow {
            step: 3,
            rank: 1,
            event: 7,
            call: 2,
            kind: EventKind::Recv,
            peer: 0,
            tag: 5,
            seq: 9,
            bytes: 4096,
            fixed_bytes: 96,
            phase: "reduce-scatter".into(),
            label: "ring".into(),
            start_s: 0.25,
            end_s: 0.5,
        }];
        assert_eq!(decode(&encode(&rows)), Some(rows));
        assert_eq!(decode(&[1, 2, 3]), None);
    }
}
