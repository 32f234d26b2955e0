//! Checkpoints: one safetensors file per rank (parameters, optimiser state, residuals, 1-bit
//! error buffers) in `DIR/step-N/`, written atomically: every rank writes into a temporary
//! directory, then rank 0 renames it into place and swaps the `DIR/latest` pointer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// What one rank saves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankState {
    /// Number of completed steps (the step the resumed run starts at).
    pub step: u32,
    /// Named f32 vectors: `params`, `opt.*`, `residual`, `onebit.*`.
    pub tensors: Vec<(String, Vec<f32>)>,
    /// Run identity, checked on resume (model, exchange, optimizer, ranks, n, seed…).
    pub meta: Vec<(String, String)>,
}

impl RankState {
    pub fn get(&self, name: &str) -> Option<&Vec<f32>> {
        self.tensors.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}.safetensors"))
}

/// The temporary directory the ranks of `step` write into.
pub fn staging_dir(root: &Path, step: u32) -> PathBuf {
    root.join(format!(".staging-step-{step}"))
}

/// Writes this rank's file into the staging directory (call on every rank, then
/// [`commit`] on rank 0 after a barrier).
pub fn write_rank(root: &Path, rank: usize, st: &RankState) -> Result<()> {
    let dir = staging_dir(root, st.step);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create checkpoint directory {}", dir.display()))?;
    let bytes: Vec<(String, Vec<u8>, usize)> = st
        .tensors
        .iter()
        .map(|(k, v)| {
            let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (k.clone(), b, v.len())
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(k, b, n)| Ok((k.clone(), TensorView::new(Dtype::F32, vec![*n], b)?)))
        .collect::<Result<_>>()?;
    let mut meta: HashMap<String, String> = st.meta.iter().cloned().collect();
    meta.insert("step".into(), st.step.to_string());
    // One checksum per tensor, so a file changed after it was written reads as corrupt
    // instead of resuming from damaged numbers.
    for (k, b, _) in &bytes {
        meta.insert(
            format!("{CHECKSUM_PREFIX}{k}"),
            format!("{:016x}", fnv1a(b)),
        );
    }
    let path = rank_file(&dir, rank);
    safetensors::serialize_to_file(views, Some(meta), &path)
        .with_context(|| format!("cannot write checkpoint {}", path.display()))?;
    Ok(())
}

/// Metadata key prefix of a tensor's checksum.
const CHECKSUM_PREFIX: &str = "checksum.";

/// FNV-1a over bytes.
fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Rank 0, after every rank wrote: moves the staging directory to `step-N` and points
/// `latest` at it (write + rename, so a crash leaves the previous checkpoint intact). On an
/// error nothing of this checkpoint is left and `latest` still names the previous one.
pub fn commit(root: &Path, step: u32) -> Result<()> {
    let from = staging_dir(root, step);
    let to = root.join(format!("step-{step}"));
    let tmp = root.join(format!("latest.tmp-{}", std::process::id()));
    let res = (|| -> Result<()> {
        if to.exists() {
            std::fs::remove_dir_all(&to)
                .with_context(|| format!("cannot replace {}", to.display()))?;
        }
        std::fs::rename(&from, &to).with_context(|| format!("cannot rename {}", from.display()))?;
        std::fs::write(&tmp, format!("step-{step}\n"))
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, root.join("latest"))
            .with_context(|| format!("cannot replace {}", root.join("latest").display()))
    })();
    if res.is_err() {
        discard(root, step);
        let _ = std::fs::remove_file(&tmp);
        // `latest` was not swapped, so it does not name this step (unless it already did).
        if latest_name(root).as_deref() != Some(&format!("step-{step}")) {
            let _ = std::fs::remove_dir_all(&to);
        }
    }
    res
}

/// Removes what a failed checkpoint of `step` wrote (its staging directory), on the way to
/// reporting the failure: best effort, the error being reported is the write's.
pub fn discard(root: &Path, step: u32) {
    let _ = std::fs::remove_dir_all(staging_dir(root, step));
}

