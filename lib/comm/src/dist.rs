//! Moving tables between the I/O rank and the others: under MPI, rank 0 reads the input,
//! scatters each rank its rows, and gathers the outputs (DESIGN §3). Tables travel as Arrow
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

/// This rank's rows of a table held by the I/O rank (`owner` says which rank a row goes to).
/// In-process ranks share memory and just filter; otherwise rank 0 sends each rank its rows.
pub fn scatter<T: Table + Clone>(
    comm: &dyn Comm,
    all: Option<&[T]>,
    owner: impl Fn(&T) -> usize,
) -> Result<Vec<T>> {
    let me = comm.rank();
    if comm.backend().in_process() || comm.size() == 1 {
        let all = all.context("input table missing on a local rank")?;
        return Ok(all.iter().filter(|r| owner(r) == me).cloned().collect());
    }
    let _io = comm.phase(IO_PHASE);
    if me == 0 {
        let all = all.context("rank 0 holds the input")?;
        let p = comm.size();
        let mut per: Vec<Vec<T>> = (0..p).map(|_| Vec::new()).collect();
        for r in all {
            per[owner(r) % p].push(r.clone());
        }
        let mine = std::mem::take(&mut per[0]);
        let sends = per
            .iter()
            .enumerate()
            .skip(1)
            .map(|(d, rows)| Ok((d, Buf::from_vec(encode(rows)?))))
            .collect::<Result<Vec<_>>>()?;
        comm.exchange(1, sends, &[])?;
        Ok(mine)
    } else {
        let b = comm.exchange(1, vec![], &[(0, Kind::U8)])?;
        let bytes: Vec<u8> = b
            .into_iter()
            .next()
            .context("no rows from rank 0")?
            .into_vec()?;
        decode(&bytes)
    }
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

/// The tag of [`Feed`]'s messages: no collective uses it, so a round posted while a rank is
/// still in the previous round's collectives waits for that rank instead of being taken by
/// them.
const FEED_TAG: u32 = 3;
const ROWS: u8 = 0;
const END: u8 = 1;
const STOP: u8 = 2;

/// A scatter in rounds (a trace streamed one step at a time): in every round the I/O rank
/// (rank 0) hands each rank its rows, or tells all that the input ended or that it stopped.
/// Under MPI each rank's rows travel as one message (a status byte, then an Arrow IPC stream
/// like [`scatter`]'s), charged to the `io` phase; in-process ranks get the rows themselves
/// (no copy) through a queue per rank, and a one-byte message through the communicator says
/// when, so a rank waiting for a round that will never come is woken like any other pending
/// call when a rank fails ([`crate::CommError::PeerFailed`]). Rank 0 cannot get more than one
/// round ahead of a rank as long as each round is followed by a collective.
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
        let (me, p) = (comm.rank(), comm.size());
        if me == 0 {
            let round = round.context("rank 0 hands out the rows")?;
            let (status, mut per) = match round {
                Round::Rows(per) => (ROWS, per),
                Round::End => (END, Vec::new()),
                Round::Stop => (STOP, Vec::new()),
            };
            if status == ROWS {
                per.resize_with(p, Vec::new);
            }
            let mine = (status == ROWS).then(|| std::mem::take(&mut per[0]));
            if p > 1 {
                let _io = comm.phase(IO_PHASE);
                let mut sends = Vec::with_capacity(p - 1);
                for d in 1..p {
                    let rows = per.get_mut(d).map(std::mem::take);
                    let msg = match rows {
                        Some(rows) if !self.queues.is_empty() => {
                            self.queues[d]
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push_back(rows);
                            vec![status]
                        }
                        // A status byte, then the rows as an Arrow IPC stream. Sent at once,
                        // one rank after the other, so that rank 0 holds the step's rows not
                        // yet sent and one encoded message, not every rank's message
                        // (docs/MEMORY.md, issue 19).
                        Some(rows) => {
                            let mut msg = vec![status];
                            encode_owned_into(rows, &mut msg)?;
                            comm.exchange(FEED_TAG, vec![(d, Buf::from_vec(msg))], &[])?;
                            continue;
                        }
                        None => vec![status],
                    };
                    sends.push((d, Buf::from_vec(msg)));
                }
                if !sends.is_empty() {
                    comm.exchange(FEED_TAG, sends, &[])?;
                }
            }
            return Ok(match (status, mine) {
                (ROWS, Some(rows)) => Round::Rows(rows),
                (END, _) => Round::End,
                _ => Round::Stop,
            });
        }
        let _io = comm.phase(IO_PHASE);
        let msg: Vec<u8> = comm
            .exchange(FEED_TAG, vec![], &[(0, Kind::U8)])?
            .into_iter()
            .next()
            .context("no message from rank 0")?
            .into_vec()?;
        match msg.first() {
            Some(&ROWS) if !self.queues.is_empty() => self.queues[me]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
                .map(Round::Rows)
                .context("internal: a round without rows for this rank"),
            Some(&ROWS) => Ok(Round::Rows(decode(&msg[1..])?)),
            Some(&END) => Ok(Round::End),
            Some(&STOP) => Ok(Round::Stop),
            _ => anyhow::bail!("internal: a message from rank 0 that is not a round"),
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
