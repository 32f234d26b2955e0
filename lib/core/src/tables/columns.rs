//! The Arrow column helpers the tables' conversions share: optional columns (the field
//! metadata key `gradkit.optional`, docs/FORMAT.md § metrics/1, "Older files"), list fields
//! and arrays, typed column reads, and the null checks of non-null columns (docs/FORMAT.md
//! § What a reader checks).

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, ListArray, RecordBatch};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field};

/// A column a reader does without: older files lack it (read as null) and new writers
/// always write it. Marked by the field metadata key `gradkit.optional`.
pub(super) fn optional(f: Field) -> Field {
    f.with_metadata(std::collections::HashMap::from([(
        "gradkit.optional".to_string(),
        "1".to_string(),
    )]))
}

/// Whether a column of a table's schema may be absent from a file (see [`optional`]).
pub fn is_optional(f: &Field) -> bool {
    f.metadata().contains_key("gradkit.optional")
}

pub(super) fn list_field(name: &str, item: DataType, nullable: bool) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new_list_field(item, false))),
        nullable,
    )
}

pub(super) fn list_array<T: Array + 'static>(
    item: DataType,
    lengths: impl IntoIterator<Item = usize>,
    values: T,
    nulls: Option<arrow_buffer::NullBuffer>,
) -> ArrayRef {
    Arc::new(ListArray::new(
        Arc::new(Field::new_list_field(item, false)),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(values),
        nulls,
    ))
}

pub(super) fn col<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| anyhow!("missing column `{name}`"))
}

pub(super) fn u32s(batch: &RecordBatch, name: &str) -> Result<Vec<u32>> {
    Ok(col(batch, name)?
        .as_primitive::<UInt32Type>()
        .values()
        .to_vec())
}
pub(super) fn u64s(batch: &RecordBatch, name: &str) -> Result<Vec<u64>> {
    Ok(col(batch, name)?
        .as_primitive::<UInt64Type>()
        .values()
        .to_vec())
}
pub(super) fn strings(batch: &RecordBatch, name: &str) -> Result<Vec<String>> {
    let a = col(batch, name)?.as_string::<i32>();
    Ok((0..a.len()).map(|i| a.value(i).to_string()).collect())
}

/// Rejects nulls in a column the contract declares non-null (pyarrow writes nullable columns).
pub(super) fn no_nulls(batch: &RecordBatch, names: &[&str]) -> Result<()> {
    for n in names {
        let c = col(batch, n)?;
        if c.null_count() > 0 {
            bail!("column `{n}` has null values; the format requires a value in every row");
        }
        if let DataType::List(_) = c.data_type() {
            if c.as_list::<i32>().values().null_count() > 0 {
                bail!("column `{n}` has null list items");
            }
        }
    }
    Ok(())
}

/// The rows of a list column whose items are primitive `T` (None for a null row).
pub(super) fn list_rows<T: arrow_array::ArrowPrimitiveType>(
    a: &ListArray,
) -> impl Iterator<Item = Option<Vec<T::Native>>> + '_ {
    // Offsets index the whole child array, also for a sliced list.
    let offs = a.value_offsets();
    let slice = &a.values().as_primitive::<T>().values()[..];
    (0..a.len()).map(move |i| {
        (!a.is_null(i)).then(|| slice[offs[i] as usize..offs[i + 1] as usize].to_vec())
    })
}
