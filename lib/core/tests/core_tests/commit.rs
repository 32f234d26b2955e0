//! The outputs of a run are committed together ([`gradkit_core::paths::commit_all`]): when one
//! cannot be given its name, none appears, and whatever was at their paths stays.

use std::io::Write;

use gradkit_core::paths::{commit_all, TempFile};

fn temp_with(path: &std::path::Path, bytes: &[u8]) -> TempFile {
    let t = TempFile::create(path).unwrap();
    t.file().write_all(bytes).unwrap();
    t
}

#[test]
fn one_output_that_cannot_be_named_leaves_none() {
    let d = tempfile::tempdir().unwrap();
    let (a, gone) = (d.path().join("a.parquet"), d.path().join("gone"));
    std::fs::write(&a, b"old a").unwrap();
    std::fs::create_dir(&gone).unwrap();
    let b = gone.join("b.parquet");
    let files = vec![temp_with(&a, b"new a"), temp_with(&b, b"new b")];
    // The second output's directory disappears while the run writes (its file has no name
    // yet, so the directory is empty and can be removed).
    std::fs::remove_dir(&gone).unwrap();
    assert!(commit_all(files).is_err());
    assert_eq!(
        std::fs::read(&a).unwrap(),
        b"old a",
        "the first output was committed alone"
    );
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["a.parquet"], "a temporary name was left");
}

#[test]
fn outputs_that_can_be_named_all_appear() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    commit_all(vec![temp_with(&a, b"1"), temp_with(&b, b"2")]).unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), b"1");
    assert_eq!(std::fs::read(&b).unwrap(), b"2");
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
}
