"""A Python sandbox for model-generated code: warm fork servers, kernel isolation, rlimits and an audit hook.

The kernel layers are the boundary; the audit hook is a convenience layer on top (Python errors a model
can learn from), not a boundary: pure Python can switch it off on CPython 3.11 (a use-after-free gives
a memory read/write without an audit event; tests/sandbox_attacks.py does it). The sandbox therefore
fails closed: it refuses to start where the kernel cannot confine the code's file access (neither
Landlock nor a mount namespace for the read-only view), unless the caller opts in with
``CodeSandboxConfig.allow_unconfined_files`` for trusted code.

The CoPES agent calls a Python tool (up to 5 calls per math trajectory; an ES step runs 40 members x
64 prompts, so thousands of short calls). The paper's agent stack runs it in Docker; this sandbox is
built for many short calls on any Linux host, as root or not, without a container.

The code is in three files: this one, the host side (the pool, the memo, the reply checks); ``sandbox_setup.py``,
the set-up process; ``sandbox_worker.py``, the worker, its children and the audit hook, the one file of copes_lib
the worker may read (it imports nothing from copes_lib). The kernel layers themselves are :mod:`isolation`.

How a call runs::

    PythonSandbox (host) --socket--> W set-up processes (``sandbox_setup.py``): load ctypes, enter a
                                   network, UTS, IPC, mount and pid namespace (the temp folder becomes a
                                   private tmpfs, the calls' storage quota; /proc is read-only with the
                                   worker and the kernel's files masked), fork the worker, which sets
                                   no_new_privs, Landlock (read the Python installation, write only the
                                   working folder) and seccomp on itself, then execve()s
        --> the worker (``sandbox_worker.py serve``, process 1 of its pid namespace): a fresh interpreter that
            never loads ctypes; imports the allowed modules once
            --fork()--> a child, prepared BEFORE the call arrives: drops privileges (when root), sets
                        rlimits, waits for the call's secret and code; installs the audit hook,
                        exec()s the code; the worker reads its stdout and status sockets and its exit
                        status, then ends every process left in the namespace

Why two processes (issue 33): once ``_ctypes`` is imported, its classes stay reachable through
``object.__subclasses__()`` whatever references are dropped, and indexing a ctypes pointer writes any
memory without an audit event -- from there the code emptied the hook's rules and forged a success.
The kernel layers are therefore applied once per worker, before an exec into a clean interpreter, and
inherited by every child. (This removes the easiest memory write, not every one: see above.)
``layers='hook-only'`` starts the worker directly, and only with ``allow_unconfined_files``.

The worker forks the next child right after replying, while the host is busy, so a call does not pay
for starting an interpreter (tens of ms) nor, mostly, for the fork (under 1 ms); the kernel set-up is
paid once per worker. ``benchmarks/bench_sandbox.py`` measures calls/s against
``subprocess.run([python, "-c", code])`` and against main's sandbox. Every call starts from the same
worker state in the same, emptied working folder: calls cannot see each other's variables, files or
module changes, and one bad call cannot damage the next. The folder is emptied without recursion or
long paths (a subfolder's entries are renamed up before it is removed; a 1,500-deep chain costs
milliseconds), the worker reports "ready" after that and only then reads the next call; a worker that
exited, or died before "ready", is replaced and the call goes to the replacement. The host checks
every reply's keys and types, and the call's nonce in it (see _Worker.call). Every channel is a Unix
socket pair, which no process can reopen through /proc (a pipe it can); as root the worker is
non-dumpable. With the hook switched off, no call reaches its worker or another call
(tests/test_sandbox_reach.py, docs/sandbox.md).

Layers (``CodeSandboxConfig.layers``; :mod:`copes_lib.tools.isolation` probes which the kernel
offers, the sandbox records them in ``PythonSandbox.layers`` and warns naming any that is missing;
``CodeSandboxConfig.without`` simulates a host that lacks some, for tests; docs/sandbox.md has the
table of which layer stops which attack, and which hosts lack which layer):

1. kernel, per worker: Landlock (file reads and writes, whatever path, ``dir_fd`` or descriptor
   trick; executing anything but the interpreter; TCP and signals on ABI >= 4 / 6) or, where Landlock is
   missing, a read-only view of the interpreter's files as the mount namespace's root, seccomp (sockets,
   fork/vfork/clone3, execveat, ptrace, memfd, io_uring, namespaces, mounts, System V IPC and message
   queues, whose objects would outlive the call: the process is killed),
   no_new_privs and no capabilities, a network namespace without interfaces, a private tmpfs of
   ``temp_quota_mb``, a pid namespace with its own /proc (the children cannot name a host process;
   nothing outlives the call). Unprivileged hosts get the namespaces through a user namespace that maps
   only their own uid.
2. rlimits: wall-clock timeout (the worker kills the child's process group), RLIMIT_CPU, RLIMIT_AS
   (``memory_mb`` on top of the warm interpreter), RLIMIT_NPROC = 0, RLIMIT_FSIZE, RLIMIT_NOFILE, no
   core files, and a hard stop after ``max_printed_chars`` printed characters (counted by the worker).
3. the audit hook (``sys.addaudithook``), a convenience layer and no boundary: it gives Python-level
   errors a small model can learn from, until memory corruption switches it off. It denies sockets, subprocesses,
   exec/spawn/fork, signals, ctypes, rlimit changes, tracing, gc introspection, a second audit hook,
   code objects built by hand and marshal (unchecked memory access in CPython), traceback / generator
   frames (the ways to the hook's own state), reads outside the Python installation and the call's
   folder, writes outside the folder (relative paths resolved against their ``dir_fd``), folder
   descriptors outside the call's folder, symlinks and hard links, and imports of modules outside the
   standard library and the preloaded packages; without a private tmpfs it counts the call's bytes and
   entries. os functions without audit events (pidfd_open, memfd_create, mkfifo, ...) are deleted in
   the child, with ``_imp.create_builtin`` / ``create_dynamic`` so that no fresh copy of a builtin or
   extension module brings them back. A denied action ends the call at once, from inside the hook (the
   code cannot catch it). The frames below the code (the worker's) are reachable with
   ``sys._getframe``; they hold no ctypes, no secret and no descriptor to the host.

Results the code cannot forge (while the hook holds): the worker reads the code's prints from the child's stdout pipe (text,
never parsed), and the verdict from the exit status plus a per-call secret that only the audit hook
holds (the child reads it in a frame that ends before the code runs) and writes after exec() returned.
A success needs both, so a forged record, an ``os._exit(0)`` or a caught denial is a failure, and
failures are never memoised. This holds while the hook holds, i.e. until the code corrupts memory:
see below for what a forged success then can and cannot do. Errors come back as Python's last
traceback line (``NameError: name 'x' is not defined``).

Determinism: PYTHONHASHSEED=0, ``random`` (and numpy's global RNG when preloaded) are reseeded with 0
before each call, and object addresses in the output (``<... at 0x7f...>``) are masked. The same code
therefore gives the same output on any worker; this is what makes the memo sound: with
``memo_size > 0`` (the default) a successful call's result is reused for identical code (ES members
often emit the same code). Code that reads the clock or ``os.urandom`` would get a stale value.

Linux only (fork, /proc, rlimits; pidfd when the kernel has it, else polling; seccomp on x86_64).

The value of a final expression is NOT printed (unlike a REPL): the agent protocol asks the model to
``print`` what it wants to see, and an empty output is reported as ``(no output)``.

What this does not protect against (the table is in docs/sandbox.md#layers-and-what-they-stop). The
kernel layers confine what the process can reach, not what it computes. Code that corrupts memory --
pure Python through a CPython 3.11 use-after-free, or a preloaded package with native memory access
(sympy loads ctypes, numpy's ``as_strided`` takes any stride; the sandbox warns naming them,
:func:`copes_lib.tools.isolation.warn_native_access`) -- can switch the hook off and may forge a
success: ``ok=True`` with any output for that call, which the memo then reuses for the same code. Nothing else depends on ``ok``: it is the reward signal of that one
call, never a permission. Even then it cannot read or write outside the allowed folders, open a socket,
start a process or signal the host where the kernel layers are present. ``os.stat`` and friends have no
audit event, and Landlock does not restrict them: the code can learn whether a path exists (in the
read-only view, only paths of the view exist). With ``layers='hook-only'``, or on a host with neither
Landlock nor namespaces, nothing in the kernel confines the code's files: the sandbox refuses to start
unless ``allow_unconfined_files=True``, and with it, code that switches the hook off reads and writes
whatever the host's user can. There, run the workers in a container (``--network none``, read-only
root, unprivileged user, seccomp, cgroup limits) or under gVisor, nsjail or bubblewrap.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import select
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from copes_lib.config import Config, ConfigError, param
from copes_lib.tools import isolation
from copes_lib.tools import sandbox_worker as worker
from copes_lib.tools.sandbox_worker import (
    _HEADER,
    DEFAULT_PRELOAD,
    MAX_CODE_CHARS,
    NONCE_BYTES,
    SETUP_EXIT,
    python_error,
    remove_tree,
)

#: the set-up process's script (layers other than 'hook-only'): it applies the kernel layers, then execs the worker
SETUP_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_setup.py")


@dataclasses.dataclass(frozen=True)
class CodeSandboxConfig(Config):
    """Limits and pool size of :class:`PythonSandbox`."""

    timeout_s: float = param(2.0, "wall-clock limit of one call in seconds; the child is killed after it",
                             gt=0.0, le=600.0)
    memory_mb: int = param(512, "address space (MiB) the code may allocate on top of the warm interpreter",
                           ge=16)
    max_output_chars: int = param(400, "characters of printed output (and of the error) kept in the result",
                                  ge=1)
    workers: int = param(2, "warm worker processes; run_many runs this many calls at once", ge=1, le=256)
    max_printed_chars: int = param(100_000, "a call that prints more than this many characters is stopped "
                                   "and fails (runaway print loops)", ge=1)
    file_size_mb: int = param(8, "largest file (MiB) the code may write inside its temp dir (RLIMIT_FSIZE)",
                              ge=0)
    memo_size: int = param(4096, "successful results memoised by code string (LRU); 0 disables the memo",
                           ge=0)
    preload: str = param(DEFAULT_PRELOAD, "comma-separated modules imported in every worker; only these "
                         "third-party packages (e.g. add 'numpy,sympy') are importable by the code")
    temp_root: str = param("", "folder for the per-call temp dirs; '' = /dev/shm when writable (a RAM "
                           "file system: a temp dir costs microseconds there, milliseconds on disk), else "
                           "the system temp dir")
    drop_privileges: bool = param(True, "when the host runs as root, run the code as user 'nobody' so the "
                                  "kernel enforces RLIMIT_NPROC and file permissions")
    temp_quota_mb: int = param(64, "total MiB of files a call may keep in its working directory (a private "
                               "tmpfs of this size where mount namespaces are available)", ge=1)
    layers: str = param("auto", "isolation: 'auto' = every kernel layer this host offers (Landlock or the "
                        "read-only view, seccomp, no_new_privs, network namespace, private tmpfs) under the audit "
                        "hook, with a warning naming any that is missing and a refusal where the file system is "
                        "not confined; 'hook-only' = audit hook and rlimits only (for comparison; needs "
                        "allow_unconfined_files); 'kernel-only' = the kernel layers without "
                        "the hook's rules (to test them alone; fails where any is missing)",
                        choices=("auto", "hook-only", "kernel-only"))
    allow_unconfined_files: bool = param(False, "start even where the kernel cannot confine the code's file "
                                         "access (no Landlock and no mount namespace for the read-only "
                                         "view, or layers='hook-only'): only the audit hook, which is no "
                                         "boundary, then guards the host's files. Only for trusted code "
                                         "(docs/sandbox.md, per host type)")
    without: str = param("", "comma-separated kernel layers NOT to use even where the host offers them, to "
                         "test what a host without them gets (layers 'auto' and 'kernel-only'): landlock, "
                         "seccomp, namespaces")

    def check(self) -> None:
        for name in self.without_layers():
            if name not in ("landlock", "seccomp", "namespaces"):
                raise ConfigError(f"CodeSandboxConfig.without: {name!r} is not a layer that can be left out; "
                                  "give comma-separated names from landlock, seccomp, namespaces")
        if self.without_layers() and self.layers == "hook-only":
            raise ConfigError("CodeSandboxConfig.without needs layers='auto' or 'kernel-only', got "
                              f"layers={self.layers!r}")
        for name in self.preload_modules():
            if not all(part.isidentifier() for part in name.split(".")):
                raise ConfigError(f"CodeSandboxConfig.preload: {name!r} is not a module name; "
                                  "give comma-separated module names such as 'math,numpy'")
        if self.max_printed_chars < self.max_output_chars:
            raise ConfigError("CodeSandboxConfig.max_printed_chars must be >= max_output_chars "
                              f"({self.max_printed_chars} < {self.max_output_chars})")

    def preload_modules(self) -> list[str]:
        return [name.strip() for name in self.preload.split(",") if name.strip()]

    def without_layers(self) -> list[str]:
        return [name.strip() for name in self.without.split(",") if name.strip()]


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one call. ``error`` is "" when ``ok``; ``cached`` marks a memo hit."""

    ok: bool
    output: str
    error: str
    elapsed_s: float
    cached: bool = False

    def observation(self) -> str:
        """The text fed back to the model: the output, then the error (Python's last traceback line)."""
        output = self.output if self.output.strip() else ""
        if self.ok:
            return output or "(no output)"
        return f"{output.rstrip()}\n{self.error}" if output else self.error


