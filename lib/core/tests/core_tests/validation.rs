//! Every validation error of the reader names the file and the problem; --allow-nonfinite
//! accepts NaN/Inf and nothing else.

use crate::common;

use gradkit_core::io::{read_tensor, Input, ReadOptions};

#[test]
fn every_broken_file_is_refused_with_a_message_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    for case in common::cases() {
        let path = dir.path().join(format!("{}.parquet", case.name));
        (case.make)(&path);
        let err = read_tensor(&Input::Path(path.clone()), ReadOptions::default())
            .err()
            .unwrap_or_else(|| panic!("{}: a broken file was accepted", case.name));
        let msg = format!("{err:#}");
        assert!(
            msg.contains(&path.display().to_string()),
            "{}: file not named in `{msg}`",
            case.name
        );
        for want in case.expect {
            assert!(msg.contains(want), "{}: `{want}` not in `{msg}`", case.name);
        }
        assert!(
            !msg.contains('\n'),
            "{}: message is not one line: `{msg}`",
            case.name
        );
    }
}

#[test]
fn allow_nonfinite_accepts_nan_and_inf_but_not_other_errors() {
    let dir = tempfile::tempdir().unwrap();
    let allow = ReadOptions {
        allow_nonfinite: true,
    };
    for case in common::cases() {
        let path = dir.path().join(format!("{}.parquet", case.name));
        (case.make)(&path);
        let res = read_tensor(&Input::Path(path), allow);
        assert_eq!(
            res.is_ok(),
            common::NONFINITE.contains(&case.name),
            "{}",
            case.name
        );
        if let Ok(t) = res {
            let nonfinite = t
                .rows
                .iter()
                .flat_map(|r| &r.values)
                .filter(|v| !v.is_finite())
                .count();
            assert_eq!(
                nonfinite, 1,
                "{}: the non-finite value was not kept",
                case.name
            );
        }
    }
}

#[test]
fn a_file_that_is_not_parquet_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.parquet");
    std::fs::write(&p, b"hello").unwrap();
    let msg = format!(
        "{:#}",
        read_tensor(&Input::Path(p), ReadOptions::default()).unwrap_err()
    );
    assert!(msg.contains("not a Parquet file"), "{msg}");
}
