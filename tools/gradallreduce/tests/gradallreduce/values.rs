//! The value lists of `--algo`, `--op`, `--balance` and `--split` (built from the
//! collectives' enums, which know no clap): `--help` lists them, a typo is a usage error
//! (exit 2) that lists them. The algorithms are the registry's (`Algo::ALL`); the options'
//! names are typed in from docs/gradallreduce.md.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

use gradkit_collectives::Algo;

fn out(args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn help_lists_every_value() {
    let (code, help, _) = out(&["--help"]);
    assert_eq!(code, Some(0));
    // --algo: every name with its family.
    let algo = help.find("--algo <ALGO>").expect("--algo in --help");
    let section = &help[algo..help[algo..].find("--op <OP>").unwrap() + algo];
    for (name, family) in Algo::ALL.iter().map(|a| (a.name(), a.family())) {
        let line = section
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(&format!("- {name}:")))
            .unwrap_or_else(|| panic!("--algo {name} not listed:\n{section}"));
        assert!(
            line.trim_start().starts_with(&format!("{family}: ")),
            "--algo {name}: {line}"
        );
    }
    assert!(section.contains("[default: ring]"), "{section}");
    // The others: clap's lists, with the help lines where the enums have them.
    assert!(help.contains("[default: sum]") && help.contains("[possible values: sum, mean]"));
    assert!(help.contains(
        "- auto:   Balance when the largest buffer exceeds 4x the average (the paper's rule)"
    ));
    assert!(help.contains("- columns: Near-equal contiguous column slices (the paper's choice)"));
    assert!(help.contains("- rows:    Near-equal contiguous row slices (for comparison)"));
}

#[test]
fn a_typo_is_a_usage_error_listing_the_values() {
    let (code, _, err) = out(&["--algo", "rign", "-o", "x.parquet"]);
    assert_eq!(code, Some(2), "{err}");
    let known: Vec<&str> = Algo::names().collect();
    let algos = known.join(", ");
    assert!(
        err.starts_with(&format!("error: unknown --algo `rign` (known: {algos})\n")),
        "{err}"
    );
    for (flag, bad, values) in [
        ("--op", "avg", "[possible values: sum, mean]"),
        (
            "--balance",
            "sometimes",
            "[possible values: auto, always, never]",
        ),
        ("--split", "cols", "[possible values: columns, rows]"),
    ] {
        let (code, _, err) = out(&[flag, bad, "-o", "x.parquet"]);
        assert_eq!(code, Some(2), "{flag}: {err}");
        assert!(
            err.starts_with(&format!("error: invalid value '{bad}' for '{flag} <")),
            "{err}"
        );
        assert!(err.contains(values), "{flag}: {err}");
    }
    assert!(!std::path::Path::new("x.parquet").exists());
}
