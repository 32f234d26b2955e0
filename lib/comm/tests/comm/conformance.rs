//! The Comm conformance suite (`gradkit_comm::conformance`) on every backend: Local for
//! P = 1..5, and MPI under `mpirun -np 1..4` (this test binary is the MPI program: it
//! relaunches itself under mpirun with `GRADKIT_CONFORMANCE_MPI=1`, running only
//! `mpi_rank_entry`). Broken backends (wrappers that each break one rule) must fail it.

use std::process::ExitCode;
use std::time::Duration;

use gradkit_comm::conformance::{self, Options};
use gradkit_comm::{run_local, Backend, Buf, Comm, CommResult, Kind, Traffic, World};

/// The checks every backend passes, in order (Local and MPI skip none).
const CHECKS: usize = 18;

#[test]
fn local_backend_passes_for_p_1_to_5() {
    for p in 1..=5 {
        // 16 MiB per rank: 80 MiB in flight at P = 5.
        let reps = run_local(p, |c: &dyn Comm| conformance::run(c, &Options::default()))
            .unwrap_or_else(|e| panic!("P = {p}: {e:#}"));
        assert_eq!(reps.len(), p);
        for rep in reps {
            assert_eq!(rep.checks.len(), CHECKS, "P = {p}: {:?}", rep.checks);
            assert!(rep.skipped.is_empty(), "{:?}", rep.skipped);
        }
    }
}

#[test]
fn local_world_runs_the_suite_through_world_run() {
    let world = World::local(3);
    assert!(world.backend().in_process());
    let opts = Options { large_elems: 1000 };
    let reps = world.run(|c| conformance::run(c, &opts)).unwrap();
    assert_eq!(reps.len(), 3);
}

// ---------------------------------------------------------------------------------------
// Backends with one bug each: the suite must catch every one.

#[derive(Clone, Copy, Debug)]
enum Bug {
    /// Drops device buffers instead of refusing the bucket.
    DropsDeviceBuffers,
    /// Corrupts one element of large received messages.
    CorruptsLargeMessages,
    /// The native allreduce leaves the data as it is.
    NativeIsNoop,
    /// Delivers the receives of a bucket in reverse order.
    ReordersReceives,
    /// Counts a message to oneself (through `exchange`).
    CountsSelf,
}

struct Buggy<'a> {
    inner: &'a dyn Comm,
    bug: Bug,
}

impl Comm for Buggy<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    fn exchange_raw(
        &self,
        tag: u32,
        mut sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>> {
        if let Bug::DropsDeviceBuffers = self.bug {
            sends.retain(|(_, b)| b.is_host());
        }
        let mut got = self.inner.exchange_raw(tag, sends, recvs)?;
        match self.bug {
            Bug::CorruptsLargeMessages => {
                for b in &mut got {
                    if b.len() > 100_000 && b.kind() == Kind::U32 {
                        let mut v: Vec<u32> = std::mem::replace(b, Buf::empty(Kind::U32))
                            .into_vec()
                            .unwrap();
                        v[77_777] ^= 1;
                        *b = Buf::from_vec(v);
                    }
                }
            }
            Bug::ReordersReceives => got.reverse(),
            _ => {}
        }
        Ok(got)
    }
    fn exchange(
        &self,
        tag: u32,
        sends: Vec<(usize, Buf)>,
        recvs: &[(usize, Kind)],
    ) -> CommResult<Vec<Buf>> {
        if let Bug::CountsSelf = self.bug {
            for (d, b) in &sends {
                if *d == self.rank() {
                    self.traffic().add_sent(b.bytes());
                }
            }
        }
        // The trait's own counting.
        let me = self.rank();
        let sent: Vec<usize> = sends
            .iter()
            .filter(|(d, _)| *d != me)
            .map(|(_, b)| b.bytes())
            .collect();
        let got = self.exchange_raw(tag, sends, recvs)?;
        for b in sent {
            self.traffic().add_sent(b);
        }
        for ((s, _), b) in recvs.iter().zip(&got) {
            if *s != me {
                self.traffic().add_recv(b.bytes());
            }
        }
        Ok(got)
    }
    fn barrier(&self) -> CommResult<()> {
        self.inner.barrier()
    }
    fn allreduce_native_f32(&self, data: &mut [f32]) -> CommResult<()> {
        match self.bug {
            Bug::NativeIsNoop => {
                self.traffic().add_opaque(data.len() * 4);
                Ok(())
            }
            _ => self.inner.allreduce_native_f32(data),
        }
    }
    fn allreduce_native_f64(&self, data: &mut [f64]) -> CommResult<()> {
        self.inner.allreduce_native_f64(data)
    }
    fn traffic(&self) -> &Traffic {
        self.inner.traffic()
    }
}

