//! `--state FILE`: the 1-bit reducers' worker and server error buffers, kept across runs.
//!
//! The reducer does no I/O: it hands its state out and takes it back as named values
//! (`Reducer::state` / `Reducer::load_state`). This module owns the file: the I/O rank
//! checks it (when it exists) before any rank starts ([`StateFile::open`]), then reads it one
//! buffer at a time as the feed's first round hands each rank its buffers (`dist::Feed`, the
//! `io` phase; [`StateReader::piece`]), and after the last step every rank's buffers go to
//! the I/O rank, which writes the file atomically as they arrive ([`save_gathered`]). The I/O
//! rank never holds every rank's buffers (docs/MEMORY.md).

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use gradkit_collectives::onebit::{OneBitState, Variant, SERVER_ERROR, WORKER_ERROR};
use gradkit_comm::{dist, Buf, Comm, CommExt, Kind};
use gradkit_core::paths::TempFile;
use gradkit_core::TensorRow;

/// The `--state` file: every rank's error buffers, little-endian.
///
/// ```text
/// magic        8 bytes  "GKONEBIT"
/// version      u32      1
/// variant      u32      0 = onebit (server), 1 = onebit-naive
/// world_size   u32      P
/// n            u64      unpadded fused length
/// padded       u64      worker error length
/// server_len   u64      server error length per rank (padded/P, or 0)
/// then for rank 0..P: worker_error (padded × f32), server_error (server_len × f32)
/// ```
pub struct StateFile;

const MAGIC: &[u8; 8] = b"GKONEBIT";
const HEADER: usize = 44;

/// One rank's (worker error, server error).
#[cfg(test)]
pub type Errors = (Vec<f32>, Vec<f32>);

/// The 1-bit variant of `algo`, `None` for an algorithm without `--state`.
pub use gradkit_collectives::onebit::variant_of;

impl StateFile {
    /// Writes every rank's errors (`ranks`, rank order) for `variant` on `ranks.len()` ranks
    /// and `n` elements to `path` atomically (temporary file, linked when complete).
    #[cfg(test)]
    pub fn save(path: &Path, variant: Variant, n: usize, ranks: &[Errors]) -> Result<()> {
        let mut each = ranks.iter().map(|(w, s)| (w.as_slice(), s.as_slice()));
        let staged = Self::save_from(path, variant, n, ranks.len(), |_| {
            Ok(each.next().expect("one per rank"))
        })?;
        staged.map_or(Ok(()), TempFile::persist)
    }

    /// [`StateFile::save`] of `p` ranks' errors that `next(r)` hands over one rank at a time,
    /// written as they come (only one rank's buffers need be held). `next` is called for every
    /// rank, in order, even after an error (so that no rank waits to hand its buffers over);
    /// the first error is returned and no file is left behind. The complete file is returned
    /// unnamed, to be committed with the run's other outputs (None for a device, written in
    /// place).
    pub fn save_from<E: AsRef<[f32]>>(
        path: &Path,
        variant: Variant,
        n: usize,
        p: usize,
        mut next: impl FnMut(usize) -> Result<(E, E)>,
    ) -> Result<Option<TempFile>> {
        let ctx = || format!("writing 1-bit state (--state {})", path.display());
        if p == 0 {
            bail!("{}: no 1-bit state to save", ctx());
        }
        let (padded, server_len) = OneBitState::lens(variant, p, n);
        let v = match variant {
            Variant::Server => 0u32,
            Variant::Naive => 1,
        };
        let (mut taken, mut failed) = (0usize, None::<anyhow::Error>);
        // Streamed through a buffer: the file is never held whole in memory (docs/MEMORY.md).
        let written = gradkit_core::io::write_file_staged(path, |w| {
            w.write_all(MAGIC)?;
            for x in [1u32, v, p as u32] {
                w.write_all(&x.to_le_bytes())?;
            }
            for x in [n, padded, server_len] {
                w.write_all(&(x as u64).to_le_bytes())?;
            }
            let mut bytes = Vec::with_capacity(1 << 16);
            for r in 0..p {
                taken = r + 1;
                let fail = |e: anyhow::Error, failed: &mut Option<anyhow::Error>| {
                    let m = format!("{e:#}");
                    *failed = Some(e);
                    std::io::Error::other(m)
                };
                let (we, se) = next(r).map_err(|e| fail(e, &mut failed))?;
                let (we, se) = (we.as_ref(), se.as_ref());
                if we.len() != padded || se.len() != server_len {
                    let e = anyhow::anyhow!(
                        "{}: rank {r} holds {} + {} error values, expected {padded} + {server_len}",
                        ctx(),
                        we.len(),
                        se.len()
                    );
                    return Err(fail(e, &mut failed));
                }
                for chunk in we.chunks(1 << 14).chain(se.chunks(1 << 14)) {
                    bytes.clear();
                    bytes.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                    w.write_all(&bytes)?;
                }
            }
            Ok(())
        });
        for r in taken..p {
            let _ = next(r);
        }
        match (failed, written) {
            (Some(e), _) => Err(e),
            (None, w) => w.with_context(ctx),
        }
    }

