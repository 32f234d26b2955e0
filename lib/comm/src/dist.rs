//! Moving tables between the I/O rank and the others: under MPI, rank 0 reads the input,
//! hands each rank its rows ([`Feed`]), and gathers the outputs (docs/ARCHITECTURE.md). Tables travel as Arrow
//! IPC streams. This traffic is charged to the `io` phase, which metrics leave out.

use anyhow::{Context, Result};
use gradkit_core::Table;

use crate::{Buf, Comm, CommExt, Kind};

/// The phase that file-related traffic is charged to.
pub const IO_PHASE: &str = "io";

pub use gradkit_core::cli::Silent;

/// Encodes rows as one Arrow IPC stream.
pub fn encode<T: Table>(rows: &[T]) -> Result<Vec<u8>> {
    let batch = T::to_batch(rows)?;
    let mut out = Vec::new();
    {
        let mut w = arrow_ipc::writer::StreamWriter::try_new(&mut out, &T::schema())?;
        w.write(&batch)?;
        w.finish()?;
    }
    Ok(out)
}

/// Decodes rows written by [`encode`].
pub fn decode<T: Table>(bytes: &[u8]) -> Result<Vec<T>> {
    let r = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    let mut rows = Vec::new();
    for b in r {
        rows.extend(T::from_batch(&b?).context("decoding rows from rank 0")?);
    }
    Ok(rows)
}

/// Gathers every rank's rows on rank 0 (in rank order); other ranks get `None`.
pub fn gather<T: Table>(comm: &dyn Comm, mine: Vec<T>) -> Result<Option<Vec<T>>> {
    if comm.size() == 1 {
        return Ok(Some(mine));
    }
    let _io = comm.phase(IO_PHASE);
    let me = comm.rank();
    if me == 0 {
        let srcs: Vec<_> = (1..comm.size()).map(|s| (s, Kind::U8)).collect();
        let got = comm.exchange(2, vec![], &srcs)?;
        let mut all = mine;
        for b in got {
            let bytes: Vec<u8> = b.into_vec()?;
            all.extend(decode::<T>(&bytes)?);
        }
        Ok(Some(all))
    } else {
        comm.exchange(2, vec![(0, Buf::from_vec(encode(&mine)?))], &[])?;
        Ok(None)
    }
}

/// What the I/O rank hands out in one round of a [`Feed`]: every rank's rows (`R` = one
/// `Vec<T>` per rank on the I/O rank, this rank's `Vec<T>` on the receiving end), the end of
/// the input, or a stop.
#[derive(Debug)]
pub enum Round<R> {
    /// The rows of this round.
    Rows(R),
    /// No more rounds: the input ended.
    End,
    /// The I/O rank stopped early (its input or output failed): every rank leaves its loop
    /// and the I/O rank reports the error at the next agreement point (`World::agree`), so
    /// it is printed once and no rank waits for a round that never comes.
    Stop,
}

/// What the I/O rank's source hands [`Feed::round_from`], piece by piece: rows for one rank
/// (pieces for the same rank are appended in order), then how the round ends.
#[derive(Debug)]
pub enum Piece<T> {
    /// Rows for rank `.0` (rank 0's own are kept).
    Rows(usize, Vec<T>),
    /// The round is complete and checked: every rank gets the rows it was given.
    Done,
    /// No more rounds: the input ended (rows given before it are dropped).
    End,
    /// Stop every rank (see [`Round::Stop`]); rows given before it are dropped.
    Stop,
}

/// The tag of [`Feed`]'s messages: no collective uses it, so a round posted while a rank is
/// still in the previous round's collectives waits for that rank instead of being taken by
/// them.
const FEED_TAG: u32 = 3;
/// Message statuses. Under MPI a round is, to each rank, any number of `ROWS` messages (a
/// status byte, then an Arrow IPC stream ([`encode`])), then one of `DONE`, `END`,
/// `STOP`; in-process, one `ROWS` (its rows in the rank's queue), `END` or `STOP` byte.
const ROWS: u8 = 0;
const END: u8 = 1;
const STOP: u8 = 2;
const DONE: u8 = 3;

/// A scatter in rounds (a trace streamed one step at a time): in every round the I/O rank
/// (rank 0) hands each rank its rows, or tells all that the input ended or that it stopped.
/// Under MPI rank 0 sends rows as its source yields them, one message at a time (each sent
/// before the next piece is asked for: at most one encoded message in flight), charged to
/// the `io` phase, and only the closing `DONE` lets the ranks use them, so a source that
/// fails halfway through a round (a bad rank in the middle of a step) stops every rank at
/// that round; in-process ranks get the rows themselves (no copy) through a queue per rank,
/// and a one-byte message through the communicator says when, so a rank waiting for a round
/// that will never come is woken like any other pending call when a rank fails
/// ([`crate::CommError::PeerFailed`]). Rank 0 cannot get more than one round ahead of a rank
/// as long as each round is followed by a collective.
pub struct Feed<T> {
    /// In-process ranks: the rows handed to each rank and not yet taken.
    queues: Vec<std::sync::Mutex<std::collections::VecDeque<Vec<T>>>>,
}

impl<T: Table> Feed<T> {
    /// A feed for the ranks of one world (make it before `World::run`, which shares it).
    pub fn new(backend: crate::Backend, size: usize) -> Self {
        let queues = if backend.in_process() { size } else { 0 };
        Feed {
            queues: (0..queues).map(|_| Default::default()).collect(),
        }
    }

