//! `tensor/1` (docs/FORMAT.md § tensor/1): [`TensorRow`], its conversion to and from Arrow
//! record batches, and the checks of its invariants, one row at a time
//! ([`validate_tensor_row`]) and across rows ([`LayerRegistry`]).

use std::sync::Arc;

use anyhow::{bail, Result};
use arrow_array::builder::{ListBuilder, UInt32Builder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt32Type};
use arrow_array::{Float32Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::columns::{col, list_array, list_field, list_rows, no_nulls, strings, u32s, u64s};
use super::{SchemaKind, Table};

/// One row of `tensor/1`: the gradient (or selection, or reduced result) of one layer held by
/// one rank at one step. `indices == None` is a dense row.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRow {
    pub step: u32,
    pub rank: u32,
    pub layer_id: u32,
    pub layer: String,
    pub numel: u64,
    pub shape: Option<Vec<u32>>,
    pub indices: Option<Vec<u32>>,
    pub values: Vec<f32>,
}

impl TensorRow {
    pub fn is_dense(&self) -> bool {
        self.indices.is_none()
    }
    /// Number of stored values (numel for a dense row, nnz for a sparse one).
    pub fn stored(&self) -> usize {
        self.values.len()
    }
    /// Number of non-zero values.
    pub fn nnz(&self) -> usize {
        self.values.iter().filter(|v| **v != 0.0).count()
    }
    /// This row without its values (a sparse row keeps an empty `indices`, so it still reads
    /// as sparse): what the whole-step checks (`io::check_step`) look at, for a step whose
    /// values are handed out as they are read.
    pub fn key(&self) -> TensorRow {
        TensorRow {
            layer: self.layer.clone(),
            shape: self.shape.clone(),
            indices: self.indices.as_ref().map(|_| Vec::new()),
            values: Vec::new(),
            ..*self
        }
    }

    /// The dense vector this row represents.
    pub fn to_dense(&self) -> Vec<f32> {
        match &self.indices {
            None => self.values.clone(),
            Some(idx) => {
                let mut d = vec![0.0; self.numel as usize];
                for (&i, &v) in idx.iter().zip(&self.values) {
                    d[i as usize] = v;
                }
                d
            }
        }
    }
}

impl Table for TensorRow {
    const KIND: SchemaKind = SchemaKind::Tensor;
    fn as_tensor(&self) -> Option<&TensorRow> {
        Some(self)
    }
    fn payload_bytes(&self) -> usize {
        64 + 4 * (self.values.len() + self.indices.as_ref().map_or(0, |i| i.len()))
    }
    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("step", DataType::UInt32, false),
            Field::new("rank", DataType::UInt32, false),
            Field::new("layer_id", DataType::UInt32, false),
            Field::new("layer", DataType::Utf8, false),
            Field::new("numel", DataType::UInt64, false),
            list_field("shape", DataType::UInt32, true),
            list_field("indices", DataType::UInt32, true),
            list_field("values", DataType::Float32, false),
        ]))
    }

    fn to_batch(rows: &[Self]) -> Result<RecordBatch> {
        let step = UInt32Array::from_iter_values(rows.iter().map(|r| r.step));
        let rank = UInt32Array::from_iter_values(rows.iter().map(|r| r.rank));
        let layer_id = UInt32Array::from_iter_values(rows.iter().map(|r| r.layer_id));
        let layer = StringArray::from_iter_values(rows.iter().map(|r| r.layer.as_str()));
        let numel = UInt64Array::from_iter_values(rows.iter().map(|r| r.numel));
        let mut shape = ListBuilder::new(UInt32Builder::new())
            .with_field(Arc::new(Field::new_list_field(DataType::UInt32, false)));
        for r in rows {
            match &r.shape {
                Some(s) => {
                    shape.values().append_slice(s);
                    shape.append(true)
                }
                None => shape.append(false),
            }
        }
        let idx_total: usize = rows
            .iter()
            .map(|r| r.indices.as_ref().map_or(0, |i| i.len()))
            .sum();
        let mut idx = Vec::with_capacity(idx_total);
        for r in rows {
            if let Some(i) = &r.indices {
                idx.extend_from_slice(i);
            }
        }
        let idx_nulls =
            arrow_buffer::NullBuffer::from_iter(rows.iter().map(|r| r.indices.is_some()));
        let indices = list_array(
            DataType::UInt32,
            rows.iter()
                .map(|r| r.indices.as_ref().map_or(0, |i| i.len())),
            UInt32Array::from(idx),
            Some(idx_nulls),
        );
        let val_total: usize = rows.iter().map(|r| r.values.len()).sum();
        let mut vals = Vec::with_capacity(val_total);
        for r in rows {
            vals.extend_from_slice(&r.values);
        }
        let values = list_array(
            DataType::Float32,
            rows.iter().map(|r| r.values.len()),
            Float32Array::from(vals),
            None,
        );
        Ok(RecordBatch::try_new(
            Self::schema(),
            vec![
                Arc::new(step),
                Arc::new(rank),
                Arc::new(layer_id),
                Arc::new(layer),
                Arc::new(numel),
                Arc::new(shape.finish()),
                indices,
                values,
            ],
        )?)
    }

    fn into_batch(mut rows: Vec<Self>) -> Result<RecordBatch> {
        if rows.len() != 1 {
            return Self::to_batch(&rows);
        }
        // One row: its values become the batch's `values` buffer without a copy.
        let values = std::mem::take(&mut rows[0].values);
        let mut b = Self::to_batch(&rows)?;
        let n = values.len();
        let list = list_array(
            DataType::Float32,
            [n],
            Float32Array::new(values.into(), None),
            None,
        );
        let idx = b.schema().index_of("values")?;
        let mut cols = b.columns().to_vec();
        cols[idx] = list;
        b = RecordBatch::try_new(Self::schema(), cols)?;
        Ok(b)
    }

    fn from_batch(b: &RecordBatch) -> Result<Vec<Self>> {
        no_nulls(b, &["step", "rank", "layer_id", "layer", "numel", "values"])?;
        let step = u32s(b, "step")?;
        let rank = u32s(b, "rank")?;
        let layer_id = u32s(b, "layer_id")?;
        let layer = strings(b, "layer")?;
        let numel = u64s(b, "numel")?;
        let shape = col(b, "shape")?.as_list::<i32>();
        let indices = col(b, "indices")?.as_list::<i32>();
        if indices.values().null_count() > 0 || shape.values().null_count() > 0 {
            bail!("columns `indices`/`shape` have null list items");
        }
        let values = col(b, "values")?.as_list::<i32>();
        let rows = step
            .into_iter()
            .zip(rank)
            .zip(layer_id)
            .zip(layer)
            .zip(numel)
            .zip(list_rows::<UInt32Type>(shape))
            .zip(list_rows::<UInt32Type>(indices))
            .zip(list_rows::<Float32Type>(values))
            .map(
                |(((((((step, rank), layer_id), layer), numel), shape), indices), values)| {
                    TensorRow {
                        step,
                        rank,
                        layer_id,
                        layer,
                        numel,
                        shape,
                        indices,
                        values: values.unwrap_or_default(),
                    }
                },
            )
            .collect();
        Ok(rows)
    }
}