#[test]
fn the_suite_catches_a_backend_with_any_one_bug() {
    for (bug, check) in [
        (Bug::DropsDeviceBuffers, "device_buffers"),
        (Bug::CorruptsLargeMessages, "large_message"),
        (Bug::NativeIsNoop, "allreduce_native"),
        (Bug::ReordersReceives, "exchange_raw_every_kind"),
        (Bug::CountsSelf, "exchange_counts_traffic"),
    ] {
        let r = run_local(3, |c: &dyn Comm| {
            conformance::run(
                &Buggy { inner: c, bug },
                &Options {
                    large_elems: 200_000,
                },
            )
        });
        let e = format!("{:#}", r.expect_err(&format!("{bug:?} passed the suite")));
        assert!(e.contains(&format!("`{check}`")), "{bug:?}: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// MPI.

const CHILD_ENV: &str = "GRADKIT_CONFORMANCE_MPI";

/// The MPI program: every rank runs the suite; rank 0 prints one line. Does nothing unless
/// started by `mpi_backend_passes_for_np_1_to_4` under mpirun.
#[test]
fn mpi_rank_entry() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    if std::env::var_os(TIMEOUT_ENV).is_some() {
        let code = gradkit_core::cli::run(timeout_rank_entry);
        assert_eq!(code, ExitCode::SUCCESS);
        return;
    }
    let code = gradkit_core::cli::run(|| {
        let world = World::init(None)?;
        let opts = Options {
            large_elems: 1 << 20,
        };
        let reps = world.run(|c| conformance::run(c, &opts))?;
        if world.is_io_rank() {
            println!(
                "conformance passed: {} backend, {} ranks, {} checks, {} skipped",
                world.backend(),
                world.size(),
                reps[0].checks.len(),
                reps[0].skipped.len()
            );
        }
        Ok(())
    });
    assert_eq!(code, ExitCode::SUCCESS);
}

const TIMEOUT_ENV: &str = "GRADKIT_CONFORMANCE_TIMEOUT";
const BIG: usize = 16 << 20;

fn big(salt: u8) -> Vec<u8> {
    (0..BIG).map(|i| (i % 251) as u8 ^ salt).collect()
}

/// Two ranks, `GRADKIT_COMM_TIMEOUT=5`: rank 0's receive from a rank that does not answer,
/// and then its 16 MiB send that nobody takes, each fail with `CommError::Timeout` (an
/// error, not an abort); rank 1 then takes the two abandoned messages, which arrive intact,
/// and both ranks end normally.
fn timeout_rank_entry() -> anyhow::Result<()> {
    use gradkit_comm::{CommError, CommExt, Waiting};
    let world = World::init(None)?;
    anyhow::ensure!(world.size() == 2, "run with -np 2");
    world.run(|c| {
        if c.rank() == 0 {
            let r = c.exchange(5, vec![(1, Buf::from_vec(big(1)))], &[(1, Kind::U8)]);
            let e = r.expect_err("a receive from a silent rank must time out");
            assert!(
                matches!(
                    e,
                    CommError::Timeout {
                        peer: 1,
                        waiting: Waiting::Recv,
                        secs: 5
                    }
                ),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                "no message from rank 1 for 5 s (GRADKIT_COMM_TIMEOUT); ending the job"
            );
            let r = c.exchange(5, vec![(1, Buf::from_vec(big(2)))], &[]);
            let e = r.expect_err("a send nobody takes must time out");
            assert!(
                matches!(
                    e,
                    CommError::Timeout {
                        peer: 1,
                        waiting: Waiting::Send,
                        secs: 5
                    }
                ),
                "{e:?}"
            );
            c.send(1, vec![7u8])?;
            println!("rank 0: both waits timed out");
        } else {
            // Wait for rank 0's go-ahead; a receive that times out may be retried.
            let go = loop {
                match c.recv::<u8>(0) {
                    Ok(v) => break v,
                    Err(CommError::Timeout { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            assert_eq!(go, vec![7u8]);
            let got = c.exchange(5, vec![], &[(0, Kind::U8), (0, Kind::U8)])?;
            assert_eq!(got, vec![Buf::from_vec(big(1)), Buf::from_vec(big(2))]);
            println!("rank 1: abandoned messages arrived intact");
        }
        c.barrier()?;
        Ok(())
    })?;
    Ok(())
}

#[test]
fn under_mpi_a_wait_past_the_limit_is_an_error_and_abandoned_sends_stay_valid() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    let (ok, out, err) = mpirun_self(
        2,
        &[
            (CHILD_ENV, "1"),
            (TIMEOUT_ENV, "1"),
            ("GRADKIT_COMM_TIMEOUT", "5"),
        ],
    );
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        out.matches("rank 0: both waits timed out").count(),
        1,
        "{out}\n{err}"
    );
    assert_eq!(
        out.matches("rank 1: abandoned messages arrived intact")
            .count(),
        1,
        "{out}\n{err}"
    );
}

#[test]
fn mpi_backend_passes_for_np_1_to_4() {
    if !gradkit_testkit::mpi::available() {
        return;
    }
    for np in 1..=4usize {
        // A lost message ends the job instead of hanging the test.
        let (ok, out, err) = mpirun_self(np, &[(CHILD_ENV, "1"), ("GRADKIT_COMM_TIMEOUT", "120")]);
        assert!(ok, "np {np}:\n{out}\n{err}");
        let want =
            format!("conformance passed: mpi backend, {np} ranks, {CHECKS} checks, 0 skipped");
        assert_eq!(out.matches(&want).count(), 1, "np {np}:\n{out}\n{err}");
    }
}

/// Runs this test binary's `mpi_rank_entry` under `mpirun -np NP` with `env`; returns
/// whether it succeeded, its stdout and its stderr. A hang guard only (never a time limit
/// on a passing run): a job still running after 600 s is killed and the test fails.
fn mpirun_self(np: usize, env: &[(&str, &str)]) -> (bool, String, String) {
    let me = std::env::current_exe().unwrap();
    // The test's name inside this binary: its module path less the crate's name.
    let entry = match module_path!().split_once("::") {
        Some((_, m)) => format!("{m}::mpi_rank_entry"),
        None => "mpi_rank_entry".to_string(),
    };
    let mut cmd = gradkit_testkit::mpi::command(np);
    cmd.arg(&me)
        .args(["--exact", &entry, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("start mpirun");
    let what = format!("mpirun -np {np}");
    let (status, out, err) =
        gradkit_testkit::mpi::wait_bounded(child, Duration::from_secs(600), &what);
    (status.success(), out, err)
}
