//! Never destroy data: the checks and the clean-up every tool runs around its files.
//!
//! - [`check_distinct`]: before anything is read, refuse a run whose output would overwrite
//!   one of its inputs or another of its outputs (`-o in.parquet`, `--metrics X -o X`).
//!   Files are compared by device and inode (symlinks followed); a path that does not exist
//!   yet by its canonical parent directory and file name, so `-o a --metrics ./a` is caught.
//! - [`check_outside`]: refuse an input or output inside the entries of a directory the tool
//!   manages itself (gradtrain's `--checkpoint DIR`: `latest`, `step-N/`, …).
//! - [`try_lock`]: one process at a time in such a directory.
//! - [`install_signal_cleanup`]: on SIGINT, SIGTERM or SIGHUP, remove the temporary files of
//!   outputs still being written (`PATH.tmp-<pid>`, see [`register_temp`]) and the scratch
//!   directories ([`register_temp_dir`]), end the child process groups
//!   ([`output_in_group`]), and exit with 128 + the signal number.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Result};

/// How a path is told apart from another.
#[derive(Clone, Debug, PartialEq, Eq)]
enum FileId {
    /// An existing file or directory.
    Inode(u64, u64),
    /// A path that does not exist yet: canonical parent + name (or the lexical absolute path
    /// when the parent does not exist either).
    Name(PathBuf),
}

/// `-`, a device, a FIFO or a socket: read or written in place, never replaced, so sharing
/// one between flags destroys nothing (`-o /dev/null --metrics /dev/null`).
fn exempt(path: &Path) -> bool {
    if path.as_os_str() == "-" {
        return true;
    }
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

#[cfg(unix)]
fn inode(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
fn inode(_m: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    }
}

/// The identity of `path` (None when [`exempt`]).
fn file_id(path: &Path) -> Option<FileId> {
    if exempt(path) {
        return None;
    }
    let mut p = absolute(path);
    // A dangling symlink names the file it will create: follow it by hand (bounded, as the
    // kernel bounds symlink chains).
    for _ in 0..40 {
        if let Ok(m) = std::fs::metadata(&p) {
            return Some(if cfg!(unix) {
                FileId::Inode(inode(&m).0, inode(&m).1)
            } else {
                FileId::Name(std::fs::canonicalize(&p).unwrap_or(p))
            });
        }
        match std::fs::read_link(&p) {
            Ok(target) => {
                let parent = p.parent().map(Path::to_path_buf).unwrap_or_default();
                p = parent.join(target);
            }
            Err(_) => break,
        }
    }
    let name: OsString = p.file_name().map(|n| n.to_owned()).unwrap_or_default();
    let parent = p.parent().map(Path::to_path_buf).unwrap_or_default();
    let parent = std::fs::canonicalize(&parent).unwrap_or_else(|_| normalize(&parent));
    Some(FileId::Name(parent.join(name)))
}

/// `a/./b/../c` → `a/c`, lexically (only for paths whose parent does not exist).
fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// Refuses (an `error:` line, exit 1 through `cli::run`) when an output is the same file as
/// an input or as another output. Each entry is `(flag, path)`, the flag as the user typed
/// it (`IN`, `-o`, `--metrics`…); an absent path (stdin, stdout, a flag not given) is
/// skipped. An entry whose flag appears on both sides (a state file
/// that is read and written back, like gradallreduce `--state`) may name the same file on
/// both sides, but no other input or output. Devices (`/dev/null`) are exempt, and so is `-`
/// but for one rule: two outputs named `-` would both write stdout, which two tables cannot
/// share, so that is refused (pass `-o` as `-` when it is absent and stdout is its default:
/// [`crate::cli::stdout_if_absent`]). Call it before reading anything.
pub fn check_distinct(
    inputs: &[(&str, Option<&Path>)],
    outputs: &[(&str, Option<&Path>)],
) -> Result<()> {
    let on_stdout: Vec<&str> = outputs
        .iter()
        .filter(|(_, p)| p.is_some_and(|p| p.as_os_str() == "-"))
        .map(|(f, _)| *f)
        .collect();
    if let [first, second, ..] = on_stdout[..] {
        bail!(
            "{first} and {second} would both write to stdout, and two outputs cannot share it: send one of them to a FILE (`-` and an absent -o mean stdout)"
        );
    }
    let ids = |v: &[(&str, Option<&Path>)]| -> Vec<(String, PathBuf, FileId)> {
        v.iter()
            .filter_map(|&(f, p)| {
                let p = p?;
                file_id(p).map(|id| (f.to_string(), p.to_path_buf(), id))
            })
            .collect()
    };
    let ins = ids(inputs);
    let outs = ids(outputs);
    for (i, (of, op, oid)) in outs.iter().enumerate() {
        for (inf, inp, iid) in &ins {
            if inf != of && oid == iid {
                bail!(
                    "{of} {} is the same file as the input {inf} {}: refusing to overwrite an input (give {of} another path)",
                    op.display(),
                    inp.display()
                );
            }
        }
        for (f2, p2, id2) in &outs[..i] {
            if f2 != of && id2 == oid {
                bail!(
                    "{of} {} and {f2} {} are the same file: one output would overwrite the other (give them different paths)",
                    op.display(),
                    p2.display()
                );
            }
        }
    }
    Ok(())
}

/// Where `path` leads: absolute, every symlink resolved (a dangling one at the end followed
/// by hand, as [`file_id`] does); of a path that does not exist yet, its longest existing
/// ancestor resolved and the rest appended as written (`.` and `..` applied lexically).
fn resolved(path: &Path) -> PathBuf {
    let mut p = absolute(path);
    for _ in 0..40 {
        let dangling = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink())
            && std::fs::metadata(&p).is_err();
        let Some(target) = dangling.then(|| std::fs::read_link(&p).ok()).flatten() else {
            break;
        };
        p = p
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
            .join(target);
    }
    for base in p.ancestors() {
        if let Ok(real) = std::fs::canonicalize(base) {
            let rest = p.strip_prefix(base).unwrap_or(Path::new(""));
            return normalize(&real.join(rest));
        }
    }
    normalize(&p)
}