/// Validates the `tensor/1` invariants of one row (everything that does not need other rows).
pub fn validate_tensor_row(r: &TensorRow, allow_nonfinite: bool) -> Result<()> {
    let ctx = || format!("step {} rank {} layer `{}`", r.step, r.rank, r.layer);
    match &r.indices {
        None => {
            if r.values.len() as u64 != r.numel {
                bail!(
                    "column `values`: dense row has {} values but numel is {} ({})",
                    r.values.len(),
                    r.numel,
                    ctx()
                );
            }
        }
        Some(idx) => {
            if idx.len() != r.values.len() {
                bail!(
                    "column `values`: sparse row has {} values but {} indices ({})",
                    r.values.len(),
                    idx.len(),
                    ctx()
                );
            }
            if let Some(w) = idx.windows(2).position(|w| w[0] >= w[1]) {
                bail!(
                    "column `indices`: not strictly ascending at position {} ({} then {}) ({})",
                    w + 1,
                    idx[w],
                    idx[w + 1],
                    ctx()
                );
            }
            if let Some(&last) = idx.last() {
                if last as u64 >= r.numel {
                    bail!(
                        "column `indices`: index {last} out of range for numel {} ({})",
                        r.numel,
                        ctx()
                    );
                }
            }
        }
    }
    if let Some(s) = &r.shape {
        let prod: u64 = s.iter().map(|&d| d as u64).product();
        if prod != r.numel {
            bail!(
                "column `shape`: {:?} has {} elements but numel is {} ({})",
                s,
                prod,
                r.numel,
                ctx()
            );
        }
    }
    if !allow_nonfinite {
        if let Some(p) = r.values.iter().position(|v| !v.is_finite()) {
            bail!(
                "column `values`: non-finite value {} at position {p} ({}); pass --allow-nonfinite to accept",
                r.values[p],
                ctx()
            );
        }
    }
    Ok(())
}

/// Cross-row `tensor/1` check: a layer name has one `layer_id` and one `numel` everywhere.
#[derive(Default)]
pub struct LayerRegistry {
    by_name: std::collections::HashMap<String, (u32, u64)>,
    by_id: std::collections::HashMap<u32, String>,
}

impl LayerRegistry {
    pub fn check(&mut self, r: &TensorRow) -> Result<()> {
        if let Some(&(id, n)) = self.by_name.get(&r.layer) {
            if id != r.layer_id {
                bail!(
                    "column `layer_id`: layer `{}` has layer_id {} in one row and {} in another",
                    r.layer,
                    id,
                    r.layer_id
                );
            }
            if n != r.numel {
                bail!(
                    "column `numel`: layer `{}` has numel {} in one row and {} in another",
                    r.layer,
                    n,
                    r.numel
                );
            }
            return Ok(());
        }
        if let Some(other) = self.by_id.get(&r.layer_id) {
            bail!(
                "column `layer_id`: id {} names both `{}` and `{}`",
                r.layer_id,
                other,
                r.layer
            );
        }
        self.by_name.insert(r.layer.clone(), (r.layer_id, r.numel));
        self.by_id.insert(r.layer_id, r.layer.clone());
        Ok(())
    }
}