    /// Reads every rank's errors; checks the file was saved for `variant` on `p` ranks with
    /// `n` elements ([`StateFile::open`], then every buffer).
    #[cfg(test)]
    pub fn load(path: &Path, variant: Variant, p: usize, n: usize) -> Result<Vec<Errors>> {
        let mut f = Self::open(path, variant, p, n)?;
        (0..p)
            .map(|_| Ok((f.next_piece(usize::MAX)?.2, f.next_piece(usize::MAX)?.2)))
            .collect()
    }

    /// Opens a saved file and checks it, without reading the errors: the header (saved for
    /// `variant` on `p` ranks with `n` elements, the lengths of the padding rule) and the
    /// file's length (long enough for every rank's buffers: a truncated file is refused here,
    /// before any rank starts). The buffers are then read one at a time
    /// ([`StateReader::next_piece`]), so that the I/O rank never holds every rank's.
    pub fn open(path: &Path, variant: Variant, p: usize, n: usize) -> Result<StateReader> {
        let ctx = || format!("reading 1-bit state (--state {})", path.display());
        let file = std::fs::File::open(path).with_context(ctx)?;
        let mut f = std::io::BufReader::with_capacity(1 << 16, file);
        let mut head = [0u8; HEADER];
        f.read_exact(&mut head)
            .with_context(|| format!("{}: file too short", ctx()))?;
        let u32_at = |o: usize| u32::from_le_bytes(head[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().expect("8"));
        if &head[..8] != MAGIC || u32_at(8) != 1 {
            bail!("{}: not a gradkit 1-bit state file", ctx());
        }
        let fv = if u32_at(12) == 0 {
            Variant::Server
        } else {
            Variant::Naive
        };
        let (fp, fnn) = (u32_at(16) as usize, u64_at(20) as usize);
        if fv != variant || fp != p || fnn != n {
            bail!(
                "{}: saved for {:?} on {fp} ranks with {fnn} elements, but this run is {:?} on {p} ranks with {n} elements",
                ctx(), fv, variant
            );
        }
        let (padded, server_len) = OneBitState::lens(variant, p, n);
        if u64_at(28) as usize != padded || u64_at(36) as usize != server_len {
            bail!("{}: buffer lengths do not match the padding rule", ctx());
        }
        // What reading every buffer would find: the same error as a read past the end.
        let need = HEADER as u64 + 4 * (p as u64) * (padded + server_len) as u64;
        if f.get_ref().metadata().with_context(ctx)?.len() < need {
            return Err(anyhow::Error::new(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "failed to fill whole buffer",
            )))
            .with_context(|| format!("{}: file truncated", ctx()));
        }
        Ok(StateReader {
            path: path.to_path_buf(),
            f,
            lens: [padded, server_len],
            p,
            next: 0,
            at: 0,
        })
    }
}

