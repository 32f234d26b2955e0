//! The `values` column of a `tensor/1` trace decoded into buffers kept across record batches
//! (docs/MEMORY.md, "The reader"): the streaming reader ([`crate::io::TensorStream`])
//! reads every other column through arrow and this one with the parquet crate's typed column
//! reader, so that a steady-state batch decodes its levels and values into memory it already
//! has instead of three fresh buffers as large as the batch.
//!
//! Only the layout every known writer uses (gradkit, pyarrow, polars) takes this path: a
//! top-level three-level list (`values` / repeated group / FLOAT element, the list and the
//! element each required or optional) whose Arrow type is `List<Float32>`. Anything else is
//! read by arrow as before ([`ValuesLayout::of`] returns `None`).

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::{bail, Result};
use arrow_array::{Array, ArrayRef, Float32Array, ListArray, RecordBatch};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, FieldRef, Schema};
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::ProjectionMask;
use parquet::basic::{Repetition, Type as PhysicalType};
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::FloatType;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::{ColumnDescPtr, Type};

use crate::tables::{batch_to_rows_at, TensorRow};

/// The most bytes a staging buffer keeps between batches: the reader's batches are about
/// `STREAM_BATCH_BYTES` (2 MiB) of values; a larger one is a single big row.
const KEEP: usize = 64 << 20;

/// Where the `values` column is and how its definition levels read.
#[derive(Clone)]
pub(crate) struct ValuesLayout {
    /// The leaf column.
    leaf: usize,
    /// The top-level field.
    root: usize,
    descr: ColumnDescPtr,
    /// Definition levels below this are a null list (0 or 1: the list is optional).
    list_def: i16,
    /// Levels below this (and at least `list_def`) are an empty list.
    item_def: i16,
    /// Levels below this (and at least `item_def`) are a null item.
    value_def: i16,
}

/// Whether a field is required or optional (not repeated).
fn single(t: &Type) -> Option<bool> {
    let info = t.get_basic_info();
    match info.has_repetition().then(|| info.repetition()) {
        Some(Repetition::REQUIRED) => Some(false),
        Some(Repetition::OPTIONAL) => Some(true),
        _ => None,
    }
}

impl ValuesLayout {
    /// The layout of `values` in a file whose columns were checked against `tensor/1`, or
    /// `None` where the file's layout is not the plain list of FLOAT this reader decodes.
    pub(crate) fn of(metadata: &ArrowReaderMetadata) -> Option<Self> {
        let field = metadata.schema().field_with_name("values").ok()?;
        match field.data_type() {
            DataType::List(item) if item.data_type() == &DataType::Float32 => {}
            _ => return None,
        }
        let schema = metadata.parquet_schema();
        let root = schema
            .root_schema()
            .get_fields()
            .iter()
            .position(|f| f.name() == "values")?;
        let mut leaves =
            (0..schema.num_columns()).filter(|&i| schema.get_column_root_idx(i) == root);
        let (leaf, None) = (leaves.next()?, leaves.next()) else {
            return None;
        };
        let descr = schema.column(leaf);
        if descr.physical_type() != PhysicalType::FLOAT || descr.max_rep_level() != 1 {
            return None;
        }
        let top = schema.get_column_root(leaf);
        let list_optional = single(top)?;
        let [repeated] = top.get_fields() else {
            return None;
        };
        let info = repeated.get_basic_info();
        if !repeated.is_group()
            || !info.has_repetition()
            || info.repetition() != Repetition::REPEATED
        {
            return None;
        }
        let [element] = repeated.get_fields() else {
            return None;
        };
        if !element.is_primitive() {
            return None;
        }
        let item_optional = single(element)?;
        let list_def = list_optional as i16;
        let item_def = list_def + 1;
        let value_def = item_def + item_optional as i16;
        (value_def == descr.max_def_level()).then_some(ValuesLayout {
            leaf,
            root,
            descr,
            list_def,
            item_def,
            value_def,
        })
    }

    /// Every top-level column but `values`: what arrow reads alongside this reader.
    pub(crate) fn others(&self, metadata: &ArrowReaderMetadata) -> ProjectionMask {
        let schema = metadata.parquet_schema();
        let n = schema.root_schema().get_fields().len();
        ProjectionMask::roots(schema, (0..n).filter(|&r| r != self.root))
    }
}

/// One row's share of the staging buffer.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
    null_list: bool,
    null_item: bool,
}

/// Reads `values` record by record over a sequence of row groups, into levels and staging
/// buffers that are cleared, not freed, between batches.
pub(crate) struct ValuesReader<R: ChunkReader + 'static> {
    layout: ValuesLayout,
    src: Arc<R>,
    metadata: Arc<ParquetMetaData>,
    groups: VecDeque<usize>,
    column: Option<ColumnReaderImpl<FloatType>>,
    def: Vec<i16>,
    rep: Vec<i16>,
    values: Vec<f32>,
    spans: Vec<Span>,
}

