//! `--state FILE`: the 1-bit reducers' worker and server error buffers, kept across runs.
//!
//! The reducer does no I/O: it hands its state out and takes it back as named values
//! (`Reducer::state` / `Reducer::load_state`). This module owns the file: the I/O rank
//! reads it (when it exists) before any rank starts, each rank gets its buffers before the
//! first step (`dist::scatter`, the `io` phase), and after the last step every rank's buffers
//! are gathered to the I/O rank (`dist::gather`), which writes the file atomically.

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
    pub fn save(path: &Path, variant: Variant, n: usize, ranks: &[Errors]) -> Result<()> {
        let ctx = || format!("writing 1-bit state (--state {})", path.display());
        let p = ranks.len();
        if p == 0 {
            bail!("{}: no 1-bit state to save", ctx());
        }
        let (padded, server_len) = OneBitState::lens(variant, p, n);
        for (r, (we, se)) in ranks.iter().enumerate() {
            if we.len() != padded || se.len() != server_len {
                bail!(
                    "{}: rank {r} holds {} + {} error values, expected {padded} + {server_len}",
                    ctx(),
                    we.len(),
                    se.len()
                );
            }
        }
        let v = match variant {
            Variant::Server => 0u32,
            Variant::Naive => 1,
        };
        // Streamed through a buffer: the file is never held whole in memory (docs/MEMORY.md).
        gradkit_core::io::write_file_atomic_with(path, |w| {
            w.write_all(MAGIC)?;
            w.write_all(&1u32.to_le_bytes())?;
            w.write_all(&v.to_le_bytes())?;
            w.write_all(&(p as u32).to_le_bytes())?;
            w.write_all(&(n as u64).to_le_bytes())?;
            w.write_all(&(padded as u64).to_le_bytes())?;
            w.write_all(&(server_len as u64).to_le_bytes())?;
            let mut bytes = Vec::with_capacity(1 << 16);
            for (we, se) in ranks {
                for chunk in we.chunks(1 << 14).chain(se.chunks(1 << 14)) {
                    bytes.clear();
                    bytes.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                    w.write_all(&bytes)?;
                }
            }
            Ok(())
        })
        .with_context(ctx)
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

/// Every rank's errors as rows that `dist::scatter`/`gather` move between the I/O rank and
/// the others: per rank, layer 0 = [`WORKER_ERROR`], layer 1 = [`SERVER_ERROR`].
pub fn to_rows(ranks: Vec<Errors>) -> Vec<TensorRow> {
    let mut rows = Vec::with_capacity(2 * ranks.len());
    for (r, (w, s)) in ranks.into_iter().enumerate() {
        rows.extend(rank_rows(
            r as u32,
            vec![(WORKER_ERROR.into(), w), (SERVER_ERROR.into(), s)],
        ));
    }
    rows
}

/// One rank's `Reducer::state` as rows (layer id = position).
pub fn rank_rows(rank: u32, state: Vec<(String, Vec<f32>)>) -> Vec<TensorRow> {
    state
        .into_iter()
        .enumerate()
        .map(|(i, (name, values))| TensorRow {
            step: 0,
            rank,
            layer_id: i as u32,
            layer: name,
            numel: values.len() as u64,
            shape: None,
            indices: None,
            values,
        })
        .collect()
}

/// Every rank's errors on the I/O rank, in rank order (`None` on the others), from each rank's
/// `Reducer::state`, taken by value: moved as `f32` buffers (in-process ranks hand their
/// vectors over, MPI ranks send them as they are), not encoded as rows, so the gathered state
/// is held once. An error names a rank whose state lacks one of the buffers.
pub fn gather_errors(
    comm: &dyn Comm,
    mine: Vec<(String, Vec<f32>)>,
) -> Result<Option<Vec<Errors>>> {
    let (mut w, mut s) = (None, None);
    for (name, v) in mine {
        match name.as_str() {
            WORKER_ERROR => w = Some(v),
            SERVER_ERROR => s = Some(v),
            other => bail!("rank {}: unknown 1-bit state `{other}`", comm.rank()),
        }
    }
    // A rank without state sends empty buffers, so that no rank waits; rank 0 reports it
    // (a worker error is never empty).
    let (w, s) = (w.unwrap_or_default(), s.unwrap_or_default());
    let _io = comm.phase(dist::IO_PHASE);
    let p = comm.size();
    let mut parts: [Vec<Vec<f32>>; 2] = [Vec::new(), Vec::new()];
    for (part, (buf, out)) in [w, s].into_iter().zip(&mut parts).enumerate() {
        if comm.rank() != 0 {
            comm.exchange(STATE_TAG, vec![(0, Buf::from_vec(buf))], &[])?;
            continue;
        }
        let srcs: Vec<(usize, Kind)> = (1..p).map(|r| (r, Kind::F32)).collect();
        let got = if p > 1 {
            comm.exchange(STATE_TAG, vec![], &srcs)?
        } else {
            Vec::new()
        };
        out.push(buf);
        for b in got {
            out.push(
                b.into_vec()
                    .with_context(|| format!("1-bit state part {part}"))?,
            );
        }
    }
    if comm.rank() != 0 {
        return Ok(None);
    }
    let [ws, ss] = parts;
    let errors: Vec<Errors> = ws.into_iter().zip(ss).collect();
    for (r, (w, _)) in errors.iter().enumerate() {
        if w.is_empty() {
            bail!("rank {r} returned no 1-bit state to save (--state)");
        }
    }
    Ok(Some(errors))
}

/// The tag of [`gather_errors`]'s messages (after the last step: no collective is in flight).
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
        let mine: Vec<TensorRow> = to_rows(e.clone())
            .into_iter()
            .filter(|r| r.rank == 1)
            .collect();
        assert_eq!(
            from_rows(mine),
            vec![
                (WORKER_ERROR.to_string(), e[1].0.clone()),
                (SERVER_ERROR.to_string(), e[1].1.clone())
            ]
        );
    }

    /// Every rank's buffers arrive on rank 0 in rank order, as each rank gave them; a rank
    /// without state is named.
    #[test]
    fn gather_errors_collects_every_rank_in_order() {
        for p in [1, 3] {
            let e = errs(p, 8, 4);
            let got = gradkit_comm::run_local(p, |comm| {
                let (w, s) = e[comm.rank()].clone();
                gather_errors(
                    comm,
                    vec![(SERVER_ERROR.into(), s), (WORKER_ERROR.into(), w)],
                )
            })
            .unwrap();
            assert_eq!(got[0].as_ref().unwrap(), &e, "P = {p}");
            assert!(got[1..].iter().all(|g| g.is_none()));
        }
        let err = gradkit_comm::run_local(3, |comm| {
            let st = if comm.rank() == 2 {
                Vec::new()
            } else {
                let (w, s) = errs(3, 8, 0)[comm.rank()].clone();
                vec![(WORKER_ERROR.into(), w), (SERVER_ERROR.into(), s)]
            };
            gather_errors(comm, st)
        });
        let m = format!("{:#}", err.unwrap_err());
        assert!(
            m.contains("rank 2 returned no 1-bit state to save (--state)"),
            "{m}"
        );
    }
}
