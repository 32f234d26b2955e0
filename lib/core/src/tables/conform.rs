//! Reading other writers' files (docs/FORMAT.md § What a reader checks, § What other writers
//! produce): the schema check ([`check_schema`]), the casts of other writers' physical types
//! to the tables' canonical ones ([`conform`], [`normalize_array`]), and the batch-to-rows
//! conversion every reader calls ([`batch_to_rows`], [`batch_to_rows_at`]).
//!
//! pandas, polars and pyarrow write the same logical columns with other Arrow types: LargeUtf8
//! and LargeList (polars), a column typed Null when every row is null (pandas, e.g. `indices`
//! of a dense-only trace), Int64 for integers (a DataFrame built from Python ints), Float64 for
//! an integer column with nulls (pandas). Every reader casts them here, once per record batch,
//! and only where no value changes: integers are range-checked, whole-number floats become
//! integers, Float32 widens to Float64; Float64 never narrows to Float32 (the format stores
//! gradients as float32, and a silent rounding would make two "equal" files differ).

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, UInt32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, ListArray, PrimitiveArray, RecordBatch, StringArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema};

use super::columns::{col, is_optional};
use super::Table;

/// Checks that `actual` has every column of `expected` with the expected Arrow type or one
/// that [`conform`] casts to it without changing a value (list item names and nullability
/// are not compared: pyarrow and arrow-rs differ there). Extra columns are ignored.
pub fn check_schema(expected: &Schema, actual: &Schema) -> Result<()> {
    for f in expected.fields() {
        if is_optional(f) && actual.field_with_name(f.name()).is_err() {
            continue;
        }
        let a = actual.field_with_name(f.name()).map_err(|_| {
            anyhow!(
                "missing column `{}` (expected {})",
                f.name(),
                type_name(f.data_type())
            )
        })?;
        if !castable(f.data_type(), a.data_type(), f.is_nullable()) {
            bail!(
                "column `{}` has type {}, expected {}{}",
                f.name(),
                type_name(a.data_type()),
                type_name(f.data_type()),
                narrowing_hint(f.data_type(), a.data_type())
            );
        }
    }
    Ok(())
}

/// `t` with the representation-only variants replaced by the canonical type: LargeUtf8,
/// Utf8View and dictionary-encoded strings read as Utf8; LargeList and FixedSizeList as List.
fn canonical_type(t: &DataType) -> DataType {
    match t {
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Dictionary(_, v) if canonical_type(v) == DataType::Utf8 => DataType::Utf8,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            DataType::List(Arc::new(Field::new_list_field(
                canonical_type(f.data_type()),
                true,
            )))
        }
        other => other.clone(),
    }
}

/// Whether [`conform`] turns a column of type `actual` into `expected` (data permitting).
fn castable(expected: &DataType, actual: &DataType, nullable: bool) -> bool {
    match (expected, &canonical_type(actual)) {
        (_, DataType::Null) => nullable,
        (DataType::List(e), DataType::List(g)) => castable(e.data_type(), g.data_type(), false),
        (DataType::UInt32 | DataType::UInt64, g) => {
            g.is_integer() || matches!(g, DataType::Float32 | DataType::Float64)
        }
        (DataType::Float64, DataType::Float32) => true,
        (e, g) => e == g,
    }
}

/// What to do about a Float64 column where Float32 is expected.
fn narrowing_hint(expected: &DataType, actual: &DataType) -> &'static str {
    let item = |t: &DataType| match canonical_type(t) {
        DataType::List(f) => f.data_type().clone(),
        other => other,
    };
    if item(expected) == DataType::Float32 && item(actual) == DataType::Float64 {
        " (gradkit stores gradients as float32 and does not round them on read: cast before \
         writing, e.g. numpy `.astype(np.float32)`, pyarrow `pa.list_(pa.float32())`, polars \
         `pl.List(pl.Float32)`)"
    } else {
        ""
    }
}

