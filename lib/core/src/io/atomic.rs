//! Whole files written atomically (a temporary name, then a rename) or staged for a run's
//! common commit.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// Writes a whole file atomically: `PATH.tmp-<pid>`, then a rename, so a failed or killed
/// run never leaves a half-written file at `path`. A path that exists and is not a regular
/// file (a device, a FIFO, `/dev/stdout`) is written in place instead.
pub fn write_file_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_file_atomic_with(path, |w| w.write_all(data))
}

/// [`write_file_atomic`] of the bytes `fill` writes, through a buffer: a big file is not held
/// whole in memory first.
pub fn write_file_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    match write_file_staged(path, fill)? {
        Some(tmp) => tmp.persist(),
        None => Ok(()),
    }
}

/// [`write_file_atomic_with`] without the rename: the complete file, to be committed with a
/// run's other outputs ([`crate::paths::commit_all`]); None when `path` is a device or FIFO,
/// written in place.
pub fn write_file_staged(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<Option<crate::paths::TempFile>> {
    let ctx = || format!("cannot write {}", path.display());
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut f = std::io::BufWriter::new(File::create(path).with_context(ctx)?);
        fill(&mut f).and_then(|_| f.flush()).with_context(ctx)?;
        return Ok(None);
    }
    let tmp = crate::paths::TempFile::create(path)?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, tmp.file());
    fill(&mut f).and_then(|_| f.flush()).with_context(ctx)?;
    drop(f);
    Ok(Some(tmp))
}

/// Writes `rows` as `commtrace/1` to `path` (`--comm-trace`), atomically (a temporary file
/// renamed into place), with `meta` (producer, algorithm, backend) and the world size.
pub fn write_comm_trace(
    path: &std::path::Path,
    mut meta: crate::Meta,
    world_size: usize,
    rows: &[crate::tables::CommRow],
) -> Result<()> {
    meta.set("world_size", world_size);
    let out = crate::Output::for_flag("--comm-trace", Some(path))?;
    super::write_table(&out, &meta, rows)
}