# ============================================================================ host side
class _Worker:
    """One zygote process and the socket to it. Used by one thread at a time."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.proc = None
        self.awaiting_ready = False  # True between a reply and the worker's report that it cleaned up
        self.pidfd = None
        self.spawn()

    def spawn(self) -> None:
        import subprocess  # only the host needs it; the zygote must not have it loaded

        env = {
            # HOME: without it, site's expanduser("~") asks the passwd database (nscd: a socket, which
            # seccomp kills); 'nobody''s home, which does not exist
            "PATH": os.defpath, "HOME": "/nonexistent", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
            "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            # so the zygote finds copes_lib.config even without an installed package
            "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        # the host makes (and finally removes) the zygote's temp dir; its name carries the host's pid, so
        # the next sandbox of this user removes what a killed host left (remove_stale_dirs)
        temp_root = temp_root_of(self.settings)
        self.base_dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=temp_root)
        settings = {**self.settings, "base_dir": self.base_dir}
        # layers other than 'hook-only': a set-up process applies them, then execs the worker (see _setup_main)
        mode = "serve" if settings["layers"] == "hook-only" else "setup"
        self.server_pid = None
        # Unix socket pairs, not pipes: a process of the host's uid can reopen another process's pipe
        # through /proc/<pid>/fd/<n> (Landlock does not confine pipes), never a socket (ENXIO). The
        # worker's stderr is one too: what it says reaches the host's stderr only framed (see _stderr_text).
        channel, theirs = socket.socketpair()
        errors, their_errors = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-s", "-B", *((SETUP_SCRIPT,) if mode == "setup" else (os.path.abspath(worker.__file__), mode)),
                 json.dumps(settings)],
                stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=their_errors.fileno(), env=env,
                close_fds=True, start_new_session=True,  # a Ctrl-C in the host's terminal does not reach the zygotes
            )
        except BaseException:
            for sock in (channel, errors):
                sock.close()
            raise
        finally:
            theirs.close()
            their_errors.close()
        self.channel, self.errors = channel, errors
        self.errors.setblocking(False)
        self.last_nonce = None  # the call whose "ready" is still to come

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        self.awaiting_ready = False
        deadline = time.monotonic() + timeout_s
        reply = self._receive(deadline)
        if isinstance(reply, dict) and isinstance(reply.get("server_pid"), int):  # from the set-up process
            self.server_pid = reply["server_pid"]
            reply = self._receive(deadline)
        if not isinstance(reply, dict) or not reply.get("ready"):
            try:
                self.proc.wait(timeout=2.0)  # (its last words are on its stderr once it has exited)
            except Exception:  # noqa: BLE001 - killed below
                pass
            status = self.proc.poll()
            said = self._stderr_text()
            self.kill()
            hint = ""
            if status == SETUP_EXIT:  # the set-up process could not apply a layer it had detected
                hint = ("; the kernel layers could not be set up: CodeSandboxConfig.without leaves one out, "
                        "layers='hook-only' all of them (a weaker sandbox: docs/sandbox.md)")
            raise RuntimeError(f"sandbox worker failed to start (exit status {status}; its stderr: "
                               f"{said or '(nothing)'}): {reply}{hint}")
        if reply.get("failed"):
            self.kill()
            raise ConfigError(f"CodeSandboxConfig.preload: cannot import {reply['failed']} in the sandbox worker")
        self.layers = reply.get("layers", {})
        self.native_access = reply.get("native_access", [])
        self.relay_stderr()
        try:  # readable once the worker exits (even before its parent reaps it)
            self.pidfd = os.pidfd_open(self.server_pid or self.proc.pid)
        except (AttributeError, OSError):  # kernels before 5.3: the set-up process's exit status only
            self.pidfd = None

    def exited(self) -> bool:
        """Whether the worker process has exited (a check of a few microseconds)."""
        if self.pidfd is not None and select.select([self.pidfd], [], [], 0)[0]:
            return True
        return self.proc.poll() is not None

    def _stderr_text(self, limit: int = 4000) -> str:
        """What the worker wrote on its stderr so far (its set-up errors), as one quoted line."""
        data = b""
        try:
            while len(data) < limit and (chunk := self.errors.recv(limit)):
                data += chunk
        except OSError:  # (BlockingIOError: nothing more for now)
            pass
        return repr(data[:limit].decode("utf-8", "replace").strip()) if data.strip() else ""

    def relay_stderr(self) -> None:
        """Pass on what the worker wrote on its stderr (a warning of a preloaded package, say), framed: one
        quoted line naming the worker, never raw bytes a call could shape into the host's log."""
        said = self._stderr_text()
        if said:
            print(f"[sandbox worker {self.server_pid or self.proc.pid}] stderr: {said}", file=sys.stderr, flush=True)

    def _send(self, code: str, nonce: bytes) -> None:
        data = nonce + code.encode("utf-8", "replace")
        self.channel.sendall(_HEADER.pack(len(data)) + data)

    def _receive(self, deadline: float) -> dict | None:
        """The zygote's next message, or None if it died or missed ``deadline``."""
        fd = self.channel.fileno()
        chunks, need, header = [], _HEADER.size, True
        while need:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                    return None
                chunk = os.read(fd, need)
            except OSError:  # (a socket whose peer died with bytes unread says ECONNRESET, a pipe EOF)
                return None
            if not chunk:
                return None
            chunks.append(chunk)
            need -= len(chunk)
            if not need and header:
                (need,), chunks, header = _HEADER.unpack(b"".join(chunks)), [], False
                if need > MAX_REPLY_BYTES:
                    return None
        try:
            return json.loads(b"".join(chunks).decode("utf-8"))
        except ValueError:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
            return None

    def call(self, code: str, timeout_s: float) -> dict:
        """Send ``code``; return the worker's reply, checked (a failed reply when it is missing or malformed).

        The code is sent at once (the worker reads it once it has cleaned up after the previous call, so
        its clean-up overlaps the host's work), and the worker's "ready" for that clean-up is read before
        the reply. A worker that exited between calls, or died or hung before "ready", never read the
        code: it is replaced and the code sent again, so no call finds the files or processes a previous one left.

        Every call carries a fresh nonce, which the worker learns only after the call's child was forked
        (so no call's memory holds the nonce of another) and repeats in its reply and in its next "ready":
        a message that does not name the call it answers (forged, or one call late) fails the call and
        replaces the worker, so nothing shifts the replies of later calls."""
        if self.exited():
            self.restart()
        reply = None
        nonce = os.urandom(NONCE_BYTES)
        for _attempt in range(2):
            try:
                self._send(code, nonce)
            except (OSError, ValueError):  # (BrokenPipeError is an OSError) the reads below say why
                pass
            if self.awaiting_ready:
                message = self._receive(time.monotonic() + READY_TIMEOUT_S)
                self.awaiting_ready = False
                if not (isinstance(message, dict) and message.get("ready") is True
                        and message.get("call") == self.last_nonce):
                    self.restart()
                    continue
            reply = self._receive(time.monotonic() + timeout_s + 30.0)
            break
        self.relay_stderr()
        if reply is None:
            self.restart()
            return _failed_reply("RuntimeError: the sandbox worker died or stopped responding; it was restarted")
        checked = _checked_reply(reply)
        if checked is None:
            self.restart()
            return _failed_reply("RuntimeError: the sandbox worker sent a malformed reply; it was restarted")
        if reply.get("call") != nonce.hex():
            self.restart()
            return _failed_reply("RuntimeError: the sandbox worker's reply did not name this call (forged or out "
                                 "of order); it was restarted")
        self.awaiting_ready = True
        self.last_nonce = nonce.hex()
        return checked

    def restart(self) -> None:
        self.kill()
        self.spawn()
        self.wait_ready()

    def kill(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            for sock in (self.channel, self.errors):
                try:
                    sock.close()
                except OSError:
                    pass
            remove_tree(self.base_dir)  # (no recursion: the code may have nested folders 1,500 deep)

    def close(self, grace_s: float = 2.0) -> None:
        """Ask the zygote to exit (EOF on its channel: it removes its temp dir), kill it if it does not."""
        if self.proc is None:
            return
        try:
            self.channel.shutdown(socket.SHUT_WR)
            self.proc.wait(timeout=grace_s)
        except Exception:  # noqa: BLE001 - any failure here ends in a kill
            pass
        self.kill()


TEMP_PREFIX = "copes-sandbox-"  # + the host's pid + "-": the workers' temp folders


def temp_root_of(settings: dict) -> str | None:
    """The folder that holds the workers' temp folders: ``temp_root``, else /dev/shm, else the system's."""
    return settings["temp_root"] or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)


