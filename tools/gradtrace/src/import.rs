//! `gradtrace import`: gradients dumped from PyTorch or NumPy (`.safetensors`, `.npy`, `.npz`)
//! into a `tensor/1` trace.
//!
//! Files are named `step<S>_rank<R>.<ext>` (or `step<S>_rank<R>.<layer>.npy` for one array per
//! file), or their step and rank are given with `--step/--rank`. Tensor names become layer
//! names and shapes are kept. `layer_id` follows the order of the tensors in the first
//! (step, rank)'s files (`--order file`, the default) or the sorted layer names
//! (`--order name`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use gradkit_core::cli;
use gradkit_core::io::{Meta, Output, TableWriter};
use gradkit_core::tables::{validate_tensor_row, LayerRegistry};
use gradkit_core::TensorRow;

const IMPORT_ABOUT: &str = "Import gradients dumped from PyTorch or NumPy.

Reads .safetensors, .npy and .npz files, one file per (step, rank) named
step<S>_rank<R>.<ext> (or several .npy files step<S>_rank<R>.<layer>.npy, one array each),
from the directories and files given. Tensor names become layer names and shapes are kept.
layer_id numbers the layers in the order they appear in the first (step, rank)'s files:
safetensors data order (PyTorch's save_file stores tensors sorted by name within a dtype),
npz archive order (the order given to numpy.savez), .npy files sorted by layer name.
--order name numbers them by sorted name instead.

Values are stored as float32: F32 as is, F16 and BF16 exactly, F64 rounded to nearest.
Integer, bool and complex tensors are refused. Every (step, rank) must hold the same layers.";

const IMPORT_AFTER: &str = "Examples:
  gradtrace import dumps/ -o trace.parquet
  gradtrace import grads.npz --step 0 --rank 0 | gradtrace inspect
  gradtrace import step*_rank*.safetensors --order name -o trace.parquet";

/// How `layer_id` is assigned.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// The order of the tensors in the first (step, rank)'s files
    #[default]
    File,
    /// Sorted layer names
    Name,
}

#[derive(Args, Debug)]
#[command(about = "Import .safetensors/.npy/.npz gradient dumps", long_about = IMPORT_ABOUT, after_help = IMPORT_AFTER)]
pub struct ImportArgs {
    /// Directories or files to import
    #[arg(value_name = "DIR|FILE", required = true)]
    paths: Vec<PathBuf>,
    /// Step of every file given (instead of the step<S> in the file name)
    #[arg(long, value_name = "S", requires = "rank")]
    step: Option<u32>,
    /// Rank of every file given (instead of the rank<R> in the file name)
    #[arg(long, value_name = "R", requires = "step")]
    rank: Option<u32>,
    /// How layer_id is assigned
    #[arg(long, value_enum, default_value_t = Order::File)]
    order: Order,
    /// Accept NaN/Inf gradient values instead of stopping with an error
    #[arg(long)]
    allow_nonfinite: bool,
    /// Output table (Parquet); absent writes stdout when it is not a terminal
    #[arg(short = 'o', long = "output", value_name = "PATH")]
    output: Option<PathBuf>,
    /// No progress bar
    #[arg(short = 'q', long)]
    quiet: bool,
}

/// One tensor read from a file.
#[derive(Debug)]
struct Tensor {
    name: String,
    shape: Vec<u32>,
    values: Vec<f32>,
}

/// A file to import and what its name says.
#[derive(Debug)]
struct Source {
    path: PathBuf,
    step: u32,
    rank: u32,
    kind: Kind,
    /// The layer name of a one-array `.npy` file.
    npy_name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Safetensors,
    Npy,
    Npz,
}

fn kind_of(path: &Path) -> Option<Kind> {
    match path.extension()?.to_str()? {
        "safetensors" => Some(Kind::Safetensors),
        "npy" => Some(Kind::Npy),
        "npz" => Some(Kind::Npz),
        _ => None,
    }
}

/// Parses `step<S>_rank<R>[.<layer>]` (the file name without its extension).
fn parse_stem(stem: &str) -> Option<(u32, u32, Option<&str>)> {
    let rest = stem.strip_prefix("step")?;
    let (s, rest) = rest.split_once("_rank")?;
    let (r, layer) = match rest.split_once('.') {
        Some((r, l)) => (r, Some(l)),
        None => (rest, None),
    };
    Some((s.parse().ok()?, r.parse().ok()?, layer))
}