/// `a` in its canonical representation (see [`canonical_type`]); every value unchanged.
/// Also what readers of files other than the three tables use (gradtrain's `--data`).
pub fn normalize_array(a: &ArrayRef) -> Result<ArrayRef> {
    Ok(match a.data_type() {
        DataType::LargeUtf8 => {
            let s = a.as_string::<i64>();
            check_offset(s.value_offsets()[s.len()] - s.value_offsets()[0])?;
            Arc::new(s.iter().collect::<StringArray>())
        }
        DataType::Utf8View => {
            let s = a.as_string_view();
            let bytes: usize = s.iter().map(|v| v.map_or(0, str::len)).sum();
            check_offset(bytes as i64)?;
            Arc::new(s.iter().collect::<StringArray>())
        }
        DataType::Dictionary(..) => {
            let d = a.as_any_dictionary();
            let values = normalize_array(d.values())?;
            let Some(strs) = values.as_string_opt::<i32>() else {
                return Ok(a.clone());
            };
            let keys = d.normalized_keys();
            let out: StringArray = (0..a.len())
                .map(|i| (a.is_valid(i) && strs.is_valid(keys[i])).then(|| strs.value(keys[i])))
                .collect();
            check_offset(out.value_offsets()[out.len()] as i64)?;
            Arc::new(out)
        }
        DataType::List(f) => {
            let l = a.as_list::<i32>();
            let child = normalize_array(l.values())?;
            if child.data_type() == f.data_type() {
                return Ok(a.clone());
            }
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                l.offsets().clone(),
                child,
                l.nulls().cloned(),
            )?)
        }
        DataType::LargeList(_) => {
            let l = a.as_list::<i64>();
            let o = l.value_offsets();
            let (o0, on) = (o[0], o[l.len()]);
            check_offset(on - o0)?;
            let child = normalize_array(&l.values().slice(o0 as usize, (on - o0) as usize))?;
            let offsets: Vec<i32> = o.iter().map(|x| (x - o0) as i32).collect();
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                OffsetBuffer::new(offsets.into()),
                child,
                l.nulls().cloned(),
            )?)
        }
        DataType::FixedSizeList(_, n) => {
            let l = a.as_fixed_size_list();
            let n = *n as usize;
            check_offset((n * l.len()) as i64)?;
            let child = normalize_array(&l.values().slice(l.offset() * n, n * l.len()))?;
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                OffsetBuffer::from_lengths(std::iter::repeat_n(n, l.len())),
                child,
                l.nulls().cloned(),
            )?)
        }
        _ => a.clone(),
    })
}

/// Batches are decoded a few MiB at a time, so 32-bit offsets always suffice; checked anyway.
fn check_offset(len: i64) -> Result<()> {
    if len > i32::MAX as i64 {
        bail!("a record batch holds {len} list items or string bytes, more than 2^31 - 1");
    }
    Ok(())
}

/// Where a value sits, for a message: `column `x`, row R` (and `item I` inside a list).
type Place<'a> = &'a dyn Fn(usize) -> String;

/// Integers of type `S` as `U`, each range-checked (a null slot keeps a zero under its null).
fn narrow_ints<S, U>(a: &dyn Array, at: Place) -> Result<ArrayRef>
where
    S: ArrowPrimitiveType,
    S::Native: Into<i128>,
    U: ArrowPrimitiveType,
    U::Native: TryFrom<i128>,
{
    let p = a.as_primitive::<S>();
    let mut out = Vec::with_capacity(p.len());
    for (i, v) in p.values().iter().enumerate() {
        let x: i128 = (*v).into();
        match U::Native::try_from(x) {
            Ok(y) => out.push(y),
            Err(_) if p.is_null(i) => out.push(U::Native::default()),
            Err(_) => bail!(
                "{}: value {x} does not fit {} (the file stores {})",
                at(i),
                U::DATA_TYPE,
                S::DATA_TYPE
            ),
        }
    }
    Ok(Arc::new(PrimitiveArray::<U>::new(
        out.into(),
        p.nulls().cloned(),
    )))
}

/// Floats of type `S` holding whole numbers (pandas' integer column with nulls) as `U`.
fn whole_floats<S, U>(a: &dyn Array, at: Place) -> Result<ArrayRef>
where
    S: ArrowPrimitiveType,
    S::Native: Into<f64>,
    U: ArrowPrimitiveType,
    U::Native: TryFrom<i128>,
{
    let p = a.as_primitive::<S>();
    let mut out = Vec::with_capacity(p.len());
    for (i, v) in p.values().iter().enumerate() {
        let x: f64 = (*v).into();
        // Below 2^64 a whole f64 converts to i128 exactly.
        let y = (x.fract() == 0.0 && x.abs() < 2f64.powi(64))
            .then(|| U::Native::try_from(x as i128).ok())
            .flatten();
        match y {
            Some(y) => out.push(y),
            None if p.is_null(i) => out.push(U::Native::default()),
            None => bail!(
                "{}: value {x} is not a whole number that fits {} (the file stores {})",
                at(i),
                U::DATA_TYPE,
                S::DATA_TYPE
            ),
        }
    }
    Ok(Arc::new(PrimitiveArray::<U>::new(
        out.into(),
        p.nulls().cloned(),
    )))
}