/// Refuses (an `error:` line naming both flags) an input or output that is the directory
/// `dir` (given by `dir_flag`) or lies in one of its entries that the tool itself writes,
/// replaces or removes (`reserved(name)` of the entry's name: gradtrain's checkpoint
/// directory holds `latest`, `step-N/`, `.staging-step-N/` and its lock file). Paths are
/// compared after resolving symlinks, so `--metrics link` with `link -> ck/latest` counts.
/// `-` and devices are exempt, as in [`check_distinct`]. Call it before reading anything.
pub fn check_outside(
    dir_flag: &str,
    dir: Option<&Path>,
    reserved: &dyn Fn(&str) -> bool,
    paths: &[(&str, Option<&Path>)],
) -> Result<()> {
    let Some(dir) = dir else {
        return Ok(());
    };
    let root = resolved(dir);
    for &(flag, path) in paths {
        let Some(path) = path.filter(|p| !exempt(p)) else {
            continue;
        };
        let Ok(rel) = resolved(path).strip_prefix(&root).map(Path::to_path_buf) else {
            continue;
        };
        let Some(entry) = rel.components().next() else {
            bail!(
                "{flag} {} is the {dir_flag} directory {}: give {flag} a path outside it",
                path.display(),
                dir.display()
            );
        };
        let entry = entry.as_os_str().to_string_lossy();
        if reserved(&entry) {
            bail!(
                "{flag} {} is inside {dir_flag} {} (its entry `{entry}`, which the run writes, replaces or removes): give {flag} a path outside it",
                path.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// An exclusive lock on a file (`flock`), held until it is dropped (or the process ends,
/// however it ends: the kernel releases it).
#[derive(Debug)]
pub struct FileLock {
    _file: std::fs::File,
}

/// Takes the exclusive lock of `path` (created if missing) without waiting: `Ok(Err(pid))`
/// when another process holds it (the pid it wrote into the file, if it could be read), and
/// an error when the file cannot be created or locked. The holder writes its pid into the
/// file; the file is never removed (removing a lock file lets two processes each lock a
/// different file of the same name).
#[cfg(unix)]
pub fn try_lock(path: &Path) -> Result<std::result::Result<FileLock, Option<u32>>> {
    use std::io::{Read, Write};
    use std::os::unix::io::AsRawFd;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| anyhow::Error::new(e).context(format!("cannot create {}", path.display())))?;
    // SAFETY: a valid open descriptor, owned by `file` for the call.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(anyhow::Error::new(e).context(format!("cannot lock {}", path.display())));
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        return Ok(Err(text.trim().parse().ok()));
    }
    // The pid is informative only: a failure to record it does not give the lock up.
    let _ = file
        .set_len(0)
        .and_then(|()| write!(file, "{}", std::process::id()));
    Ok(Ok(FileLock { _file: file }))
}

/// Makes a write past the file-size limit (`ulimit -f`, RLIMIT_FSIZE) an error (EFBIG) that
/// the tool reports and cleans up after, rather than SIGXFSZ, whose default action kills the
/// process mid-write.
#[cfg(unix)]
fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Temporary files of outputs being written, removed on a signal.
static TEMPS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn temps() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    TEMPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records a temporary file (call before creating it) so a signal removes it.
pub fn register_temp(path: &Path) {
    temps().insert(path.to_path_buf());
}

/// Forgets a temporary file (after it was renamed into place or removed).
pub fn unregister_temp(path: &Path) {
    temps().remove(path);
}

/// Temporary directories (a tool's scratch work) and the process groups of child processes,
/// removed and ended on a signal.
static DIRS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
static GROUPS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn lock<T>(m: &'static Mutex<T>) -> std::sync::MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records a scratch directory (call right after creating it) so a signal removes it whole.
pub fn register_temp_dir(path: &Path) {
    lock(&DIRS).insert(path.to_path_buf());
}

/// Forgets a scratch directory (after it was removed).
pub fn unregister_temp_dir(path: &Path) {
    lock(&DIRS).remove(path);
}

/// Starts `cmd` as the leader of a process group of its own, recorded so that a signal to
/// this process ends the child and everything it started (an `smpirun` and its simulator)
/// instead of orphaning them; waits for it and returns its output ([`Command::output`]).
/// The group is recorded under the lock the signal handler takes, so no child starts after
/// the handler has ended the groups.
///
/// [`Command::output`]: std::process::Command::output
pub fn output_in_group(cmd: &mut std::process::Command) -> std::io::Result<std::process::Output> {
    #[cfg(unix)]
    use std::os::unix::process::CommandExt;
    #[cfg(unix)]
    cmd.process_group(0);
    let child = {
        let mut groups = lock(&GROUPS);
        let child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        groups.insert(child.id() as i32);
        child
    };
    let pid = child.id() as i32;
    let out = child.wait_with_output();
    lock(&GROUPS).remove(&pid);
    out
}

/// A file being written that appears at its path only when complete ([`TempFile::persist`]).
///
/// On Linux the data goes to an unnamed file (`O_TMPFILE`) in the target's directory: until it
/// is persisted it has no name, so no signal, `kill -9` or crash can leave anything behind.
/// Persisting links it as `PATH.tmp-<pid>` (registered for the signal clean-up) and renames
/// that over `PATH` — an atomic replacement. Where unnamed files are not supported it is
/// named `PATH.tmp-<pid>` from the start, registered, and removed on errors and signals.
#[derive(Debug)]
pub struct TempFile {
    file: std::fs::File,
    target: PathBuf,
    /// The temporary name, when the file has one from the start.
    named: Option<PathBuf>,
}

impl TempFile {
    /// Creates the file that will become `target`.
    pub fn create(target: &Path) -> anyhow::Result<TempFile> {
        let named = temp_name(target);
        #[cfg(target_os = "linux")]
        {
            let dir = match target.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            use std::os::unix::fs::OpenOptionsExt;
            // Readable too: a live table is copied from it (`live::LiveTable::copy_to`).
            if let Ok(file) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_TMPFILE)
                .open(dir)
            {
                return Ok(TempFile {
                    file,
                    target: target.to_path_buf(),
                    named: None,
                });
            }
        }
        // Registered first, so a signal from here on removes it.
        register_temp(&named);
        let created = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&named);
        match created {
            Ok(file) => Ok(TempFile {
                file,
                target: target.to_path_buf(),
                named: Some(named),
            }),
            Err(e) => {
                unregister_temp(&named);
                Err(anyhow::Error::new(e).context(format!("cannot create {}", named.display())))
            }
        }
    }

    /// The open file (a writer may `try_clone` it).
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// The path the file will have.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Gives a complete unnamed file its temporary name `PATH.tmp-<pid>` (registered for the
    /// signal clean-up, removed if it is dropped), the one step of [`TempFile::persist`] that
    /// can fail for want of space or permission. [`commit_all`] names every output of a run
    /// first, so that it renames none unless all could be named.
    pub fn stage(&mut self) -> anyhow::Result<()> {
        if self.named.is_some() {
            return Ok(());
        }
        let tmp = temp_name(&self.target);
        register_temp(&tmp);
        let _ = std::fs::remove_file(&tmp);
        if let Err(e) = link_unnamed(&self.file, &tmp) {
            unregister_temp(&tmp);
            return Err(anyhow::Error::new(e).context(format!("cannot create {}", tmp.display())));
        }
        self.named = Some(tmp);
        Ok(())
    }

    /// Gives the complete file its name, replacing whatever was at the target.
    pub fn persist(mut self) -> anyhow::Result<()> {
        use anyhow::Context;
        self.stage()?;
        let tmp = self.named.take().expect("staged");
        let res = std::fs::rename(&tmp, &self.target).with_context(|| {
            format!(
                "cannot rename {} to {}",
                tmp.display(),
                self.target.display()
            )
        });
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        unregister_temp(&tmp);
        res
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Not persisted: an error happened; leave nothing behind.
        if let Some(tmp) = self.named.take() {
            let _ = std::fs::remove_file(&tmp);
            unregister_temp(&tmp);
        }
    }
}

/// Commits the complete outputs of a run together: every file is first given its temporary
/// name ([`TempFile::stage`]: what fails on a full disk or a removed directory), and only when
/// all are named is each renamed over its target. A failure before the renames leaves none of
/// them (and whatever was at their targets untouched).
pub fn commit_all(mut files: Vec<TempFile>) -> anyhow::Result<()> {
    for f in &mut files {
        f.stage()?;
    }
    for f in files {
        f.persist()?;
    }
    Ok(())
}

/// Checks, before a run does any work, that an output can be created at `path`: its
/// directory exists and takes a new file. Nothing is left behind (the probe is an unnamed
/// file, or a temporary name removed at once). A path that exists and is not a regular file
/// (a device, a FIFO) is written in place and not probed. `flag` names the output in the
/// error, as the user typed it (`-o`, `--metrics`, …).
///
/// Under an MPI launcher only rank 0 probes: it writes the outputs, and on a cluster the other
/// ranks may not see its directories.
pub fn check_creatable(flag: &str, path: &Path) -> anyhow::Result<()> {
    if crate::process::launcher_rank() != 0
        || path.as_os_str() == "-"
        || std::fs::metadata(path).is_ok_and(|m| !m.is_file())
    {
        return Ok(());
    }
    match TempFile::create(path) {
        Ok(probe) => {
            drop(probe);
            Ok(())
        }
        Err(e) => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            let why = if !dir.is_dir() {
                format!("the directory {} does not exist", dir.display())
            } else {
                let e = e.root_cause().to_string();
                format!("cannot create a file in {}: {e}", dir.display())
            };
            bail!("{flag} {}: {why}", path.display())
        }
    }
}