/// The name `latest` holds, if it can be read.
fn latest_name(root: &Path) -> Option<String> {
    std::fs::read_to_string(root.join("latest"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Whether `name` is an entry gradkit writes in a checkpoint directory: `latest`, its
/// temporary `latest.tmp-PID`, `step-N` and `.staging-step-N`.
fn is_ours(name: &str) -> bool {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    name == "latest"
        || name.starts_with("latest.tmp-")
        || numbered("step-")
        || numbered(".staging-step-")
}

/// The lock file of a checkpoint directory: held (`flock`) by the one process of a run that
/// does its I/O, for the run's lifetime, so two runs never write into one directory.
pub const LOCK: &str = ".gradtrain.lock";

/// Whether `name` is an entry of a checkpoint directory that a run writes, replaces or
/// removes (see [`is_ours`]) or its lock file: no input or output of the run may be one of
/// them (`gradkit_core::paths::check_outside`).
pub fn is_reserved(name: &str) -> bool {
    is_ours(name) || name == LOCK
}

/// Creates `root` if needed and takes its lock ([`LOCK`]), before the run looks at the
/// directory: a directory where no file can be created fails here, at the start, and so does
/// one another run holds (its pid named when it could be read).
pub fn lock(root: &Path) -> Result<gradkit_core::paths::FileLock> {
    let ck = root.display();
    std::fs::create_dir_all(root)
        .with_context(|| format!("--checkpoint {ck}: cannot create the directory"))?;
    let path = root.join(LOCK);
    let held = gradkit_core::paths::try_lock(&path)
        .with_context(|| format!("--checkpoint {ck}: cannot write into the directory"))?;
    held.map_err(|pid| {
        let who = pid.map_or("another run".into(), |p| format!("another run (process {p})"));
        anyhow::anyhow!(
            "--checkpoint {ck} is in use by {who}: two runs cannot write into one checkpoint directory; wait for it to end or give another DIR (flag --checkpoint)"
        )
    })
}

/// The checkpoints `root` already holds: its `step-N` directories and `latest`, sorted by
/// step (`latest` last); empty when `root` does not exist. Other files are not gradkit's and
/// do not count.
pub fn existing(root: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot read checkpoint directory {}", root.display()))
        }
    };
    let mut held: Vec<(u64, String)> = Vec::new();
    for e in entries {
        let e =
            e.with_context(|| format!("cannot read checkpoint directory {}", root.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "latest" {
            held.push((u64::MAX, name));
        } else if is_ours(&name) && !name.starts_with('.') && e.path().is_dir() {
            if let Some(Ok(n)) = name.strip_prefix("step-").map(str::parse::<u64>) {
                held.push((n, name));
            }
        }
    }
    held.sort();
    Ok(held.into_iter().map(|(_, n)| n).collect())
}

/// Rank 0, after the first commit of a run started with `--overwrite-checkpoint`: removes
/// every gradkit entry of `root` but `latest` and `step-{step}` (the checkpoint just
/// committed): the earlier run's checkpoints and leftovers. Other files are left alone.
pub fn remove_others(root: &Path, step: u32) -> Result<()> {
    let keep = format!("step-{step}");
    for e in std::fs::read_dir(root)
        .with_context(|| format!("cannot read checkpoint directory {}", root.display()))?
    {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_ours(&name) || name == "latest" || name == keep {
            continue;
        }
        let path = e.path();
        let r = if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        r.with_context(|| {
            format!(
                "cannot remove the earlier run's {} (flag --overwrite-checkpoint)",
                path.display()
            )
        })?;
    }
    Ok(())
}

/// The directory `latest` points at, if any.
pub fn latest(root: &Path) -> Result<Option<PathBuf>> {
    let p = root.join("latest");
    if !p.exists() {
        return Ok(None);
    }
    let name =
        std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    let dir = root.join(name.trim());
    if !dir.is_dir() {
        bail!(
            "{} points at {}, which does not exist (flag --checkpoint)",
            p.display(),
            dir.display()
        );
    }
    Ok(Some(dir))
}

/// The step a checkpoint directory holds (rank 0's file's metadata; no tensor is read).
pub fn step_of(dir: &Path) -> Result<u32> {
    let path = rank_file(dir, 0);
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let (_, md) = SafeTensors::read_metadata(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "checkpoint file {} is corrupt: not a readable safetensors file ({e})",
            path.display()
        )
    })?;
    md.metadata()
        .as_ref()
        .and_then(|m| m.get("step"))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{}: no step in metadata", path.display()))
}

/// Reads rank `rank`'s file of a checkpoint directory.
pub fn read_rank(dir: &Path, rank: usize) -> Result<RankState> {
    let path = rank_file(dir, rank);
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "cannot read {} (was the checkpoint written with another --ranks?)",
            path.display()
        )
    })?;
    let corrupt = |what: String| {
        anyhow::anyhow!(
            "checkpoint file {} is corrupt: {what} (it was changed or truncated after it was written; resume from an earlier step-N directory by pointing {} at it, or start afresh)",
            path.display(),
            dir.parent().map_or("latest".into(), |r| r.join("latest").display().to_string())
        )
    };
    let (_, md) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| corrupt(format!("not a readable safetensors file ({e})")))?;
    let mut meta: Vec<(String, String)> = md
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    meta.sort();
    let step = meta
        .iter()
        .find(|(k, _)| k == "step")
        .and_then(|(_, v)| v.parse().ok())
        .with_context(|| format!("{}: no step in metadata", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| corrupt(format!("not a readable safetensors file ({e})")))?;
    let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
    names.sort();
    let mut tensors = Vec::new();
    for n in names {
        let t = st.tensor(&n)?;
        if t.dtype() != Dtype::F32 {
            bail!("{}: tensor `{n}` is not f32", path.display());
        }
        let want = meta
            .iter()
            .find(|(k, _)| k.strip_prefix(CHECKSUM_PREFIX) == Some(n.as_str()))
            .map(|(_, v)| v.as_str());
        // Checkpoints written before checksums existed have none: they are read unchecked.
        if let Some(want) = want {
            if format!("{:016x}", fnv1a(t.data())) != want {
                return Err(corrupt(format!(
                    "tensor `{n}` does not match the checksum recorded when it was written"
                )));
            }
        }
        let v: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        tensors.push((n, v));
    }
    meta.retain(|(k, _)| k != "step" && !k.starts_with(CHECKSUM_PREFIX));
    Ok(RankState {
        step,
        tensors,
        meta,
    })
}