/// A `--state` file checked by [`StateFile::open`], read a piece at a time in the file's
/// order (rank 0's worker error, its server error, rank 1's, …).
pub struct StateReader {
    path: std::path::PathBuf,
    f: std::io::BufReader<std::fs::File>,
    /// Values of a worker error and of a server error.
    lens: [usize; 2],
    p: usize,
    /// The buffer being read: rank `next / 2`, worker error when even.
    next: usize,
    /// Values of that buffer already read.
    at: usize,
}

/// The most values of one piece of a saved buffer that the feed's `--state` round sends at
/// once under mpirun (2 MiB, as the trace's pieces): the I/O rank holds one piece and its
/// encoding besides its own buffers; [`from_rows`] joins a buffer's pieces again. In-process
/// ranks get whole buffers (moved, nothing encoded).
pub const PIECE_VALUES: usize = (2 << 20) / 4;

impl StateReader {
    /// The next `max` values at most of the buffer being read, in the file's order: (its
    /// rank, 0 = worker error or 1 = server error, the values). An empty buffer is one empty
    /// piece.
    pub fn next_piece(&mut self, max: usize) -> Result<(usize, usize, Vec<f32>)> {
        let (r, which) = (self.next / 2, self.next % 2);
        if r >= self.p {
            bail!("internal: every rank's 1-bit state was read");
        }
        let len = self.lens[which];
        let take = (len - self.at).min(max);
        let mut vals = Vec::with_capacity(take);
        let mut bytes = [0u8; 1 << 14];
        while vals.len() < take {
            let k = (take - vals.len()).min(bytes.len() / 4);
            self.f.read_exact(&mut bytes[..4 * k]).with_context(|| {
                format!(
                    "reading 1-bit state (--state {}): file truncated",
                    self.path.display()
                )
            })?;
            vals.extend(
                bytes[..4 * k]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4"))),
            );
        }
        self.at += take;
        if self.at == len {
            (self.next, self.at) = (self.next + 1, 0);
        }
        Ok((r, which, vals))
    }

    /// Whether every buffer was read.
    pub fn done(&self) -> bool {
        self.next >= 2 * self.p
    }

    /// The source of the feed's `--state` round (`dist::Feed::round_from`) on the I/O rank:
    /// the buffers in pieces of at most `max` values ([`PIECE_VALUES`] under mpirun; rank 0's
    /// own, which the feed keeps rather than sends, whole), each a row for its rank
    /// ([`error_row`]) read only when the feed asks for it (under mpirun each is sent before
    /// the next is read), then `Done`. A read that fails is kept in `failed`
    /// and stops every rank (`Piece::Stop`), reported once by the I/O rank.
    pub fn piece(
        &mut self,
        max: usize,
        failed: &mut Option<anyhow::Error>,
    ) -> dist::Piece<TensorRow> {
        if failed.is_some() {
            return dist::Piece::Stop;
        }
        if self.done() {
            return dist::Piece::Done;
        }
        let max = if self.next < 2 { usize::MAX } else { max };
        match self.next_piece(max) {
            Ok((r, which, values)) => dist::Piece::Rows(r, vec![error_row(r, which, values)]),
            Err(e) => {
                *failed = Some(e);
                dist::Piece::Stop
            }
        }
    }
}

/// One saved buffer as the feed hands it out: layer 0 = [`WORKER_ERROR`], layer 1 =
/// [`SERVER_ERROR`], of rank `rank`.
pub fn error_row(rank: usize, which: usize, values: Vec<f32>) -> TensorRow {
    let name = [WORKER_ERROR, SERVER_ERROR][which];
    TensorRow {
        step: 0,
        rank: rank as u32,
        layer_id: which as u32,
        layer: name.to_string(),
        numel: values.len() as u64,
        shape: None,
        indices: None,
        values,
    }
}

/// Every rank's errors as rows, one `Vec` per rank (rank order), as the feed's first round
/// hands them out ([`error_row`]).
#[cfg(test)]
pub fn to_rows(ranks: Vec<Errors>) -> Vec<Vec<TensorRow>> {
    ranks
        .into_iter()
        .enumerate()
        .map(|(r, (w, s))| vec![error_row(r, 0, w), error_row(r, 1, s)])
        .collect()
}

