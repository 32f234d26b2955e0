//! `--state FILE`: the 1-bit reducers' worker and server error buffers, kept across runs.
//!
//! The reducer does no I/O: it hands its state out and takes it back as named values
//! (`Reducer::state` / `Reducer::load_state`). This module owns the file: the I/O rank
//! reads it (when it exists) before any rank starts, each rank gets its buffers in the feed's
//! first round (`dist::Feed`, the `io` phase), and after the last step every rank's buffers
//! go to the I/O rank, which writes the file atomically as they arrive ([`save_gathered`]).

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use gradkit_collectives::onebit::{OneBitState, Variant, SERVER_ERROR, WORKER_ERROR};
use gradkit_collectives::Algo;
use gradkit_comm::{dist, Buf, Comm, CommExt, Kind};
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
pub type Errors = (Vec<f32>, Vec<f32>);

/// The 1-bit variant of `algo`, `None` for an algorithm without `--state`.
pub fn variant_of(algo: Algo) -> Option<Variant> {
    match algo {
        Algo::OneBit => Some(Variant::Server),
        Algo::OneBitNaive => Some(Variant::Naive),
        _ => None,
    }
}

impl StateFile {
    /// Writes every rank's errors (`ranks`, rank order) for `variant` on `ranks.len()` ranks
    /// and `n` elements to `path` atomically (temporary file, linked when complete).
    #[cfg(test)]
    pub fn save(path: &Path, variant: Variant, n: usize, ranks: &[Errors]) -> Result<()> {
        let mut each = ranks.iter().map(|(w, s)| (w.as_slice(), s.as_slice()));
        Self::save_from(path, variant, n, ranks.len(), |_| {
            Ok(each.next().expect("one per rank"))
        })
    }

    /// [`StateFile::save`] of `p` ranks' errors that `next(r)` hands over one rank at a time,
    /// written as they come (only one rank's buffers need be held). `next` is called for every
    /// rank, in order, even after an error (so that no rank waits to hand its buffers over);
    /// the first error is returned and no file is left behind.
    pub fn save_from<E: AsRef<[f32]>>(
        path: &Path,
        variant: Variant,
        n: usize,
        p: usize,
        mut next: impl FnMut(usize) -> Result<(E, E)>,
    ) -> Result<()> {
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
        let written = gradkit_core::io::write_file_atomic_with(path, |w| {
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
    /// `n` elements.
    pub fn load(path: &Path, variant: Variant, p: usize, n: usize) -> Result<Vec<Errors>> {
        let ctx = || format!("reading 1-bit state (--state {})", path.display());
        let mut f = std::io::BufReader::new(std::fs::File::open(path).with_context(ctx)?);
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
        let mut out = Vec::with_capacity(p);
        let mut buf = vec![0u8; 4 * (padded + server_len)];
        for _ in 0..p {
            f.read_exact(&mut buf)
                .with_context(|| format!("{}: file truncated", ctx()))?;
            let mut vals: Vec<f32> = buf
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
                .collect();
            let server = vals.split_off(padded);
            out.push((vals, server));
        }
        Ok(out)
    }
}

/// Every rank's errors as rows, one `Vec` per rank (rank order), as the feed's first round
/// hands them out: layer 0 = [`WORKER_ERROR`], layer 1 = [`SERVER_ERROR`].
pub fn to_rows(ranks: Vec<Errors>) -> Vec<Vec<TensorRow>> {
    ranks
        .into_iter()
        .enumerate()
        .map(|(r, (w, s))| {
            [(WORKER_ERROR, w), (SERVER_ERROR, s)]
                .into_iter()
                .enumerate()
                .map(|(i, (name, values))| TensorRow {
                    step: 0,
                    rank: r as u32,
                    layer_id: i as u32,
                    layer: name.to_string(),
                    numel: values.len() as u64,
                    shape: None,
                    indices: None,
                    values,
                })
                .collect()
        })
        .collect()
}

/// After the last step: every rank's errors (`mine`, its `Reducer::state`, taken by value) go
/// to the I/O rank, which writes the `--state` file (`target`: path, variant and n; rank 0
/// only) as they arrive, one rank at a time ([`StateFile::save_from`]): rank 0 holds its own
/// buffers and one other rank's, not every rank's. They move as raw `f32` buffers (in-process
/// ranks hand their vectors over), not encoded as rows. Every rank sends (empty buffers when it
/// has no state) before it reports a problem, so no rank waits forever; rank 0 names a rank
/// without state.
pub fn save_gathered(
    comm: &dyn Comm,
    mine: Vec<(String, Vec<f32>)>,
    target: Option<(&Path, Variant, usize)>,
) -> Result<()> {
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
            None => Ok(()),
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

/// This rank's rows back as `Reducer::load_state` takes them.
pub fn from_rows(rows: Vec<TensorRow>) -> Vec<(String, Vec<f32>)> {
    rows.into_iter().map(|r| (r.layer, r.values)).collect()
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
            .unwrap();
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
