//! `--comm-trace`: every step's recorded messages add up to the step's `bytes_sent`,
//! `bytes_recv` and `messages` metrics (the traffic counters), for a dense and a sparse
//! exchange.

use std::collections::BTreeMap;

use gradkit_core::{read_table, CommRow, EventKind, Input, MetricRow, ReadOptions};

const BIN: &str = env!("CARGO_BIN_EXE_gradtrain");

#[test]
fn recording_equals_the_step_counters() {
    let d = gradkit_testkit::tempdir("gradtrain-commtrace");
    for exchange in ["dense", "oktopk"] {
        let (rec, m) = (
            d.path().join(format!("{exchange}.rec.parquet")),
            d.path().join(format!("{exchange}.m.parquet")),
        );
        let (code, err) = gradkit_testkit::cli::run(
            BIN,
            &[
                "--model",
                "mlp",
                "--ranks",
                "3",
                "--steps",
                "3",
                "--batch",
                "8",
                "-q",
                "--exchange",
                exchange,
                "--metrics",
                m.to_str().unwrap(),
                "--comm-trace",
                rec.to_str().unwrap(),
            ],
        );
        assert_eq!(code, 0, "{exchange}: {err}");
        let mut want: BTreeMap<(u32, u32), [u64; 3]> = BTreeMap::new();
        for r in read_table::<MetricRow>(&Input::Path(m), ReadOptions::default())
            .unwrap()
            .rows
        {
            let i = match r.metric.as_str() {
                "bytes_sent" => 0,
                "bytes_recv" => 1,
                "messages" => 2,
                _ => continue,
            };
            want.entry((r.step, r.rank)).or_default()[i] = r.value as u64;
        }
        let mut got: BTreeMap<(u32, u32), [u64; 3]> = BTreeMap::new();
        for r in read_table::<CommRow>(&Input::Path(rec), ReadOptions::default())
            .unwrap()
            .rows
        {
            let e = got.entry((r.step, r.rank)).or_default();
            match r.kind {
                EventKind::Send => {
                    e[0] += r.bytes;
                    e[2] += 1;
                }
                EventKind::Recv => e[1] += r.bytes,
                EventKind::Allreduce => {
                    e[0] += r.bytes;
                    e[1] += r.bytes;
                }
                EventKind::Compute => {}
            }
        }
        assert_eq!(want.len(), 9, "{exchange}: 3 steps × 3 ranks of metrics");
        assert_eq!(got, want, "{exchange}: recording vs counters");
    }
}