fn source(path: &Path, fixed: Option<(u32, u32)>) -> Result<Source> {
    let kind = kind_of(path)
        .ok_or_else(|| anyhow!("{}: not a .safetensors, .npy or .npz file", path.display()))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow!("{}: file name is not UTF-8", path.display()))?;
    let parsed = parse_stem(stem);
    let (step, rank) = match (fixed, parsed) {
        (Some(sr), _) => sr,
        (None, Some((s, r, _))) => (s, r),
        (None, None) => bail!(
            "{}: name is not step<S>_rank<R>.{} (rename it, or give --step and --rank)",
            path.display(),
            path.extension().and_then(|e| e.to_str()).unwrap_or("")
        ),
    };
    let npy_name = match parsed {
        Some((_, _, Some(layer))) => layer.to_string(),
        Some((_, _, None)) => "grad".to_string(),
        None => stem.to_string(),
    };
    Ok(Source {
        path: path.to_path_buf(),
        step,
        rank,
        kind,
        npy_name,
    })
}

/// The files named by the arguments: directories contribute their gradient files, sorted.
fn collect(a: &ImportArgs) -> Result<Vec<Source>> {
    let fixed = a.step.zip(a.rank);
    let mut out = Vec::new();
    for p in &a.paths {
        if p.is_dir() {
            if fixed.is_some() {
                bail!(
                    "--step/--rank apply to files; {} is a directory",
                    p.display()
                );
            }
            let mut files: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("cannot read directory {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && kind_of(f).is_some())
                .collect();
            files.sort();
            if files.is_empty() {
                bail!(
                    "{}: no .safetensors, .npy or .npz files in this directory",
                    p.display()
                );
            }
            for f in files {
                out.push(source(&f, None)?);
            }
        } else if p.exists() {
            out.push(source(p, fixed)?);
        } else {
            bail!("{}: no such file or directory", p.display());
        }
    }
    Ok(out)
}

pub fn run(a: &ImportArgs) -> Result<()> {
    let sources = collect(a)?;
    // Before any file is read: the output must not be one of the files to import.
    let inputs: Vec<_> = sources
        .iter()
        .map(|s| ("DIR|FILE", Some(s.path.as_path())))
        .collect();
    gradkit_core::paths::check_distinct(&inputs, &[("-o", a.output.as_deref())])?;
    let mut groups: BTreeMap<(u32, u32), Vec<&Source>> = BTreeMap::new();
    for s in &sources {
        groups.entry((s.step, s.rank)).or_default().push(s);
    }
    let out = Output::from_arg(a.output.as_deref())?;
    let ranks: std::collections::BTreeSet<u32> = groups.keys().map(|k| k.1).collect();
    let mut meta = Meta::producer("gradtrace");
    meta.set("method", "import")
        .set("world_size", ranks.len())
        .set("files", sources.len());
    let pb = cli::progress("import", groups.len() as u64, a.quiet);
    let mut w = TableWriter::<TensorRow>::create(&out, &meta)?;
    let mut order: Option<Vec<String>> = None;
    let mut reg = LayerRegistry::default();
    for (&(step, rank), files) in &groups {
        let mut tensors = Vec::new();
        let mut npy = Vec::new();
        for s in files {
            let read = read_file(s).with_context(|| format!("in {}", s.path.display()))?;
            if s.kind == Kind::Npy {
                npy.extend(read);
            } else {
                tensors.extend(read);
            }
        }
        npy.sort_by(|x, y| x.name.cmp(&y.name));
        tensors.extend(npy);
        let names: Vec<String> = tensors.iter().map(|t| t.name.clone()).collect();
        let order = order.get_or_insert_with(|| {
            let mut n = names.clone();
            if a.order == Order::Name {
                n.sort();
            }
            n
        });
        check_same_layers(order, &names, step, rank, files)?;
        let mut by_name: BTreeMap<String, Tensor> =
            tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut rows = Vec::with_capacity(order.len());
        for (id, name) in order.iter().enumerate() {
            let t = by_name.remove(name).expect("checked above");
            let row = TensorRow {
                step,
                rank,
                layer_id: id as u32,
                layer: t.name,
                numel: t.shape.iter().map(|&d| d as u64).product(),
                shape: Some(t.shape),
                indices: None,
                values: t.values,
            };
            validate_tensor_row(&row, a.allow_nonfinite)
                .and_then(|_| reg.check(&row))
                .with_context(|| format!("in {}", files[0].path.display()))?;
            rows.push(row);
        }
        w.write(&rows)?;
        pb.inc(1);
    }
    w.finish()?;
    pb.finish_and_clear();
    Ok(())
}

fn check_same_layers(
    want: &[String],
    have: &[String],
    step: u32,
    rank: u32,
    files: &[&Source],
) -> Result<()> {
    let file = files[0].path.display();
    let mut seen = std::collections::HashSet::new();
    if let Some(d) = have.iter().find(|n| !seen.insert(n.as_str())) {
        bail!("tensor `{d}` appears twice for step {step} rank {rank} (in {file})");
    }
    if let Some(m) = want.iter().find(|n| !seen.contains(n.as_str())) {
        bail!("step {step} rank {rank} has no tensor `{m}`, which the first step/rank has (in {file})");
    }
    if let Some(x) = have.iter().find(|n| !want.contains(n)) {
        bail!(
            "step {step} rank {rank} has tensor `{x}`, which the first step/rank lacks (in {file})"
        );
    }
    Ok(())
}

fn read_file(s: &Source) -> Result<Vec<Tensor>> {
    match s.kind {
        Kind::Safetensors => read_safetensors(&s.path),
        Kind::Npy => {
            let f = std::fs::File::open(&s.path).context("cannot open")?;
            let npy = npyz::NpyFile::new(std::io::BufReader::new(f))
                .map_err(|e| anyhow!("not a .npy file ({e})"))?;
            Ok(vec![npy_tensor(s.npy_name.clone(), npy)?])
        }
        Kind::Npz => {
            let mut z = npyz::npz::NpzArchive::open(&s.path)
                .map_err(|e| anyhow!("not a .npz file ({e})"))?;
            // Archive order (numpy.savez writes the arrays in the order it is given them).
            let names: Vec<String> = (0..z.zip_archive().len())
                .filter_map(|i| {
                    let f = z.zip_archive().by_index(i).ok()?;
                    npyz::npz::array_name_from_file_name(f.name()).map(str::to_string)
                })
                .collect();
            let mut out = Vec::with_capacity(names.len());
            for n in names {
                let npy = z
                    .by_name(&n)
                    .map_err(|e| anyhow!("array `{n}`: {e}"))?
                    .ok_or_else(|| anyhow!("array `{n}` vanished"))?;
                out.push(npy_tensor(n, npy)?);
            }
            Ok(out)
        }
    }
}

fn shape_u32(name: &str, shape: impl IntoIterator<Item = u64>) -> Result<Vec<u32>> {
    shape
        .into_iter()
        .map(|d| {
            u32::try_from(d).map_err(|_| anyhow!("tensor `{name}`: dimension {d} exceeds u32"))
        })
        .collect()
}

fn npy_tensor<R: Read>(name: String, npy: npyz::NpyFile<R>) -> Result<Tensor> {
    use npyz::{DType, TypeChar};
    if npy.order() == npyz::Order::Fortran {
        bail!("array `{name}` is in Fortran order; save numpy.ascontiguousarray(a) instead");
    }
    let shape = shape_u32(&name, npy.shape().iter().copied())?;
    let dtype = npy.dtype();
    let values = match &dtype {
        DType::Plain(ts) if ts.type_char() == TypeChar::Float => match ts.size_field() {
            4 => npy.into_vec::<f32>()?,
            8 => npy
                .into_vec::<f64>()?
                .into_iter()
                .map(|v| v as f32)
                .collect(),
            2 => npy
                .into_vec::<npyz::half::f16>()?
                .into_iter()
                .map(f32::from)
                .collect(),
            _ => bail!(unsupported(&name, &dtype.descr())),
        },
        _ => bail!(unsupported(&name, &dtype.descr())),
    };
    Ok(Tensor {
        name,
        shape,
        values,
    })
}

fn unsupported(name: &str, dtype: &str) -> String {
    format!(
        "tensor `{name}` has dtype {dtype}; gradtrace import accepts float32, float64, float16 and bfloat16"
    )
}

fn read_safetensors(path: &Path) -> Result<Vec<Tensor>> {
    use safetensors::Dtype;
    let buf = std::fs::read(path).context("cannot read")?;
    let st = safetensors::SafeTensors::deserialize(&buf)
        .map_err(|e| anyhow!("not a .safetensors file ({e})"))?;
    let mut views = st.tensors();
    // Data order: the order in which the tensors lie in the file.
    views.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let mut out = Vec::with_capacity(views.len());
    for (name, v) in views {
        let data = v.data();
        let values: Vec<f32> = match v.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| npyz::half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            other => bail!(unsupported(&name, &format!("{other:?}"))),
        };
        let shape = shape_u32(&name, v.shape().iter().map(|&d| d as u64))?;
        out.push(Tensor {
            name,
            shape,
            values,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse_stem;

    #[test]
    fn file_names_give_step_rank_and_layer() {
        assert_eq!(parse_stem("step12_rank3"), Some((12, 3, None)));
        assert_eq!(
            parse_stem("step0_rank1.fc1.weight"),
            Some((0, 1, Some("fc1.weight")))
        );
        assert_eq!(parse_stem("grads"), None);
        assert_eq!(parse_stem("stepx_rank1"), None);
    }
}
