//! Running jobs under `mpirun` from tests: whether it is installed, the command every test
//! starts from, and a bounded wait that turns a hang into a failing test.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Whether `mpirun` runs here; prints why a test is skipped when it does not.
pub fn available() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: mpirun is not installed (make deps installs Open MPI)");
    }
    ok
}

/// Gives one `mpirun` a session directory of its own (`OMPI_MCA_orte_tmpdir_base`, a fresh
/// directory under the system's temporary directory): Open MPI 4 creates and removes
/// `/tmp/ompi.HOST.UID` for every job, and two jobs started at once (tests run in parallel in
/// one test binary) could fail with `mkdir … File exists` in `orte_session_dir` (seen under
/// two CPU hogs). Every test that starts mpirun goes through this.
pub fn isolate(c: &mut Command) -> &mut Command {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = std::env::temp_dir();
    if n == 0 {
        // The (empty) directories of test processes that have ended.
        for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("gradkit-ompi-")
                .and_then(|r| r.split('-').next());
            if pid.is_some_and(|p| !std::path::Path::new("/proc").join(p).exists()) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let dir = tmp.join(format!("gradkit-ompi-{}-{n}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    c.env("OMPI_MCA_orte_tmpdir_base", dir)
}

/// `mpirun -np NP --oversubscribe` allowed to run as root, stdin closed, stdout and stderr
/// piped (a test may redirect them before spawning), in a session directory of its own
/// ([`isolate`]).
pub fn command(np: usize) -> Command {
    let mut c = Command::new("mpirun");
    isolate(&mut c);
    c.args(["-np", &np.to_string(), "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn drain(r: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = r {
            r.read_to_string(&mut s).ok();
        }
        s
    })
}

/// Waits for `child`, reading its piped stdout and stderr meanwhile (a stream that is not
/// piped reads as ""). A hang guard only, never a time limit on a passing run: a job still
/// running after `limit` is killed and the test fails naming `what`.
pub fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> (ExitStatus, String, String) {
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} hung: still running after {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, out.join().unwrap(), err.join().unwrap())
}

/// `mpirun -np P BIN ARGS…` (the command of [`command`]) with stdout discarded: its exit code
/// and stderr; a job still running after 300 s fails the test as a hang ([`wait_bounded`]).
pub fn run_quiet(p: usize, bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = command(p);
    cmd.arg(bin).args(args).stdout(std::process::Stdio::null());
    let child = cmd.spawn().expect("start mpirun");
    let what = format!("mpirun {args:?}");
    let (status, _, err) = wait_bounded(child, Duration::from_secs(300), &what);
    (status.code(), err)
}