def remove_stale_dirs(temp_root: str | None) -> list[str]:
    """Remove the workers' temp folders that a killed host of this user left in ``temp_root`` (their name
    carries the host's pid, no longer running). Returns what was removed."""
    folder = temp_root or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        pid, dash, _ = entry.name[len(TEMP_PREFIX):].partition("-")
        if not (entry.name.startswith(TEMP_PREFIX) and pid.isdigit() and dash):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            os.kill(int(pid), 0)  # alive (or another user's process of that pid): left alone
            continue
        except ProcessLookupError:
            pass
        except OSError:
            continue
        remove_tree(entry.path)
        removed.append(entry.path)
    return removed


READY_TIMEOUT_S = 30.0  # the longest a worker's clean-up after a call may take before it is replaced
MAX_REPLY_BYTES = 1 << 24
_REPLY_TYPES = {"ok": (bool,), "output": (str,), "error": (str,), "elapsed_s": (int, float)}


def _failed_reply(error: str) -> dict:
    return {"ok": False, "output": "", "error": error, "elapsed_s": 0.0}


def _checked_reply(reply) -> dict | None:
    """The worker's reply with exactly the expected keys and types, or None when it is malformed."""
    if not isinstance(reply, dict):
        return None
    for key, types in _REPLY_TYPES.items():
        value = reply.get(key)  # ("call", the nonce, is checked by _Worker.call)
        if not isinstance(value, types) or (key == "elapsed_s" and isinstance(value, bool)):
            return None
    if not math.isfinite(reply["elapsed_s"]):
        return None
    return {key: reply[key] for key in _REPLY_TYPES}


