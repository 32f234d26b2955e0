"""Temporary files of outputs being written: hidden until complete, removed on an error and
on SIGTERM/SIGHUP.

An output is written to `.NAME.tmp-<pid>-<random>` in its own directory (a dot file: `ls`
and globs such as `run/rank*.parquet` do not see it) and renamed to NAME when complete. The
temporary files of this process are kept in a module-level table; the first one created
installs a handler for SIGTERM and SIGHUP, but only for a signal whose handler is still the
default (a program with its own handler keeps it; call `remove_all()` from it) and only from
the main thread (Python allows no other). The handler removes this process's temporary files,
then restores the default action and sends the signal again, so the process still ends as
the signal says (exit status 128 + the signal in a shell). SIGINT needs nothing: it raises
KeyboardInterrupt, and the `with` block's error path removes the file. `kill -9` leaves the
hidden file behind.
"""

import os
import secrets
import signal
import threading

# temporary path → the pid that created it (a forked child must not remove its parent's).
_LIVE = {}
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def create(path):
    """Creates an empty hidden temporary file next to `path` and returns its path."""
    directory, name = os.path.split(os.path.abspath(path))
    _install_handlers()
    while True:
        tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        _LIVE[tmp] = os.getpid()  # before it exists: a signal in between finds it
        try:
            # 0o666 minus the umask: the output gets the mode any new file would.
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            _LIVE.pop(tmp, None)
        except BaseException:
            _LIVE.pop(tmp, None)
            raise


def commit(tmp, path):
    """Gives the complete temporary file its name (replacing what was at `path`)."""
    os.replace(tmp, path)
    _LIVE.pop(tmp, None)


def discard(tmp):
    """Removes a temporary file (an error path; a file already gone is fine)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    _LIVE.pop(tmp, None)


def remove_all():
    """Removes every temporary file this process has open (for a signal handler)."""
    pid = os.getpid()
    for tmp, owner in list(_LIVE.items()):
        if owner == pid:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            _LIVE.pop(tmp, None)


def _on_signal(signum, frame):
    remove_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers():
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        # SIG_DFL only: not a handler of the program's own, not SIG_IGN, not None (set
        # outside Python).
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_signal)