/// After the last step: every rank's errors (`mine`, its `Reducer::state`, taken by value) go
/// to the I/O rank, which writes the `--state` file (`target`: path, variant and n; rank 0
/// only) as they arrive, one rank at a time ([`StateFile::save_from`]): rank 0 holds its own
/// buffers and one other rank's, not every rank's. They move as raw `f32` buffers (in-process
/// ranks hand their vectors over), not encoded as rows. Every rank sends (empty buffers when it
/// has no state) before it reports a problem, so no rank waits forever; rank 0 names a rank
/// without state. Rank 0 gets the complete file unnamed, to commit with the other outputs.
pub fn save_gathered(
    comm: &dyn Comm,
    mine: Vec<(String, Vec<f32>)>,
    target: Option<(&Path, Variant, usize)>,
) -> Result<Option<TempFile>> {
    let (mut w, mut s, mut unknown) = (Vec::new(), Vec::new(), None);
    for (name, v) in mine {
        match name.as_str() {
            WORKER_ERROR => w = v,
            SERVER_ERROR => s = v,
            other => {
                unknown = Some(format!(
                    "rank {}: unknown 1-bit state `{other}`",
                    comm.rank()
                ))
            }
        }
    }
    let _io = comm.phase(dist::IO_PHASE);
    if comm.rank() != 0 {
        for buf in [w, s] {
            comm.exchange(STATE_TAG, vec![(0, Buf::from_vec(buf))], &[])?;
        }
        return match unknown {
            Some(m) => bail!(m),
            None => Ok(None),
        };
    }
    let (path, variant, n) = target.context("internal: rank 0 saves the 1-bit state")?;
    let mut own = Some((w, s));
    StateFile::save_from(path, variant, n, comm.size(), |r| {
        let (w, s) = match r {
            0 => match unknown.take() {
                Some(m) => bail!(m),
                None => own.take().context("internal: rank 0's state taken twice")?,
            },
            _ => {
                let part = || -> Result<Vec<f32>> {
                    let got = comm.exchange(STATE_TAG, vec![], &[(r, Kind::F32)])?;
                    Ok(got
                        .into_iter()
                        .next()
                        .context("no 1-bit state message")?
                        .into_vec()?)
                };
                (part()?, part()?)
            }
        };
        if w.is_empty() {
            bail!("rank {r} returned no 1-bit state to save (--state)");
        }
        Ok((w, s))
    })
}

/// The tag of [`save_gathered`]'s messages (after the last step: no collective is in flight).
const STATE_TAG: u32 = 2;