    /// One round, called by every rank: rank 0 passes `Some` (with `Round::Rows`, one `Vec`
    /// per rank, indexed by rank), every other rank `None`; each gets its own rows, or the
    /// same `End` or `Stop`.
    pub fn round(
        &self,
        comm: &dyn Comm,
        round: Option<Round<Vec<Vec<T>>>>,
    ) -> Result<Round<Vec<T>>> {
        let Some(round) = round else {
            return self.round_from(comm, None);
        };
        let mut pieces: Vec<Piece<T>> = match round {
            Round::Rows(per) => {
                let mut v: Vec<Piece<T>> = per
                    .into_iter()
                    .enumerate()
                    .map(|(d, rows)| Piece::Rows(d, rows))
                    .collect();
                v.push(Piece::Done);
                v
            }
            Round::End => vec![Piece::End],
            Round::Stop => vec![Piece::Stop],
        };
        pieces.reverse();
        let mut next = || pieces.pop().unwrap_or(Piece::Stop);
        self.round_from(comm, Some(&mut next))
    }

    /// One round, called by every rank: rank 0 passes its `source`, which the feed calls
    /// until it says how the round ends ([`Piece::Done`], `End` or `Stop`); every other rank
    /// passes `None`. Each rank gets its own rows (those of every `Piece::Rows` for it, in
    /// order; none: empty), or the same `End` or `Stop`.
    pub fn round_from(
        &self,
        comm: &dyn Comm,
        source: Option<&mut dyn FnMut() -> Piece<T>>,
    ) -> Result<Round<Vec<T>>> {
        let (me, p) = (comm.rank(), comm.size());
        if me != 0 {
            return self.receive(comm);
        }
        let source = source.context("rank 0 hands out the rows")?;
        let _io = (p > 1).then(|| comm.phase(IO_PHASE));
        let local = !self.queues.is_empty();
        let mut per: Vec<Vec<T>> = (0..if local { p } else { 1 }).map(|_| Vec::new()).collect();
        let status = loop {
            match source() {
                Piece::Rows(d, rows) if d == 0 || local => {
                    let to = per
                        .get_mut(d)
                        .context("internal: rows for a rank outside the world")?;
                    to.extend(rows);
                }
                // A status byte, then the rows as an Arrow IPC stream, sent before the next
                // piece is read: rank 0 holds one encoded message (docs/MEMORY.md).
                Piece::Rows(d, rows) => {
                    let mut msg = vec![ROWS];
                    encode_owned_into(rows, &mut msg)?;
                    comm.exchange(FEED_TAG, vec![(d, Buf::from_vec(msg))], &[])?;
                }
                Piece::Done => break DONE,
                Piece::End => break END,
                Piece::Stop => break STOP,
            }
        };
        if p > 1 {
            // The closing byte; in-process ranks find their rows in their queue.
            let mut sends = Vec::with_capacity(p - 1);
            for (d, queue) in self.queues.iter().enumerate().skip(1) {
                if status == DONE {
                    let rows = per.get_mut(d).map(std::mem::take).unwrap_or_default();
                    queue
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(rows);
                }
            }
            for d in 1..p {
                let byte = if local && status == DONE {
                    ROWS
                } else {
                    status
                };
                sends.push((d, Buf::from_vec(vec![byte])));
            }
            comm.exchange(FEED_TAG, sends, &[])?;
        }
        Ok(match status {
            DONE => Round::Rows(std::mem::take(&mut per[0])),
            END => Round::End,
            _ => Round::Stop,
        })
    }

    /// A rank other than 0: the messages of one round, until the one that ends it.
    fn receive(&self, comm: &dyn Comm) -> Result<Round<Vec<T>>> {
        let _io = comm.phase(IO_PHASE);
        let mut rows: Vec<T> = Vec::new();
        loop {
            let msg: Vec<u8> = comm
                .exchange(FEED_TAG, vec![], &[(0, Kind::U8)])?
                .into_iter()
                .next()
                .context("no message from rank 0")?
                .into_vec()?;
            match msg.first() {
                Some(&ROWS) if !self.queues.is_empty() => {
                    return self.queues[comm.rank()]
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .pop_front()
                        .map(Round::Rows)
                        .context("internal: a round without rows for this rank");
                }
                Some(&ROWS) => rows.extend(decode::<T>(&msg[1..])?),
                Some(&DONE) => return Ok(Round::Rows(rows)),
                Some(&END) => return Ok(Round::End),
                Some(&STOP) => return Ok(Round::Stop),
                _ => anyhow::bail!("internal: a message from rank 0 that is not a round"),
            }
        }
    }
}

/// [`encode`] of rows it consumes, appended to `out`: one batch per row, each row's buffers
/// moving into its batch (no copy besides the stream's) and dropped once written, so the rows
/// and their encoding are held about once. [`decode`] reads any number of batches.
fn encode_owned_into<T: Table>(rows: Vec<T>, out: &mut Vec<u8>) -> Result<()> {
    let mut w = arrow_ipc::writer::StreamWriter::try_new(out, &T::schema())?;
    if rows.is_empty() {
        w.write(&T::to_batch(&[])?)?;
    }
    for r in rows {
        w.write(&T::into_batch(vec![r])?)?;
    }
    w.finish()?;
    Ok(())
}
