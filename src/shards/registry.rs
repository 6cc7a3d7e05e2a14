//! Every shard format by name: the one list of formats, which the bindings
//! (`_ShardReader`) and the fuzz target take theirs from. A new format is its own
//! file in this folder (a [`ShardFormat`]), one line in [`FORMATS`], and
//! one Python class over `ShardedSource` (DESIGN.md, "Adding a shard
//! format").

use std::sync::Arc;

use super::jsonl::JsonLinesFormat;
use super::mds::MdsFormat;
use super::parquet::ParquetFormat;
use super::tar::TarFormat;
use super::ShardFormat;

/// Makes a format's reader; `columns` are the columns to read, for the
/// formats that store columns and can leave some out (Parquet), and are
/// ignored by the others.
pub type MakeFormat = fn(Option<Vec<String>>) -> Arc<dyn ShardFormat>;

/// Every format: its name (`_ShardReader(kind=...)`, and the fuzz
/// target's file extension) and how to make its reader.
pub const FORMATS: &[(&str, MakeFormat)] = &[
    ("tar", |_| Arc::new(TarFormat)),
    ("jsonl", |_| Arc::new(JsonLinesFormat)),
    ("parquet", |columns| Arc::new(ParquetFormat::new(columns))),
    ("mds", |_| Arc::new(MdsFormat)),
];

/// The reader of the format named `name`, or `None` when there is no such
/// format (see [`names`] for the message).
pub fn by_name(name: &str, columns: Option<Vec<String>>) -> Option<Arc<dyn ShardFormat>> {
    FORMATS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, make)| make(columns))
}

/// The formats' names, quoted and joined for a message: `'tar', 'jsonl', ...`.
pub fn names() -> String {
    FORMATS
        .iter()
        .map(|(n, _)| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shards::SampleLayout;

    #[test]
    fn every_format_is_found_by_its_name_and_an_unknown_one_is_not() {
        for (name, _) in FORMATS {
            assert!(by_name(name, None).is_some(), "{name}");
        }
        assert!(by_name("zip", None).is_none());
        assert_eq!(names(), "'tar', 'jsonl', 'parquet', 'mds'");
        let layouts: Vec<SampleLayout> = FORMATS.iter().map(|(_, m)| m(None).layout()).collect();
        assert_eq!(
            layouts,
            [
                SampleLayout::Members,
                SampleLayout::Value,
                SampleLayout::Columns,
                SampleLayout::Columns
            ]
        );
    }

    #[test]
    fn only_parquet_counts_from_its_tail() {
        for (name, make) in FORMATS {
            let first = make(None).count_tail(None);
            assert_eq!(first.is_some(), *name == "parquet", "{name}");
        }
    }
}
