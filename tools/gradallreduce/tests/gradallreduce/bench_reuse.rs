//! docs/MEMORY.md under mpirun: the MPI backend receives large messages into buffers it kept from
//! earlier sends, and each dense reducer keeps its message buffer across calls. `bench`
//! checks every element of every iteration against the exact sum of its inputs (small
//! integers, so any summation order gives the same f32: an independent formula); here its
//! `wrong` column must be 0 for every algorithm at every size, with sizes and algorithms
//! interleaved so that kept buffers of one size and algorithm serve the next, for P = 3
//! (Rabenseifner folds) and P = 4.

use std::process::Stdio;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_gradallreduce");

#[test]
fn reused_buffers_give_exact_sums_under_mpirun() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    for p in [3usize, 4] {
        let mut cmd = gradkit_testkit::mpi::command(p);
        cmd.arg(BIN)
            .args([
                "bench",
                "--algo",
                "ring,tree,rabenseifner,native,ring,ring-fp16",
            ])
            .args([
                "--sizes", "60K:4M", "--factor", "4", "--iters", "3", "--warmup", "1",
            ])
            .args(["--format", "csv", "-q"])
            .stdin(Stdio::null());
        let child = cmd.spawn().expect("start mpirun");
        let (status, out, err) =
            gradkit_testkit::mpi::wait_bounded(child, Duration::from_secs(300), "mpirun bench");
        assert!(status.success(), "P={p}: {err}");
        let mut lines = out.lines();
        let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
        let (algo, wrong) = (col("algo"), col("wrong"));
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        // 60K, 240K, 960K, 3840K: four sizes, six algorithms each.
        assert_eq!(rows.len(), 4 * 6, "P={p}: {out}");
        // Inputs and sums are integers below 2048, exact in fp16 too: every algorithm is exact.
        for row in &rows {
            assert_eq!(row[wrong], "0", "P={p} {}: {row:?}", row[algo]);
        }
    }
}