def _close_workers(workers: list[_Worker], executor: list, owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked copy of the host must not stop the host's workers
        return
    for each in workers:
        try:
            each.close()
        except Exception:  # noqa: BLE001 - close() never raises; the worker's process group is gone anyway
            pass
    workers.clear()
    for pool in executor:
        pool.shutdown(wait=False)
    executor.clear()


class PythonSandbox:
    """A pool of warm sandbox workers. ``run`` never raises for bad or hostile code.

    >>> with PythonSandbox() as box:                 # doctest: +SKIP
    ...     box.run("print(2 + 3)").observation()
    '5\\n'
    """

    def __init__(self, config: CodeSandboxConfig | None = None):
        self.config = config if config is not None else CodeSandboxConfig()
        self._workers: list[_Worker] = []
        self._executor: list[ThreadPoolExecutor] = []  # a list, so the finalizer can shut it down
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._start_lock = threading.Lock()
        self._memo: OrderedDict[str, SandboxResult] = OrderedDict()
        self._memo_lock = threading.Lock()
        self._closed = False
        self.layers: dict[str, str] = {}  # the kernel layers the workers run under, set by start()
        self.native_access: list[str] = []  # preloaded packages that loaded ctypes (see start())
        self.stale_removed: list[str] = []  # temp folders of killed hosts that start() removed
        # close the workers even if the caller forgets to (garbage collection or interpreter exit)
        self._finalizer = weakref.finalize(self, _close_workers, self._workers, self._executor, os.getpid())

    # -- lifecycle
    def _settings(self) -> dict:
        c = self.config
        return {
            "timeout_s": c.timeout_s, "memory_mb": c.memory_mb, "max_output_chars": c.max_output_chars,
            "max_printed_chars": c.max_printed_chars, "file_size_mb": c.file_size_mb,
            "preload": c.preload_modules(), "drop_privileges": c.drop_privileges, "temp_root": c.temp_root,
            "temp_quota_mb": c.temp_quota_mb, "layers": c.layers, "without": c.without_layers(),
        }

    def start(self) -> PythonSandbox:
        """Start the workers now (otherwise the first call does). Workers start in parallel."""
        with self._start_lock:
            if self._closed:
                raise RuntimeError("PythonSandbox is closed")
            if not self._workers:
                if self.config.layers == "hook-only" and not self.config.allow_unconfined_files:
                    raise isolation.refusal({}, "layers='hook-only' runs without any kernel confinement of the "
                                                "file system (Landlock or the read-only mount-namespace view)")
                self.stale_removed = remove_stale_dirs(temp_root_of(self._settings()))
                fresh = [_Worker(self._settings()) for _ in range(self.config.workers)]
                try:
                    for worker in fresh:
                        worker.wait_ready()
                except BaseException:
                    for worker in fresh:
                        worker.kill()
                    raise
                self.layers = dict(fresh[0].layers)
                self.native_access = list(fresh[0].native_access)
                if self.native_access:
                    isolation.warn_native_access(self.native_access, self.layers)
                if self.config.layers == "kernel-only":
                    # (with ``without``: a host that lacks those layers, with the hook switched off -- what
                    # code that corrupted memory meets there; the read-only view stands in for Landlock)
                    left_out = {name for group in self.config.without_layers()
                                for name in isolation.SIMULATED_MISSING[group]}
                    if isolation.READ_ONLY_VIEW in self.layers:
                        left_out.add("landlock")
                    missing = [name for name in isolation.KERNEL_LAYERS
                               if name not in self.layers and name not in left_out]
                    if missing or isolation.file_confinement(self.layers) is None:
                        for worker in fresh:
                            worker.close()
                        raise RuntimeError(f"CodeSandboxConfig.layers='kernel-only': this host lacks "
                                           f"{missing or 'file confinement'}")
                elif self.config.layers == "auto":
                    if isolation.file_confinement(self.layers) is None and not self.config.allow_unconfined_files:
                        for worker in fresh:  # (an orderly exit: a killed set-up process would orphan its worker)
                            worker.close()
                        simulated = f" (CodeSandboxConfig.without={self.config.without!r})" if self.config.without \
                            else ""
                        raise isolation.refusal(self.layers, (
                            f"this host{simulated} offers neither Landlock (Linux >= 5.13, not blocked by a "
                            "container's seccomp profile) nor a mount and pid namespace for the read-only view "
                            "(user namespaces are disabled here, or the view could not be built)"))
                    isolation.warn_missing(self.layers)
                self._workers.extend(fresh)
                for worker in fresh:
                    self._idle.put(worker)
                self._executor.append(ThreadPoolExecutor(self.config.workers, thread_name_prefix="sandbox"))
        return self

    def close(self) -> None:
        """Stop every worker process; the sandbox cannot be used afterwards."""
        with self._start_lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> PythonSandbox:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def describe_layers(self) -> str:
        """The isolation layers of this sandbox in one line (for reports), e.g. 'landlock (ABI 7) + ...'."""
        if not self._workers:
            self.start()
        if self.config.layers == "hook-only":
            return "rlimits + audit hook (layers='hook-only')"
        return isolation.describe(self.layers)

    def worker_pids(self) -> list[int]:
        """Process ids of the zygotes, the processes that fork the calls' children (for tests and
        monitoring). With kernel layers, each has a set-up process as its parent."""
        return [w.server_pid or w.proc.pid for w in self._workers]

    # -- calls
    def run(self, code: str) -> SandboxResult:
        """Run ``code`` in a fresh child of a warm worker; return its output or a Python-style error."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if len(code) > MAX_CODE_CHARS:
            return SandboxResult(False, "", f"ValueError: the code is longer than {MAX_CODE_CHARS} characters", 0.0)
        memo = self._memo_get(code)
        if memo is not None:
            return memo
        if not self._workers:
            self.start()
        worker = self._idle.get()
        try:
            reply = worker.call(code, self.config.timeout_s)
        except Exception as exc:  # noqa: BLE001 - e.g. a replacement worker that failed to start
            reply = _failed_reply(f"RuntimeError: the sandbox worker could not be replaced: {python_error(exc)}")
        finally:
            self._idle.put(worker)  # (a dead one is replaced on its next call)
        result = SandboxResult(ok=reply["ok"], output=reply["output"], error=reply["error"],
                               elapsed_s=float(reply["elapsed_s"]))
        if result.ok:
            self._memo_put(code, result)
        return result

    def run_many(self, codes: list[str]) -> list[SandboxResult]:
        """Run every code over the pool in parallel; results keep the order of ``codes``.

        Identical codes in one batch run once when the memo is on.
        """
        codes = list(codes)
        if not codes:
            return []
        if not self._workers:
            self.start()
        unique = list(dict.fromkeys(codes)) if self.config.memo_size > 0 else codes
        if len(unique) == 1 or self.config.workers == 1:
            results = [self.run(code) for code in unique]
        else:
            results = list(self._executor[0].map(self.run, unique))
        if unique is codes:
            return results
        by_code = dict(zip(unique, results))
        first_seen: set[str] = set()
        ordered = []
        for code in codes:  # repeats of a code in the batch are memo hits (failures are just copied)
            result = by_code[code]
            if code in first_seen:
                result = dataclasses.replace(result, cached=True, elapsed_s=0.0) if result.ok \
                    else dataclasses.replace(result)
            first_seen.add(code)
            ordered.append(result)
        return ordered

    def _memo_get(self, code: str) -> SandboxResult | None:
        if self.config.memo_size == 0:
            return None
        with self._memo_lock:
            hit = self._memo.get(code)
            if hit is None:
                return None
            self._memo.move_to_end(code)
        return dataclasses.replace(hit, cached=True, elapsed_s=0.0)

    def _memo_put(self, code: str, result: SandboxResult) -> None:
        if self.config.memo_size == 0:
            return
        with self._memo_lock:
            self._memo[code] = result
            self._memo.move_to_end(code)
            while len(self._memo) > self.config.memo_size:
                self._memo.popitem(last=False)