/// This rank's rows back as `Reducer::load_state` takes them: the pieces of one buffer
/// (consecutive rows of the same layer, [`StateReader::piece`]) joined in order, each piece
/// dropped once copied (a buffer in one piece is moved).
pub fn from_rows(rows: Vec<TensorRow>) -> Vec<(String, Vec<f32>)> {
    // Whether each row starts a run of one layer's rows, and each run's length.
    let starts: Vec<bool> = (0..rows.len())
        .map(|i| i == 0 || rows[i - 1].layer != rows[i].layer)
        .collect();
    let mut lens: Vec<usize> = Vec::new();
    for (r, &start) in rows.iter().zip(&starts) {
        match lens.last_mut() {
            Some(len) if !start => *len += r.values.len(),
            _ => lens.push(r.values.len()),
        }
    }
    let mut out: Vec<(String, Vec<f32>)> = Vec::with_capacity(lens.len());
    for (r, start) in rows.into_iter().zip(starts) {
        match out.last_mut() {
            Some((_, v)) if !start => v.extend_from_slice(&r.values),
            _ => {
                let mut v = r.values;
                v.reserve_exact(lens[out.len()] - v.len());
                out.push((r.layer, v));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("gk-state-{}-{name}", std::process::id()))
    }

    /// The bytes of a file written by hand from the format above: P = 2, n = 5, server
    /// variant → padded to 2·lcm(2, 8) = 16, server chunks 8.
    fn by_hand(p: u32, n: u64, padded: u64, server: u64, vals: &[f32]) -> Vec<u8> {
        let mut b = b"GKONEBIT".to_vec();
        for x in [1u32, 0, p] {
            b.extend(x.to_le_bytes());
        }
        for x in [n, padded, server] {
            b.extend(x.to_le_bytes());
        }
        for v in vals {
            b.extend(v.to_le_bytes());
        }
        b
    }

    fn errs(p: usize, w: usize, s: usize) -> Vec<Errors> {
        (0..p)
            .map(|r| {
                let f = |i: usize, off: f32| (r * 100 + i) as f32 * 0.5 - off;
                (
                    (0..w).map(|i| f(i, 3.0)).collect(),
                    (0..s).map(|i| f(i, 7.0)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn save_writes_the_documented_bytes_and_load_reads_them_back() {
        let path = tmp("bytes");
        let e = errs(2, 16, 8);
        StateFile::save(&path, Variant::Server, 5, &e).unwrap();
        let vals: Vec<f32> = e
            .iter()
            .flat_map(|(w, s)| w.iter().chain(s).copied())
            .collect();
        assert_eq!(std::fs::read(&path).unwrap(), by_hand(2, 5, 16, 8, &vals));
        assert_eq!(StateFile::load(&path, Variant::Server, 2, 5).unwrap(), e);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn load_refuses_other_runs_and_damaged_files() {
        let path = tmp("refuse");
        let e = errs(2, 16, 8);
        let vals: Vec<f32> = e
            .iter()
            .flat_map(|(w, s)| w.iter().chain(s).copied())
            .collect();
        std::fs::write(&path, by_hand(2, 5, 16, 8, &vals)).unwrap();
        let msg = |r: Result<Vec<Errors>>| format!("{:#}", r.unwrap_err());
        let m = msg(StateFile::load(&path, Variant::Server, 3, 5));
        assert!(
            m.contains(
                "saved for Server on 2 ranks with 5 elements, but this run is Server on 3 ranks"
            ),
            "{m}"
        );
        assert!(m.starts_with("reading 1-bit state (--state "), "{m}");
        let m = msg(StateFile::load(&path, Variant::Naive, 2, 5));
        assert!(m.contains("but this run is Naive"), "{m}");
        let m = msg(StateFile::load(&path, Variant::Server, 2, 6));
        assert!(m.contains("with 6 elements"), "{m}");
        // Truncated: the last value missing.
        let mut b = by_hand(2, 5, 16, 8, &vals);
        b.truncate(b.len() - 4);
        std::fs::write(&path, &b).unwrap();
        assert!(msg(StateFile::load(&path, Variant::Server, 2, 5)).contains(": file truncated"));
        std::fs::write(&path, &b[..20]).unwrap();
        assert!(msg(StateFile::load(&path, Variant::Server, 2, 5)).contains("file too short"));
        // Wrong magic, wrong lengths in the header.
        let mut b = by_hand(2, 5, 16, 8, &vals);
        b[0] = b'X';
        std::fs::write(&path, &b).unwrap();
        assert!(msg(StateFile::load(&path, Variant::Server, 2, 5))
            .contains("not a gradkit 1-bit state file"));
        std::fs::write(&path, by_hand(2, 5, 8, 8, &vals)).unwrap();
        assert!(msg(StateFile::load(&path, Variant::Server, 2, 5))
            .contains("do not match the padding rule"));
        let _ = std::fs::remove_file(&path);
        let m = msg(StateFile::load(&path, Variant::Server, 2, 5));
        assert!(m.starts_with("reading 1-bit state (--state "), "{m}");
    }

    #[test]
    fn save_refuses_buffers_of_the_wrong_length() {
        let path = tmp("wronglen");
        let e = errs(2, 15, 8);
        let m = format!(
            "{:#}",
            StateFile::save(&path, Variant::Server, 5, &e).unwrap_err()
        );
        assert!(
            m.contains("rank 0 holds 15 + 8 error values, expected 16 + 8"),
            "{m}"
        );
        assert!(!path.exists());
    }

    #[test]
    fn rows_round_trip_by_rank() {
        let e = errs(3, 8, 0);
        let mine: Vec<TensorRow> = to_rows(e.clone()).swap_remove(1);
        assert!(mine.iter().all(|r| r.rank == 1));
        assert_eq!(
            from_rows(mine),
            vec![
                (WORKER_ERROR.to_string(), e[1].0.clone()),
                (SERVER_ERROR.to_string(), e[1].1.clone())
            ]
        );
    }

    /// The feed's source hands every buffer out in pieces of at most `max` values (rank 0's
    /// whole), in the file's order, each to its rank; joined again by `from_rows` they are the values
    /// written by hand; then `Done`. An empty server error (onebit-naive) is one empty piece.
    #[test]
    fn pieces_hand_every_buffer_to_its_rank_in_order() {
        for (variant, v) in [(Variant::Server, 0u32), (Variant::Naive, 1)] {
            let (p, n) = (2usize, 21usize);
            let (padded, server) = OneBitState::lens(variant, p, n);
            let e = errs(p, padded, server);
            let vals: Vec<f32> = e
                .iter()
                .flat_map(|(w, s)| w.iter().chain(s).copied())
                .collect();
            let mut bytes = by_hand(p as u32, n as u64, padded as u64, server as u64, &vals);
            bytes[12..16].copy_from_slice(&v.to_le_bytes());
            let path = tmp(&format!("pieces-{v}"));
            std::fs::write(&path, &bytes).unwrap();
            let mut f = StateFile::open(&path, variant, p, n).unwrap();
            let (mut per, mut failed, mut count) = (vec![Vec::new(); p], None, 0);
            loop {
                match f.piece(5, &mut failed) {
                    dist::Piece::Rows(d, rows) => {
                        // Rank 0's own buffers (kept by the I/O rank) come whole.
                        let most = if d == 0 { padded } else { 5 };
                        assert!(rows
                            .iter()
                            .all(|r| r.values.len() <= most && r.rank == d as u32));
                        per[d].extend(rows);
                        count += 1;
                    }
                    dist::Piece::Done => break,
                    other => panic!("{other:?}"),
                }
            }
            let want_pieces = 2 + (p - 1) * (padded.div_ceil(5) + server.div_ceil(5).max(1));
            assert_eq!(count, want_pieces, "{variant:?}");
            for (r, rows) in per.into_iter().enumerate() {
                let (w, s) = &e[r];
                assert_eq!(
                    from_rows(rows),
                    vec![
                        (WORKER_ERROR.to_string(), w.clone()),
                        (SERVER_ERROR.to_string(), s.clone())
                    ],
                    "{variant:?} rank {r}"
                );
            }
            assert!(failed.is_none());
            let _ = std::fs::remove_file(&path);
        }
    }

    /// A file cut short is refused by `open` with the message a read past its end gives; one
    /// cut after `open` stops the feed's source, which keeps the same message.
    #[test]
    fn a_file_cut_short_is_refused_before_or_while_it_is_read() {
        // Larger than the reader's buffer, so that the cut is met by a read.
        let (p, n) = (2usize, 40_000usize);
        let (padded, server) = OneBitState::lens(Variant::Server, p, n);
        let e = errs(p, padded, server);
        let vals: Vec<f32> = e
            .iter()
            .flat_map(|(w, s)| w.iter().chain(s).copied())
            .collect();
        let whole = by_hand(p as u32, n as u64, padded as u64, server as u64, &vals);
        let path = tmp("cut-short");
        std::fs::write(&path, &whole[..whole.len() - 1]).unwrap();
        let m = format!(
            "{:#}",
            StateFile::open(&path, Variant::Server, p, n).err().unwrap()
        );
        let want = format!(
            "reading 1-bit state (--state {}): file truncated: failed to fill whole buffer",
            path.display()
        );
        assert_eq!(m, want);
        std::fs::write(&path, &whole).unwrap();
        let mut f = StateFile::open(&path, Variant::Server, p, n).unwrap();
        std::fs::write(&path, &whole[..HEADER + 4 * (padded + 3)]).unwrap();
        let mut failed = None;
        let mut got = 0;
        loop {
            match f.piece(PIECE_VALUES, &mut failed) {
                dist::Piece::Rows(_, rows) => got += rows[0].values.len(),
                dist::Piece::Stop => break,
                other => panic!("{other:?}"),
            }
        }
        assert!(got <= padded, "{got}");
        assert_eq!(format!("{:#}", failed.unwrap()), want);
        let _ = std::fs::remove_file(&path);
    }

    /// Pieces of one buffer are joined in order; a buffer given twice stays two entries (for
    /// `load_state` to refuse).
    #[test]
    fn from_rows_joins_the_pieces_of_each_buffer() {
        let row = |which: usize, v: &[f32]| error_row(0, which, v.to_vec());
        let rows = vec![
            row(0, &[1.0, 2.0]),
            row(0, &[3.0]),
            row(0, &[]),
            row(0, &[4.0, -0.0]),
            row(1, &[]),
        ];
        assert_eq!(
            from_rows(rows),
            vec![
                (WORKER_ERROR.to_string(), vec![1.0, 2.0, 3.0, 4.0, -0.0]),
                (SERVER_ERROR.to_string(), vec![])
            ]
        );
        let rows = vec![row(0, &[1.0]), row(1, &[2.0]), row(0, &[3.0])];
        let got = from_rows(rows);
        assert_eq!(got.len(), 3);
        assert_eq!(got[2], (WORKER_ERROR.to_string(), vec![3.0]));
    }

    /// Every rank's buffers reach the file in rank order, as each rank gave them (checked
    /// against the format written out by hand); a rank without state is named, no file is left
    /// and no rank waits forever.
    #[test]
    fn save_gathered_writes_every_rank_in_order() {
        let n = 21;
        for p in [1usize, 3] {
            let (padded, server) = OneBitState::lens(Variant::Server, p, n);
            let e = errs(p, padded, server);
            let path = tmp(&format!("gathered-{p}"));
            gradkit_comm::run_local(p, |comm| {
                let (w, s) = e[comm.rank()].clone();
                let target = (comm.rank() == 0).then_some((path.as_path(), Variant::Server, n));
                save_gathered(
                    comm,
                    vec![(SERVER_ERROR.into(), s), (WORKER_ERROR.into(), w)],
                    target,
                )
            })
            .unwrap()
            .into_iter()
            .flatten()
            .for_each(|staged| staged.persist().unwrap());
            let vals: Vec<f32> = e
                .iter()
                .flat_map(|(w, s)| w.iter().chain(s).copied())
                .collect();
            let want = by_hand(p as u32, n as u64, padded as u64, server as u64, &vals);
            assert_eq!(std::fs::read(&path).unwrap(), want, "P = {p}");
            std::fs::remove_file(&path).unwrap();
        }
        let path = tmp("gathered-missing");
        let (padded, server) = OneBitState::lens(Variant::Server, 3, n);
        let err = gradkit_comm::run_local(3, |comm| {
            let st = if comm.rank() == 1 {
                Vec::new()
            } else {
                let (w, s) = errs(3, padded, server)[comm.rank()].clone();
                vec![(WORKER_ERROR.into(), w), (SERVER_ERROR.into(), s)]
            };
            let target = (comm.rank() == 0).then_some((path.as_path(), Variant::Server, n));
            save_gathered(comm, st, target)
        });
        let m = format!("{:#}", err.unwrap_err());
        assert!(
            m.contains("rank 1 returned no 1-bit state to save (--state)"),
            "{m}"
        );
        assert!(!path.exists());
    }
}