impl<R: ChunkReader + 'static> ValuesReader<R> {
    /// A reader of the row groups `groups`, in that order (the order arrow reads them in).
    pub(crate) fn new(
        layout: ValuesLayout,
        src: R,
        metadata: Arc<ParquetMetaData>,
        groups: Vec<usize>,
    ) -> Self {
        ValuesReader {
            layout,
            src: Arc::new(src),
            metadata,
            groups: groups.into(),
            column: None,
            def: Vec::new(),
            rep: Vec::new(),
            values: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Decodes the next `n` rows of `values` (the rows of the batch arrow just read of the
    /// other columns; a row is never split between batches).
    pub(crate) fn read(&mut self, n: usize) -> Result<()> {
        // Buffers grown past KEEP by one huge row are given back rather than held to the end.
        if self.values.capacity() * 4 > KEEP || self.def.capacity() * 2 > KEEP {
            (self.def, self.rep, self.values) = (Vec::new(), Vec::new(), Vec::new());
        }
        self.def.clear();
        self.rep.clear();
        self.values.clear();
        let mut got = 0;
        while got < n {
            let column = match &mut self.column {
                Some(c) => c,
                None => {
                    let Some(g) = self.groups.pop_front() else {
                        bail!("column `values` has {got} rows where the other columns have {n}");
                    };
                    let group = self.metadata.row_group(g);
                    let pages = SerializedPageReader::new(
                        self.src.clone(),
                        group.column(self.layout.leaf),
                        group.num_rows().max(0) as usize,
                        None,
                    )?;
                    self.column.insert(ColumnReaderImpl::new(
                        self.layout.descr.clone(),
                        Box::new(pages),
                    ))
                }
            };
            let (records, _, _) = column.read_records(
                n - got,
                Some(&mut self.def),
                Some(&mut self.rep),
                &mut self.values,
            )?;
            got += records;
            if got < n {
                // The row group is used up.
                self.column = None;
            }
        }
        self.cut(n)
    }

    /// The rows' spans of the staging buffer, from the levels.
    fn cut(&mut self, n: usize) -> Result<()> {
        let l = &self.layout;
        self.spans.clear();
        let mut next = 0;
        for (&d, &r) in self.def.iter().zip(&self.rep) {
            if r == 0 {
                self.spans.push(Span {
                    start: next,
                    len: 0,
                    null_list: d < l.list_def,
                    null_item: false,
                });
            }
            let Some(s) = self.spans.last_mut() else {
                bail!("column `values`: the first level of a row repeats a list");
            };
            if d >= l.value_def {
                s.len += 1;
                next += 1;
            } else if d >= l.item_def {
                s.null_item = true;
            }
        }
        if self.spans.len() != n || next != self.values.len() {
            bail!(
                "column `values`: {} rows and {} values decoded where {} rows and {} values were expected",
                self.spans.len(),
                self.values.len(),
                n,
                next
            );
        }
        Ok(())
    }

    /// A stand-in `values` column for the batch just read: its null lists and (one per row
    /// that has any) null items where the file has them, and no values, so that the table's
    /// checks ([`crate::tables::batch_to_rows_at`]) report them as for a column read by arrow.
    pub(crate) fn stand_in(&self) -> Result<ArrayRef> {
        let lens = self.spans.iter().map(|s| s.null_item as usize);
        let items = self.spans.iter().filter(|s| s.null_item).count();
        let child = Float32Array::new(vec![0.0; items].into(), Some(NullBuffer::new_null(items)));
        let nulls = self
            .spans
            .iter()
            .any(|s| s.null_list)
            .then(|| NullBuffer::from_iter(self.spans.iter().map(|s| !s.null_list)));
        Ok(Arc::new(ListArray::try_new(
            Arc::new(Field::new_list_field(DataType::Float32, true)),
            OffsetBuffer::from_lengths(lens),
            Arc::new(child),
            nulls,
        )?))
    }

    /// Gives each row its values: one exact-size copy of its span (`rows` are the batch's
    /// rows, in order).
    pub(crate) fn fill(&self, rows: &mut [TensorRow]) {
        for (r, s) in rows.iter_mut().zip(&self.spans) {
            r.values = self.values[s.start..s.start + s.len].to_vec();
        }
    }
}

/// The rows of batch `b` of the other columns (row `first_row` of the file first), with their
/// values from `v`, checked as [`crate::tables::batch_to_rows_at`] checks a whole batch.
pub(crate) fn batch_rows<R: ChunkReader + 'static>(
    b: &RecordBatch,
    v: &mut ValuesReader<R>,
    first_row: usize,
) -> Result<Vec<TensorRow>> {
    v.read(b.num_rows())?;
    let mut fields: Vec<FieldRef> = b.schema().fields().iter().cloned().collect();
    let mut cols = b.columns().to_vec();
    let stand_in = v.stand_in()?;
    fields.push(Arc::new(Field::new(
        "values",
        stand_in.data_type().clone(),
        true,
    )));
    cols.push(stand_in);
    let whole = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?;
    let mut rows = batch_to_rows_at::<TensorRow>(&whole, first_row)?;
    v.fill(&mut rows);
    Ok(rows)
}
