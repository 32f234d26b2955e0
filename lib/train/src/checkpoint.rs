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
    let path = rank_file(&dir, rank);
    safetensors::serialize_to_file(views, Some(meta), &path)
        .with_context(|| format!("cannot write checkpoint {}", path.display()))?;
    Ok(())
}

/// Rank 0, after every rank wrote: moves the staging directory to `step-N` and points
/// `latest` at it (write + rename, so a crash leaves the previous checkpoint intact).
pub fn commit(root: &Path, step: u32) -> Result<()> {
    let from = staging_dir(root, step);
    let to = root.join(format!("step-{step}"));
    if to.exists() {
        std::fs::remove_dir_all(&to).with_context(|| format!("cannot replace {}", to.display()))?;
    }
    std::fs::rename(&from, &to).with_context(|| format!("cannot rename {}", from.display()))?;
    let tmp = root.join(format!("latest.tmp-{}", std::process::id()));
    std::fs::write(&tmp, format!("step-{step}\n"))?;
    std::fs::rename(&tmp, root.join("latest"))?;
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

/// Reads rank `rank`'s file of a checkpoint directory.
pub fn read_rank(dir: &Path, rank: usize) -> Result<RankState> {
    let path = rank_file(dir, rank);
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "cannot read {} (was the checkpoint written with another --ranks?)",
            path.display()
        )
    })?;
    let (_, md) = SafeTensors::read_metadata(&bytes)
        .with_context(|| format!("{}: not a safetensors file", path.display()))?;
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
    let st = SafeTensors::deserialize(&bytes)?;
    let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
    names.sort();
    let mut tensors = Vec::new();
    for n in names {
        let t = st.tensor(&n)?;
        if t.dtype() != Dtype::F32 {
            bail!("{}: tensor `{n}` is not f32", path.display());
        }
        let v: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        tensors.push((n, v));
    }
    meta.retain(|(k, _)| k != "step");
    Ok(RankState {
        step,
        tensors,
        meta,
    })
}
