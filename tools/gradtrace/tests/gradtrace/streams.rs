//! gradtrace with closed, full, `head -1` and broken stdout/stderr: no panic, a clean error
//! or quiet success, and `-o` files written whole (docs/RELIABILITY.md).

#[path = "../streams/harness.rs"]
mod harness;

use gradkit_core::{read_tensor, Input};
use harness::*;

const BIN: &str = env!("CARGO_BIN_EXE_gradtrace");

#[test]
fn synthetic_writes_its_file_whatever_the_streams() {
    let d = TmpDir::new("trace-synth");
    let out = d.path().join("t.parquet");
    let o = out.to_str().unwrap();
    check_with_output(
        BIN,
        &[
            "synthetic",
            "--shape",
            "mlp",
            "--ranks",
            "2",
            "--steps",
            "2",
            "--seed",
            "1",
            "-o",
            o,
        ],
        &out,
        |p| {
            let t = read_tensor(&Input::Path(p.to_path_buf()), Default::default()).unwrap();
            assert!(!t.rows.is_empty());
        },
    );
}

#[test]
fn inspect_never_panics_on_stdout() {
    let d = TmpDir::new("trace-inspect");
    let t = d.path().join("t.parquet");
    tiny_trace(&t, 2, 2);
    let t = t.to_str().unwrap();
    check_stdout_tool(BIN, &["inspect", t]);
    check_stdout_tool(BIN, &["inspect", "--format", "csv", t]);
}

#[test]
fn parquet_to_stdout_never_panics() {
    // The table itself to stdout: closed or full stdout is an error line, never a panic.
    for mode in ALL {
        let r = run(
            BIN,
            &[
                "synthetic",
                "--shape",
                "mlp",
                "--ranks",
                "2",
                "--steps",
                "1",
            ],
            mode,
        );
        assert_no_panic("synthetic to stdout", mode, &r);
        if mode == Mode::StdoutFull {
            assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
            assert!(r.stderr.starts_with("error: "), "{}", r.stderr);
        }
    }
}