/// Any integer (or whole-number float) array as `U` (UInt32 or UInt64), range-checked.
fn to_unsigned<U>(a: &dyn Array, at: Place) -> Result<ArrayRef>
where
    U: ArrowPrimitiveType,
    U::Native: TryFrom<i128>,
{
    use arrow_array::types::*;
    match a.data_type() {
        DataType::Int8 => narrow_ints::<Int8Type, U>(a, at),
        DataType::Int16 => narrow_ints::<Int16Type, U>(a, at),
        DataType::Int32 => narrow_ints::<Int32Type, U>(a, at),
        DataType::Int64 => narrow_ints::<Int64Type, U>(a, at),
        DataType::UInt8 => narrow_ints::<UInt8Type, U>(a, at),
        DataType::UInt16 => narrow_ints::<UInt16Type, U>(a, at),
        DataType::UInt32 => narrow_ints::<UInt32Type, U>(a, at),
        DataType::UInt64 => narrow_ints::<UInt64Type, U>(a, at),
        DataType::Float32 => whole_floats::<Float32Type, U>(a, at),
        DataType::Float64 => whole_floats::<Float64Type, U>(a, at),
        other => bail!("{}: type {other} is not an integer", at(0)),
    }
}

/// One column (already normalised) as `expected`; `at` names a row of the column.
fn cast_values(expected: &DataType, a: &ArrayRef, at: Place) -> Result<ArrayRef> {
    if a.data_type() == expected {
        return Ok(a.clone());
    }
    Ok(match (expected, a.data_type()) {
        (e, DataType::Null) => arrow_array::new_null_array(e, a.len()),
        (DataType::UInt32, _) => to_unsigned::<UInt32Type>(a.as_ref(), at)?,
        (DataType::UInt64, _) => to_unsigned::<UInt64Type>(a.as_ref(), at)?,
        (DataType::Float64, DataType::Float32) => {
            let p = a.as_primitive::<Float32Type>();
            Arc::new(PrimitiveArray::<Float64Type>::new(
                p.values().iter().map(|&v| v as f64).collect(),
                p.nulls().cloned(),
            ))
        }
        (DataType::List(e), DataType::List(g)) if e.data_type() == g.data_type() => a.clone(),
        (DataType::List(e), DataType::List(_)) => {
            let l = a.as_list::<i32>();
            let o = l.value_offsets();
            let o0 = o[0];
            let child = l.values().slice(o0 as usize, (o[l.len()] - o0) as usize);
            // Item j of the child lies in the last row whose list starts at or before it.
            let item_at = |j: usize| {
                let row = o.partition_point(|&x| ((x - o0) as usize) <= j) - 1;
                format!("{}, item {}", at(row), j - (o[row] - o0) as usize)
            };
            let child = cast_values(e.data_type(), &child, &item_at)?;
            let offsets: Vec<i32> = o.iter().map(|x| x - o0).collect();
            Arc::new(ListArray::try_new(
                Arc::new(Field::new_list_field(child.data_type().clone(), true)),
                OffsetBuffer::new(offsets.into()),
                child,
                l.nulls().cloned(),
            )?)
        }
        (e, g) => bail!(
            "{}: type {} cannot be read as {}",
            at(0),
            type_name(g),
            type_name(e)
        ),
    })
}

/// `batch` with the columns of `expected`, in its order, each cast to the canonical type
/// (see the module docs); `first_row` is the batch's first row in the file, so that a
/// value that does not fit is reported by column and row. Batches already in canonical types
/// (every gradkit file) pass through without a copy.
pub fn conform(expected: &Schema, batch: &RecordBatch, first_row: usize) -> Result<RecordBatch> {
    check_schema(expected, batch.schema().as_ref())?;
    let mut fields = Vec::with_capacity(expected.fields().len());
    let mut cols = Vec::with_capacity(expected.fields().len());
    for f in expected.fields() {
        if is_optional(f) && batch.column_by_name(f.name()).is_none() {
            fields.push(Field::new(f.name(), f.data_type().clone(), true));
            cols.push(arrow_array::new_null_array(f.data_type(), batch.num_rows()));
            continue;
        }
        let a = normalize_array(col(batch, f.name())?)?;
        let at = |i: usize| format!("column `{}`, row {}", f.name(), first_row + i);
        let a = cast_values(f.data_type(), &a, &at)?;
        // Nullable fields: the tables' own checks (`no_nulls`) name a null where it is not
        // allowed, which a RecordBatch constructor would only report as a generic error.
        fields.push(Field::new(f.name(), a.data_type().clone(), true));
        cols.push(a);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

fn type_name(t: &DataType) -> String {
    match t {
        DataType::List(f) => format!("List<{}>", type_name(f.data_type())),
        DataType::LargeList(f) => format!("LargeList<{}>", type_name(f.data_type())),
        other => format!("{other}"),
    }
}

/// Checks that a batch's schema matches `T` and converts it, naming the problem on failure.
pub fn batch_to_rows<T: Table>(batch: &RecordBatch) -> Result<Vec<T>> {
    batch_to_rows_at(batch, 0)
}

/// [`batch_to_rows`] of a batch whose first row is row `first_row` of its file: the other
/// writers' types are cast here ([`conform`]), and a value that does not fit names its row.
pub fn batch_to_rows_at<T: Table>(batch: &RecordBatch, first_row: usize) -> Result<Vec<T>> {
    let batch = conform(&T::schema(), batch, first_row)?;
    T::from_batch(&batch).context("reading rows")
}
