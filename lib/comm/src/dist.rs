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