/// `PATH.tmp-<pid>`.
fn temp_name(target: &Path) -> PathBuf {
    let mut name = target.as_os_str().to_owned();
    name.push(format!(".tmp-{}", std::process::id()));
    PathBuf::from(name)
}

/// Links an `O_TMPFILE` file into the directory tree as `to` (open(2), O_TMPFILE).
#[cfg(target_os = "linux")]
fn link_unnamed(file: &std::fs::File, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::io::AsRawFd;
    let src = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let dst = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            src.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn link_unnamed(_file: &std::fs::File, _to: &Path) -> std::io::Result<()> {
    Err(std::io::Error::other("unnamed temporary files need Linux"))
}

/// Installs, once per process, a handler thread for SIGINT, SIGTERM and SIGHUP that removes
/// the registered temporary files and exits with 128 + the signal number. The handler
/// itself only wakes the thread (signal-hook's iterator), so no unsafe work runs inside it.
/// Call it first thing in `main`; failing to install is not fatal (the outputs stay atomic,
/// only the clean-up is lost). It also ignores SIGXFSZ, so a write past `ulimit -f` fails
/// with EFBIG, reported and cleaned up after like a full disk, instead of killing the process.
/// The signal being handled by [`install_signal_cleanup`]'s thread (0: none).
static SIGNALLED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Where a signal is being handled, waits for the cleanup thread to end the process with
/// 128 + the signal (it removes the temporary files and directories, then exits); returns at
/// once otherwise. The tools' exit path calls it, so that an error caused by the cleanup
/// itself (a child it killed) never ends the process first, with another code and files left.
pub fn await_signal_exit() {
    if SIGNALLED.load(std::sync::atomic::Ordering::SeqCst) != 0 {
        loop {
            std::thread::park();
        }
    }
}

pub fn install_signal_cleanup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
            ignore_file_size_signal();
            let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            else {
                return;
            };
            let _ = std::thread::Builder::new()
                .name("gradkit-signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        // From here the exit is this thread's: a main thread that sees a
                        // child die of the cleanup below must not exit first with its own
                        // error ([`await_signal_exit`]).
                        SIGNALLED.store(sig, std::sync::atomic::Ordering::SeqCst);
                        // Holding the lock keeps a writer from registering a new temporary
                        // file between the removal and the exit.
                        let mut t = temps();
                        for p in t.iter() {
                            let _ = std::fs::remove_file(p);
                        }
                        t.clear();
                        // Children first, so none writes into a directory being removed.
                        for &g in lock(&GROUPS).iter() {
                            // SAFETY: kill(2) on a process group this process started.
                            unsafe { libc::kill(-g, libc::SIGTERM) };
                        }
                        for d in lock(&DIRS).iter() {
                            let _ = std::fs::remove_dir_all(d);
                        }
                        signal_hook::low_level::exit(128 + sig);
                    }
                });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gradkit-paths-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn same_file_by_any_name_is_refused() {
        let d = tmpdir("same");
        let a = d.join("a.parquet");
        std::fs::write(&a, b"x").unwrap();
        let via_dot = d.join(".").join("a.parquet");
        let e = check_distinct(
            &[("IN", Some(a.as_path()))],
            &[("-o", Some(via_dot.as_path()))],
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("-o") && msg.contains("IN"), "{msg}");
        #[cfg(unix)]
        {
            let link = d.join("link.parquet");
            std::os::unix::fs::symlink(&a, &link).unwrap();
            assert!(check_distinct(
                &[("IN", Some(a.as_path()))],
                &[("--metrics", Some(link.as_path()))]
            )
            .is_err());
            let hard = d.join("hard.parquet");
            std::fs::hard_link(&a, &hard).unwrap();
            assert!(check_distinct(
                &[("IN", Some(hard.as_path()))],
                &[("-o", Some(a.as_path()))]
            )
            .is_err());
            // A dangling symlink is the file it would create.
            let dangling = d.join("dangling");
            std::os::unix::fs::symlink(d.join("new.parquet"), &dangling).unwrap();
            let new = d.join("new.parquet");
            assert!(check_distinct(
                &[],
                &[
                    ("-o", Some(new.as_path())),
                    ("--metrics", Some(dangling.as_path()))
                ]
            )
            .is_err());
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn outputs_that_do_not_exist_yet_are_compared_by_name() {
        let d = tmpdir("new");
        let a = d.join("sub/../out.parquet");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let b = d.join("out.parquet");
        assert!(check_distinct(
            &[],
            &[("-o", Some(a.as_path())), ("--metrics", Some(b.as_path()))]
        )
        .is_err());
        let c = d.join("other.parquet");
        check_distinct(
            &[],
            &[("-o", Some(b.as_path())), ("--metrics", Some(c.as_path()))],
        )
        .unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn distinct_files_devices_and_a_state_file_pass() {
        let d = tmpdir("ok");
        let a = d.join("a");
        let b = d.join("b");
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"y").unwrap();
        check_distinct(&[("IN", Some(a.as_path()))], &[("-o", Some(b.as_path()))]).unwrap();
        let dash = Path::new("-");
        check_distinct(&[("IN", Some(dash))], &[("-o", Some(dash))]).unwrap();
        // Stdin and one output on stdout are fine; two outputs on stdout are not.
        check_distinct(
            &[("IN", Some(dash))],
            &[("-o", Some(dash)), ("--metrics", Some(a.as_path()))],
        )
        .unwrap();
        let e = check_distinct(&[], &[("-o", Some(dash)), ("--metrics", Some(dash))]).unwrap_err();
        assert!(e.to_string().contains("stdout"), "{e}");
        #[cfg(unix)]
        {
            let null = Path::new("/dev/null");
            check_distinct(
                &[("IN", Some(null))],
                &[("-o", Some(null)), ("--metrics", Some(null))],
            )
            .unwrap();
        }
        // A state file read and written back under the same flag is fine ...
        check_distinct(
            &[("IN", Some(a.as_path())), ("--state", Some(b.as_path()))],
            &[("--state", Some(b.as_path()))],
        )
        .unwrap();
        // ... but not as another output.
        assert!(check_distinct(
            &[("--state", Some(b.as_path()))],
            &[("--state", Some(b.as_path())), ("-o", Some(b.as_path()))]
        )
        .is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
