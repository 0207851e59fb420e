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

How a call runs::

    PythonSandbox (host) --socket--> W set-up processes (``sandbox.py setup``): load ctypes, enter a
                                   network, UTS, IPC, mount and pid namespace (the temp folder becomes a
                                   private tmpfs, the calls' storage quota; /proc is read-only with the
                                   worker and the kernel's files masked), fork the worker, which sets
                                   no_new_privs, Landlock (read the Python installation, write only the
                                   working folder) and seccomp on itself, then execve()s
        --> the worker (``sandbox.py serve``, process 1 of its pid namespace): a fresh interpreter that
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
import re
import select
import signal
import stat
import struct
import sys
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

if __name__ != "__main__":  # the host
    import socket  # (never in the worker: a module it has loaded imports in the children without an audit event)

    from copes_lib.config import Config, ConfigError, param
    from copes_lib.tools import isolation
else:  # the set-up process and the worker need no config class; under Landlock copes_lib is not readable

    class ConfigError(ValueError):
        pass

    class Config:
        pass

    def param(default, help, **checks):
        return default

# Modules imported once in every zygote; the model's code may import these and the rest of the
# standard library that is not denied below. Third-party packages are importable only if preloaded.
DEFAULT_PRELOAD = ("math,cmath,fractions,decimal,statistics,itertools,functools,collections,heapq,"
                   "bisect,operator,random,re,string,datetime,calendar,json,copy,numbers,typing,"
                   "dataclasses,textwrap,unicodedata,array,enum,pprint,time,_strptime,hashlib,base64,"
                   "csv,struct,io,zlib")

# Standard-library modules the sandboxed code may not import: processes, network, native calls,
# OS-level handles, and modules that read files through C without audit events. (A module the zygote
# has already loaded, e.g. signal or threading, imports without an audit event; for those, the audit
# events of what they do are what counts.)
DENIED_IMPORTS = frozenset({
    "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "concurrent", "asyncio",
    "socket", "_socket", "ssl", "_ssl", "socketserver", "http", "urllib", "ftplib", "smtplib", "poplib",
    "imaplib", "nntplib", "telnetlib", "xmlrpc", "webbrowser", "ctypes", "_ctypes", "mmap", "pty",
    "tty", "termios", "fcntl", "resource", "signal", "_signal", "_thread", "threading", "sqlite3",
    "_sqlite3", "dbm", "_dbm", "_gdbm", "shelve", "pwd", "grp", "spwd", "syslog", "readline", "curses",
    "_curses", "tkinter", "_tkinter", "turtle", "idlelib", "ensurepip", "venv", "_posixshmem", "pdb",
    "faulthandler", "tracemalloc", "_tracemalloc", "select", "selectors", "crypt", "_crypt", "_xxsubinterpreters",
    "_xxinterpchannels",
})

# Audit events denied outright (prefix match).
DENIED_EVENTS = (
    "socket.", "subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
    "os.forkpty", "os.kill", "os.killpg", "signal.", "ctypes.", "resource.", "sys.settrace",
    "sys.setprofile", "gc.get_",
    "os.symlink", "os.link", "os.startfile", "pty.", "sqlite3.", "webbrowser.", "urllib.", "http.",
    "ftplib.", "smtplib.", "poplib.", "imaplib.", "nntplib.", "telnetlib.", "syslog.", "winreg.",
    "_winapi.", "msvcrt.", "os.add_dll_directory", "cpython.remote_debugger",
    # a second hook would be called with the sandbox's frames in reach; a crafted code object or
    # marshal stream is an unchecked memory read/write in CPython (imports in the child compile from
    # source instead of reading .pyc files, see _child)
    "sys.addaudithook", "code.__new__", "marshal.load",
)
# Attributes that hand out the frames of a traceback or a generator. An exception raised by the hook
# carries the hook's own frames; from them, its closure (and the rules) would be reachable.
# (sys._getframe is allowed: namedtuple, enum and logging use it, and it only walks the caller's stack.)
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Audit events whose path argument must lie inside the call's temp dir (writes) or be readable.
# (shutil and glob are not listed: they work through the os calls and open(), which are checked.)
WRITE_EVENTS = ("os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.truncate", "os.chmod", "os.chown",
                "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "os.chdir")
READ_EVENTS = ("os.listdir", "os.scandir", "os.getxattr", "os.listxattr")
SANDBOX_UID = SANDBOX_GID = 65534  # 'nobody' / 'nogroup' on Linux (pwd is not loaded: see DENIED_IMPORTS)
# os functions without audit events that could reach outside the sandbox; removed in every child
# (builtin modules cannot be reloaded, so the code cannot get them back).
UNAUDITED_OS_FUNCTIONS = ("pidfd_open", "mkfifo", "mknod", "openpty", "login_tty", "setns", "unshare",
                          "memfd_create", "eventfd")
# For code that uses numpy / sympy (e.g. a pretrained model in the gpu profile). numpy loads some
# submodules lazily; they are listed because the children cannot load extension modules themselves.
# Forking a worker with these loaded costs several times more (the bigger the process, the slower
# the fork), and ctypes comes with numpy (see "What this does not protect against").
SCIENTIFIC_PRELOAD = DEFAULT_PRELOAD + ",numpy,numpy.random,numpy.linalg,numpy.fft,sympy"
# Preloads that hand the code unchecked memory access without ctypes (numpy: as_strided, any stride)
NATIVE_MEMORY_PACKAGES = ("numpy",)
_HEADER = struct.Struct(">I")
# Exit statuses of a child: the code finished (0) or raised (1); the audit hook ended it on a denied
# action (DENIED_EXIT); the kernel layers could not be set up (SETUP_EXIT). A success also needs the
# call's secret on the status pipe (see _verdict).
FINISHED_EXIT, FAILED_EXIT, DENIED_EXIT, SETUP_EXIT = 0, 1, 86, 87
DONE_EVENT = "copes.sandbox.done"  # raised by _run_code after exec() returned; handled by the audit hook
FAILED_EVENT = "copes.sandbox.failed"  # raised by _run_code when the code raised: no success afterwards
TOKEN_BYTES = 16  # the per-call secret
_STATUS_KEEP = 65536  # bytes of the status pipe kept (its tail: the last record)
TEMP_MAX_FILES = 4096  # inodes of the private tmpfs of a worker; files + folders a call may create without it
CALL_DIR = "call"  # the children's working folder, inside the worker's temp folder (the same for every call)
AT_FDCWD = -100
# position of the dir_fd argument in the audit events that carry one (os.rename: 2 and 3)
DIR_FD_INDEX = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 2, "os.chmod": 2, "os.chown": 3, "os.utime": 3,
                "os.rename": 2}
MAX_CODE_CHARS = 1_000_000
_ADDRESS = re.compile(r"( at 0x)[0-9a-fA-F]+")  # object addresses in reprs


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


def python_error(exc: BaseException) -> str:
    """The last line of the traceback Python would print, e.g. ``NameError: name 'x' is not defined``.

    >>> python_error(NameError("name 'x' is not defined"))
    "NameError: name 'x' is not defined"
    >>> python_error(KeyError("a"))
    "KeyError: 'a'"
    >>> python_error(ZeroDivisionError())
    'ZeroDivisionError'
    """
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(exc, SyntaxError):
        return f"{name}: {exc.msg} (line {exc.lineno})"
    try:
        message = str(exc)
    except BaseException:  # a user-defined __str__ that fails
        message = "<exception str() failed>"
    return f"{name}: {message}" if message else name


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [output truncated: {len(text)} characters in total]"


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
                [sys.executable, "-s", "-B", os.path.abspath(__file__), mode, json.dumps(settings)],
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


NONCE_BYTES = 16  # names each call in the worker's reply (see _Worker.call)
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
    for worker in workers:
        try:
            worker.close()
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


# ============================================================================ zygote side
# Everything below runs in the zygote (started as ``python sandbox.py SETTINGS``) or in its children.
def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_message(fd: int, message: dict) -> None:
    data = json.dumps(message).encode("utf-8")
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _load_isolation():
    """isolation.py loaded by path: importing the package copes_lib.tools would load numpy in the zygote."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "isolation.py")
    spec = importlib.util.spec_from_file_location("_copes_sandbox_isolation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_code(program, audit, out) -> None:
    """Run the code, then ask the audit hook to end the call as a success. The hook accepts the request
    only from this function's frame called by the child's own frame, i.e. after exec() returned, and
    never after FAILED_EVENT: a failure is settled before any object of the code can be freed (a
    finalizer of the code could otherwise call a copy of this function from the child's frame)."""
    try:
        exec(program, {"__name__": "__main__", "__builtins__": __builtins__})
        out.flush()  # the code's prints (a failure here, e.g. a stdout the code broke, is the code's)
    except BaseException:
        audit(FAILED_EVENT)
        raise
    audit(DONE_EVENT)


def _make_audit_hook(tmp_dir: str, read_roots: tuple[str, ...], importable: frozenset, status_fd: int,
                     max_output_chars: int, call: bytearray, enforce: bool, quota: tuple[int, int] | None):
    """The audit hook of one child. Every helper it uses is bound here, before the untrusted code runs,
    so rebinding module attributes (``os.path.realpath = ...``) cannot change its decisions.

    It also holds the call's secret (the first TOKEN_BYTES of ``call``, wiped there): its closure is the
    one place the code cannot reach from Python without corrupting memory (frames of the hook are
    closed, gc is denied; a use-after-free reaches it, see the module doc). Only the
    hook writes the secret to the status pipe, on ``DONE_EVENT`` from :func:`_run_code` called by the
    child's frame; the zygote accepts a success only with it. A denied action ends the process at once,
    from inside the hook, with exit status ``DENIED_EXIT``: no line of the code runs after it.

    ``enforce=False`` (layers='kernel-only') keeps only the secret and the done check: the kernel
    layers alone then stand between the code and the host. ``quota`` = (bytes, entries), used where no
    private tmpfs bounds the call's storage: the files and folders the call creates (or renames to) are
    counted, and a file may be opened for writing only while the call's files hold less than ``bytes``.
    (Writes to a file already open are not events: the bound is ``bytes`` plus RLIMIT_FSIZE per file
    open at that moment, at most RLIMIT_NOFILE of them.)"""
    import posix

    # Builtins are bound here too: the code can replace builtins.type & co., and a replacement called
    # from inside the hook would run the code with the hook's frames (and closure) in reach.
    exact_type, is_subclass, length, boolean = type, issubclass, len, bool
    import_error, os_error, value_error = ImportError, OSError, ValueError
    token = bytes(call[:TOKEN_BYTES])
    call[:TOKEN_BYTES] = bytes(TOKEN_BYTES)
    getcwd, readlink, write, exit_now, stat = posix.getcwd, posix.readlink, posix.write, posix._exit, posix.stat
    lstat = posix.lstat
    getframe = sys._getframe
    child_frame = getframe(1)  # the frame of _child, which called this factory
    run_code = _run_code.__code__
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    dir_flags, os_creat = os.O_DIRECTORY | os.O_PATH, os.O_CREAT
    exact_str, exact_bytes, exact_int = str, bytes, int
    denied_imports, denied_events = DENIED_IMPORTS, DENIED_EVENTS
    write_events, read_events, frame_attributes = WRITE_EVENTS, READ_EVENTS, FRAME_ATTRIBUTES
    dir_fd_index = DIR_FD_INDEX
    devices = ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero")
    created: set[str] = set()  # files and folders the call created or renamed to (counted without a private tmpfs)
    max_bytes, max_entries = quota if quota is not None else (0, 0)
    # The byte count, kept up to date in O(1) per event: the bytes last seen per file, their total, and the
    # files opened for writing that may still be open (only those can grow; re-read at each open, and
    # pruned to the ones still open -- RLIMIT_NOFILE of them at most -- once they outnumber those twice).
    sizes: dict[str, int] = {}
    total, growing, prune_at = [0], {}, [8]

    def measure(name: str) -> None:
        try:
            now = lstat(name).st_size
        except (os_error, value_error):  # (renamed with its folder: its bytes stay counted)
            return
        total[0] += now - sizes.get(name, 0)
        sizes[name] = now

    def still_open() -> set:
        names = set()
        for fd in range(64):  # RLIMIT_NOFILE (readlink raises no audit event, unlike listdir)
            try:
                names.add(readlink(f"/proc/self/fd/{fd}"))
            except (os_error, value_error):
                pass
        return names

    failed = [False]

    def finish(record: bytes, status: int):
        # No flush of the code's stdout in here: TextIOWrapper.flush calls methods of its buffer, which
        # the code can replace, and would run them with this frame in reach. _run_code flushes before
        # DONE_EVENT; output still buffered when a denial stops the code is lost.
        try:
            while record:
                record = record[write(status_fd, record):]
        finally:
            exit_now(status)

    def deny(message: str):
        # No user code may run in here: only str operations on str built here
        error = f"PermissionError: sandbox: {message}"[:max_output_chars]
        finish(b"\0" + error.encode("utf-8", "backslashreplace"), DENIED_EXIT)

    def resolve(path: str, dir_fd) -> str | None:
        """Absolute path with symlinks resolved, using only primitives bound above; None = refused.
        A relative path is taken relative to ``dir_fd`` (the kernel does so) or the current folder."""
        if not path.startswith("/"):
            if ".." in path.split("/"):
                return None
            if dir_fd is None or (exact_type(dir_fd) is exact_int and dir_fd in (-1, AT_FDCWD)):  # -1: none
                base = getcwd()
            elif exact_type(dir_fd) is exact_int:
                try:
                    base = readlink(f"/proc/self/fd/{dir_fd}")
                except (os_error, value_error):
                    return None
                if not base.startswith("/"):
                    return None
            else:
                return None
            path = base + "/" + path
        pending, parts, links = path.split("/")[::-1], [], 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            here = "/" + "/".join(parts + [part])
            try:
                target = readlink(here)
            except (os_error, value_error):
                parts.append(part)
                continue
            links += 1
            if links > 40:
                return None
            if target.startswith("/"):
                parts = []
            pending.extend(target.split("/")[::-1])
        return "/" + "/".join(parts)

    def inside(path: str, roots) -> bool:
        for root in roots:
            if path == root or path.startswith(root + "/"):
                return True
        return False

    def is_dir(path: str) -> bool:
        try:
            return stat(path).st_mode & 0o170000 == 0o040000
        except (os_error, value_error):
            return False

    def check_path(path, writing: bool, event: str, dir_fd=None, flags: int = 0, creates: bool = False) -> str | None:
        # No user code may run in here (no repr or str of the argument, no method of a subclass): a
        # frame of this function would hand out its closure and with it the rules.
        if exact_type(path) is exact_int:  # an already open descriptor: only ones made inside the call's folder
            return
        if exact_type(path) is exact_bytes:
            path = path.decode("utf-8", "surrogateescape")
        elif is_subclass(exact_type(path), exact_str):  # (isinstance would ask the object's __class__)
            path = "".join([path])  # an exact str copy: a subclass cannot change what is checked
        else:
            deny(f"{event}: only str, bytes or file-descriptor paths are allowed")
        real = resolve(path, dir_fd)
        if real is None:
            deny(f"{event}: relative paths with '..' or an unknown dir_fd are not allowed, got {path!r}")
        mine = inside(real, (tmp_dir,))
        if writing and real == tmp_dir and event in ("os.rmdir", "os.rename", "os.remove"):
            deny(f"{event}: the working directory itself may not be removed or renamed")
        if writing:
            if not (mine or real == "/dev/null"):
                deny(f"writing {path!r} is not allowed; write only inside the working directory")
            if mine and quota is not None:
                if creates:
                    created.add(real)
                    if length(created) > max_entries:
                        deny(f"more than {max_entries} files and folders created: the call's storage quota, "
                             "counted here as no private tmpfs is available")
                if event == "os.remove":
                    total[0] -= sizes.pop(real, 0)
                    growing.pop(real, None)
                if event == "open":
                    for name in list(growing):
                        measure(name)
                    if length(growing) > prune_at[0]:
                        kept = still_open()
                        for name in list(growing):
                            if name not in kept:
                                del growing[name]
                        prune_at[0] = 2 * length(growing) + 8
                    if total[0] >= max_bytes:
                        deny(f"storage quota: the call's files hold {total[0]} bytes, temp_quota_mb allows "
                             f"{max_bytes} (counted here as no private tmpfs is available)")
                    growing[real] = True
                    measure(real)
        elif not (mine or inside(real, read_roots) or real in devices):
            deny(f"reading {path!r} is not allowed; only the working directory and the Python "
                 "installation are readable")
        # A directory descriptor would let later calls name paths relative to it (dir_fd), which the
        # "open" event does not report: only folders inside the working directory may be opened.
        if event == "open" and not mine and (flags & dir_flags or is_dir(real)):
            deny(f"opening the folder {path!r} as a descriptor is not allowed outside the working directory")
        return real

    def hook(event: str, args: tuple) -> None:
        if event == DONE_EVENT:
            caller = getframe(1)
            if caller.f_code is run_code and caller.f_back is child_frame and not failed[0]:
                finish(b"\0" + token, FINISHED_EXIT)
            deny("the end of a call may only be reported by the sandbox itself")
        if event == FAILED_EVENT:  # anyone may settle a call as failed; nobody can undo it
            failed[0] = True
            return
        if not enforce:
            return
        if event == "open":
            if length(args) != 3:  # (sys.audit lets the code raise any event with any arguments)
                deny("open: unexpected arguments")
            path, _mode, flags = args
            if exact_type(flags) is not exact_int:  # the OS flags computed by C decide, never a str mode
                deny("open: unexpected flags")
            check_path(path, boolean(flags & write_flags), "open", None, flags, boolean(flags & os_creat))
        elif event == "import":
            if exact_type(args[0]) is not exact_str:  # a str subclass could lie to the check below
                deny("import: module names must be plain str")
            top = args[0].partition(".")[0]
            if top not in importable or top in denied_imports:
                # an ordinary ImportError (not a violation): the code may fall back to something else
                raise import_error(f"sandbox: module {args[0]!r} is not available")
        elif event.startswith(denied_events):
            deny(f"{event} is not allowed")
        elif event in write_events:
            if event == "os.chdir" and exact_type(args[0]) is not exact_str:
                deny("os.fchdir is not allowed")
            index = dir_fd_index.get(event)
            source = check_path(args[0], True, event,
                                args[index] if index is not None and length(args) > index else None, 0, event == "os.mkdir")
            if event == "os.rename":
                target = check_path(args[1], True, event, args[3] if length(args) > 3 else None, 0, True)
                if quota is not None and source in sizes:  # the bytes move with the name
                    total[0] -= sizes.pop(target, 0)
                    sizes[target] = sizes.pop(source)
                    if growing.pop(source, None):
                        growing[target] = True
        elif event in read_events:
            if args and args[0] is not None:
                check_path(args[0], False, event)
        elif event == "object.__getattr__" and exact_type(args[1]) is exact_str and args[1] in frame_attributes:
            deny(f"reading .{args[1]} is not allowed (tracebacks and generator frames are closed)")

    return hook


def _set_limits(settings: dict, base_vsz: int) -> None:
    import resource

    def limit(which: int, value: int) -> None:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):  # e.g. above a hard limit set by the environment: keep the stricter
            pass

    cpu_s = math.ceil(settings["timeout_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    limit(resource.RLIMIT_AS, base_vsz + settings["memory_mb"] * 2**20)
    limit(resource.RLIMIT_NPROC, 0)
    limit(resource.RLIMIT_FSIZE, settings["file_size_mb"] * 2**20)
    limit(resource.RLIMIT_NOFILE, 64)
    limit(resource.RLIMIT_CORE, 0)


def _no_bytecode(path, debug_override=None, *, optimization=None):
    raise NotImplementedError("the sandbox's children compile modules from source")


def _read_call(code_fd: int) -> bytearray | None:
    """The secret and the code, read in a frame of their own that ends before the code runs."""
    data = bytearray()
    while chunk := os.read(code_fd, 1 << 20):
        data += chunk
    os.close(code_fd)
    return data if len(data) >= TOKEN_BYTES else None


def _child(settings: dict, state: dict, tmp_dir: str, code_fd: int, out_fd: int, status_fd: int) -> None:
    """Runs in a forked child; never returns. Prepares itself (uid, limits; the kernel layers are the
    worker's, inherited), then waits for
    the secret and the code on ``code_fd`` (the zygote forks the next child while the host is still
    busy). The code's prints go to ``out_fd`` (fd 1), which the zygote reads and limits; the child's
    own records (the error, or the secret on success, written by the audit hook) go to ``status_fd``
    (fd 2), each after a NUL. The code can write to both descriptors; what it cannot do is write the
    secret, so it can print anything but cannot turn a failure, a denial or an early exit into a success
    (unless it corrupts memory: the hook is no boundary).
    """
    status = FAILED_EXIT
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(status_fd, 2)
        os.chdir(tmp_dir)
        if state["uid"] is not None:
            os.setgroups([])
            os.setgid(state["gid"])
            os.setuid(state["uid"])
        _set_limits(settings, state["base_vsz"])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # too large a file -> OSError, not a kill
        os.closerange(3, code_fd)
        os.closerange(code_fd + 1, 65536)
        enforce = settings["layers"] != "kernel-only"
        sys.modules.pop("_socket", None)  # (the worker's, for its socket pairs; it is not importable here)
        import _imp
        import _signal
        import io
        import posix

        if enforce:
            removals = [(module, name) for module in (posix, os) for name in UNAUDITED_OS_FUNCTIONS]
            removals += [(_signal, "pidfd_send_signal"), (signal, "pidfd_send_signal")]
            for name in ("pwd", "grp"):  # loaded by shutil; they read /etc/passwd and /etc/group in C
                module = sys.modules.get(name)
                removals += [(module, attr) for attr in dir(module) if attr.startswith(("getpw", "getgr"))]
            # without these, no fresh copy of a builtin or extension module (with the attributes above
            # restored) can be made; pure-Python imports still work
            removals += [(_imp, "create_builtin"), (_imp, "create_dynamic")]
            for module, name in removals:
                if hasattr(module, name):
                    delattr(module, name)
            # imports compile from source: reading a .pyc goes through marshal.loads, which is denied
            # (a crafted marshal stream is a memory write); NotImplementedError is importlib's "no cache"
            sys.modules["_frozen_importlib_external"].cache_from_source = _no_bytecode
        for name in ("random", "numpy.random"):  # the same RNG state in every call
            if name in sys.modules:
                sys.modules[name].seed(0)
        sys.stdin = io.StringIO("")
        out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16), encoding="utf-8",
                               errors="backslashreplace", newline="\n")
        call = _read_call(code_fd)
        if call is None:  # the zygote went away without a call for this child
            os._exit(0)
        quota = None
        if "private_tmpfs" not in state["layers"]:
            quota = (settings["temp_quota_mb"] * 2**20, TEMP_MAX_FILES)
        audit = sys.audit
        sys.stdout = sys.stderr = out
        sys.addaudithook(_make_audit_hook(tmp_dir, state["read_roots"], state["importable"], 2,
                                          settings["max_output_chars"], call, enforce, quota))
        program = compile(bytes(call[TOKEN_BYTES:]).decode("utf-8", "replace"), "<sandbox>", "exec")
        del call
        _run_code(program, audit, out)
        error = "RuntimeError: the code did not finish"  # not reached: the hook ends the process
    except BaseException as exc:  # noqa: BLE001 - every failure of the code becomes its observation
        try:
            error = python_error(exc)
        except BaseException:  # noqa: BLE001
            error = "RuntimeError: the error could not be formatted"
    try:
        if status != SETUP_EXIT:
            try:
                out.flush()  # the code's output first
            except BaseException:  # noqa: BLE001 - no output stream yet, or the code broke it
                pass
            record = b"\0" + _truncate(error, settings["max_output_chars"]).encode("utf-8", "backslashreplace")
            while record:
                record = record[os.write(2, record):]
    finally:
        os._exit(status)


def _signal_error(signum: int, settings: dict) -> str:
    if signum == signal.SIGXCPU:
        return f"TimeoutError: the code used more than {math.ceil(settings['timeout_s']) + 1} s of CPU time and was stopped"
    if signum == signal.SIGKILL:
        return "MemoryError: the process was killed (SIGKILL), most likely for using too much memory"
    if signum in (signal.SIGSEGV, signal.SIGBUS):
        return (f"RecursionError: the Python process crashed ({signal.Signals(signum).name}), most likely "
                "from recursion that is too deep or from running out of memory")
    if signum == signal.SIGSYS:
        return "PermissionError: sandbox: a system call the seccomp filter denies (socket, process, exec, IPC, ...)"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = str(signum)
    return f"RuntimeError: the process was killed by signal {name}"


def _verdict(status: int, sealed: bool, record: str | None, settings: dict) -> tuple[bool, str]:
    """(ok, error) of a child that exited with ``status``; ``sealed``: its status pipe ended with the
    call's secret; ``record``: the text after the last NUL on that pipe (the child's error).

    A success needs both FINISHED_EXIT and the secret, which only the audit hook holds and writes after
    exec() returned: an os._exit(0), a forged record or a caught denial cannot produce it. DENIED_EXIT
    fails the call whatever else was written.
    """
    if os.WIFSIGNALED(status):
        return False, _signal_error(os.WTERMSIG(status), settings)
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    if exit_code == FINISHED_EXIT and sealed:
        return True, ""
    if exit_code == DENIED_EXIT:
        if record is not None and record.startswith("PermissionError: sandbox:"):
            return False, record
        return False, "PermissionError: sandbox: a denied action stopped the code"
    if exit_code in (FAILED_EXIT, SETUP_EXIT) and record:
        return False, record
    return False, (f"SystemExit: the process exited with status {exit_code} before returning "
                   "a result (os._exit is not allowed)")


def _make_call_dir(base_dir: str, uid: int | None, gid: int | None) -> str:
    """The children's working folder (the same for every call: Landlock's write rule, set once per
    worker before its exec, names it). Made by whoever starts first: the set-up process or the worker."""
    path = os.path.join(base_dir, CALL_DIR)
    if not os.path.isdir(path):
        os.mkdir(path, 0o700)
        if uid is not None:
            os.chown(path, uid, gid)
    return path


def _empty_dir(path: str) -> None:
    """Remove everything inside ``path``, however deep the code nested it, with neither recursion nor long
    paths: a subfolder's entries are first renamed up into ``path`` under fresh short names, then the
    emptied subfolder is removed. At most two folder descriptors are open; each entry moves at most once.
    (Runs only when no process of the call is left, so nothing changes the tree meanwhile.) Folders the
    code made unreadable are opened up first."""
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    counter = 0
    try:
        while names := os.listdir(top):
            for name in names:
                if not stat.S_ISDIR(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=top)
                    continue
                os.chmod(name, 0o700, dir_fd=top)  # (a folder, checked above: no link is followed)
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                try:
                    for entry in os.listdir(sub):
                        while True:
                            counter += 1
                            fresh = f".{counter}"
                            try:
                                os.stat(fresh, dir_fd=top, follow_symlinks=False)
                            except FileNotFoundError:
                                break
                        os.rename(entry, fresh, src_dir_fd=sub, dst_dir_fd=top)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)


def remove_tree(path: str) -> None:
    """Remove ``path`` and everything in it like :func:`_empty_dir` (no recursion, no long paths); never
    raises (what cannot be removed stays)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            _empty_dir(path)
            os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)
    except (OSError, ValueError, RecursionError):
        pass


def _fork_spare(settings: dict, state: dict) -> dict:
    """Fork the child that will run the next call; it prepares itself and waits for the code."""
    tmp_dir = state["call_dir"]
    # socket pairs, not pipes: another call of this user cannot reopen them through /proc/<pid>/fd (see
    # _Worker.spawn); _child drops _socket from sys.modules, so the code cannot import it back
    code_r, code_w = _stream_pair()
    out_r, out_w = _stream_pair()
    status_r, status_w = _stream_pair()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            for fd in (code_w, out_r, status_r):
                os.close(fd)
            _child(settings, state, tmp_dir, code_r, out_w, status_w)
        finally:
            os._exit(70)
    try:
        os.setpgid(pid, pid)  # also here, so killpg works even before the child ran
    except OSError:
        pass
    for fd in (code_r, out_w, status_w):
        os.close(fd)
    try:  # a descriptor that becomes readable when the child exits (Linux >= 5.3)
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # older kernels: poll waitpid instead
        pidfd = None
    return {"pid": pid, "pidfd": pidfd, "code_w": code_w, "out_r": out_r, "status_r": status_r,
            "tmp_dir": tmp_dir}


def _stream_pair() -> tuple[int, int]:
    """(read end, write end) of a connected Unix stream socket pair, as plain descriptors."""
    import _socket

    ends = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    return ends[0].detach(), ends[1].detach()


def _kill_group(pid: int) -> None:
    if os.getpid() == 1:  # process 1 of the worker's pid namespace: everything else in it is the call's
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for kill in (os.killpg, os.kill):  # the whole group: nothing the child started survives
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class _Output:
    """What the zygote keeps of a child's stdout: the first ``keep`` characters and the total count."""

    def __init__(self, keep: int):
        import codecs

        self.keep, self.parts, self.kept, self.total = keep, [], 0, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, data: bytes, final: bool = False) -> None:
        text = self.decoder.decode(data, final)
        self.total += len(text)
        if self.kept < self.keep:
            piece = text[: self.keep - self.kept]
            self.parts.append(piece)
            self.kept += len(piece)

    def text(self) -> str:
        text = "".join(self.parts)
        if self.total > self.kept:
            text += f"\n... [output truncated: {self.total} characters in total]"
        return text


def _run_one(code: bytes, settings: dict, state: dict) -> tuple[dict, dict]:
    """Hand a fresh secret and ``code`` to the spare child; read its output and status pipes until it
    exits, the deadline passes or it prints too much.

    Returns the reply and the finished child, which :func:`_clean_up` reaps after the reply is sent.
    """
    child = state.pop("spare", None) or _fork_spare(settings, state)
    token = os.urandom(TOKEN_BYTES)
    start = time.monotonic()
    try:
        view = memoryview(token + code)
        while view:
            view = view[os.write(child["code_w"], view):]
    except ConnectionError:  # it died while preparing (EPIPE or ECONNRESET); its exit status explains why
        pass
    os.close(child["code_w"])
    out_fd, status_fd, pidfd = child["out_r"], child["status_r"], child["pidfd"]
    deadline = start + settings["timeout_s"]
    output, status_data = _Output(settings["max_output_chars"]), b""
    timed_out = flooded = exited = False
    status = None
    open_fds = [out_fd, status_fd]

    def read(fd: int) -> None:
        nonlocal status_data
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # (ECONNRESET: the child reset its end; as EOF)
            chunk = b""
        if not chunk:
            open_fds.remove(fd)
        elif fd == out_fd:
            output.add(chunk)
        else:
            status_data = (status_data + chunk)[-_STATUS_KEEP:]

    while not exited and not flooded:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        watch = open_fds + ([pidfd] if pidfd is not None else [])
        ready = select.select(watch, [], [], remaining if pidfd is not None else min(remaining, 0.005))[0]
        for fd in open_fds[:]:
            if fd in ready:
                read(fd)
        flooded = output.total > settings["max_printed_chars"]
        if pidfd is not None:
            exited = pidfd in ready
        else:
            reaped, status = os.waitpid(child["pid"], os.WNOHANG)
            exited = child["reaped"] = reaped != 0
    elapsed = time.monotonic() - start
    if not child.get("reaped"):  # (a reaped pid may already belong to someone else)
        _kill_group(child["pid"])  # it exited (or time is up, or it printed too much): nothing may survive
    if not timed_out:
        if not child.get("reaped"):
            _, status = os.waitpid(child["pid"], 0)
            child["reaped"] = True
        while open_fds and not flooded:  # drain what it wrote (the writer is dead: EOF comes)
            for fd in open_fds[:]:
                read(fd)
            flooded = output.total > settings["max_printed_chars"]
    output.add(b"", final=True)
    error = ""
    if timed_out:
        ok, error, text = False, f"TimeoutError: the code ran longer than {settings['timeout_s']:g} s and was stopped", ""
    elif flooded:
        ok, error, text = False, (f"OutputLimitError: the code printed more than {settings['max_printed_chars']} "
                                  "characters and was stopped"), output.text()
    else:
        sealed = status_data.endswith(b"\0" + token)
        record = status_data.rpartition(b"\0")[2].decode("utf-8", "replace") if b"\0" in status_data else None
        ok, error = _verdict(status, sealed, record, settings)
        text = output.text() if ok or os.WIFEXITED(status) else ""
        error = _truncate(error, settings["max_output_chars"])
    # object addresses differ between workers; mask them so equal code gives equal output
    text = _ADDRESS.sub(r"\1...", text)
    error = _ADDRESS.sub(r"\1...", error)
    return {"ok": ok, "output": text, "error": error, "elapsed_s": elapsed}, child


def _clean_up(child: dict, state: dict) -> None:
    """Reap a finished child, end whatever it left running, and empty the working folder for the next call."""
    if not child.get("reaped"):
        os.waitpid(child["pid"], 0)
    if child["pidfd"] is not None:
        os.close(child["pidfd"])
    os.close(child["out_r"])
    os.close(child["status_r"])
    if os.getpid() == 1:  # _kill_group ended every other process of the namespace
        while True:  # reap them (orphans of the call are reparented to process 1)
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    call_dir = state["call_dir"]
    info = os.lstat(call_dir)
    if not stat.S_ISDIR(info.st_mode):  # (the hook and the kernel layers keep it; if not, this worker ends)
        raise OSError(f"the working folder {call_dir} is no longer a folder")
    if info.st_mode & 0o7777 != 0o700:
        os.chmod(call_dir, 0o700)
    if os.listdir(call_dir):
        _empty_dir(call_dir)


# ---------------------------------------------------------------------------- the set-up process
def _library_paths() -> tuple[list[str], list[str]]:
    """(folders and files the worker's interpreter needs to read to start and to load extension
    modules: the shared libraries it maps and the system library folders; files it must execute:
    the interpreter binary and its ELF loader)."""
    mapped = set()
    with open("/proc/self/maps") as handle:
        for line in handle:
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) == 6 else ""
            # shared objects only (not "/dev/zero (deleted)", memfds or data files): their folders are granted
            if path.startswith("/") and (".so" in os.path.basename(path)) and os.path.isfile(path):
                mapped.add(path)
    executable = os.path.realpath(sys.executable)
    mapped.add(executable)  # (not a .so; its folder holds the interpreter's shared library on some builds)
    loaders = [path for path in mapped if os.path.basename(path).startswith(("ld-linux", "ld-musl", "ld64.so"))]
    interpreter = _elf_interpreter(executable)  # the path the kernel opens (maybe through symlinks)
    if interpreter and interpreter not in loaders:
        loaders.append(interpreter)
    folders = {os.path.dirname(path) for path in mapped} | {"/lib", "/lib64", "/usr/lib", "/usr/lib64",
                                                            "/usr/local/lib", "/etc/ld.so.cache"}
    broad = {"/", "/usr", "/etc", "/home", "/root", "/tmp", "/var", "/dev", "/dev/shm", "/proc", "/sys", "/run",
             "/opt", "/srv", "/mnt"}
    reads = sorted(path for path in folders if path not in broad and os.path.exists(path))
    return reads, [executable] + sorted(loaders)


def _elf_interpreter(path: str) -> str | None:
    """The PT_INTERP path of an ELF64 little-endian executable (None when it has none or is no such file)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:6] != b"\x7fELF\x02\x01":
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            for index in range(phnum):
                handle.seek(phoff + index * phentsize)
                kind, _flags, offset, _vaddr, _paddr, size = struct.unpack("<IIQQQQ", handle.read(40))
                if kind == 3:  # PT_INTERP
                    handle.seek(offset)
                    return handle.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _read_roots(settings: dict, parents: list | None = None) -> tuple[str, ...]:
    """Folders the children may read: the Python installation and the preloaded packages (found by their
    import specs: the set-up process does not import them). ``parents`` receives the folders that hold
    the preloaded packages (the worker lists them to import the packages)."""
    import importlib.util
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/usr/share/zoneinfo"}
    roots.update(p for key, p in sysconfig.get_paths().items() if key in ("stdlib", "platstdlib", "purelib", "platlib"))
    for name in {name.split(".")[0] for name in settings["preload"]}:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:  # packages from outside site-packages
            roots.update(spec.submodule_search_locations)
            if parents is not None:
                parents.extend(os.path.dirname(os.path.realpath(p)) for p in spec.submodule_search_locations)
    return tuple(sorted(os.path.realpath(r) for r in roots if r and r != "/"))


def _setup_main(settings: dict) -> None:
    """The set-up process (layers 'auto' / 'kernel-only'): it loads ctypes, enters the worker's
    namespaces, forks the worker, which sets no_new_privs, Landlock and seccomp on itself and execs a
    fresh interpreter (``sandbox.py serve``) that never loads ctypes; then it waits for the worker and
    exits with it. It runs no code of the model."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    iso = _load_isolation()
    without = set(settings.get("without", ()))
    active: dict[str, str] = {}
    if "namespaces" not in without:
        try:
            active.update(iso.enter_namespaces(settings["base_dir"], settings["temp_quota_mb"], TEMP_MAX_FILES))
        except OSError:
            pass
    abi = 0 if "landlock" in without else iso.landlock_abi()
    if abi:
        active["landlock"] = f"ABI {abi}"
    if "seccomp" not in without and iso.seccomp_supported():
        active["seccomp"] = "x86_64 filter"
    if iso.set_no_new_privs():  # this process too: it never needs more privileges
        active["no_new_privs"] = "set"
    if "no_new_privs" not in active:  # unprivileged Landlock and seccomp need it
        active.pop("landlock", None)
        active.pop("seccomp", None)
    drop = settings["drop_privileges"] and os.geteuid() == 0
    uid, gid = (SANDBOX_UID, SANDBOX_GID) if drop else (None, None)
    os.chmod(settings["base_dir"], 0o711)  # children (maybe 'nobody') must traverse into their folder
    call_dir = _make_call_dir(settings["base_dir"], uid, gid)
    parents: list[str] = []
    read_roots = _read_roots(settings, parents)
    libraries, executables = _library_paths()  # (reads /proc/self/maps: before the view replaces the root)
    # (this file too: the worker runs it; the rest of copes_lib stays unreadable)
    reads = read_roots + tuple(libraries) + (os.path.abspath(__file__),)
    # no Landlock: the mount namespace's read-only view confines the file system instead (built by the
    # worker: a fresh /proc can be mounted only by a process of the pid namespace, before the pivot)
    view = "landlock" not in active and "private_tmpfs" in active and "pid_namespace" in active
    served = {**settings, "active": active, "read_roots": read_roots, "call_dir": call_dir}
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = SETUP_EXIT
        try:
            os.close(release_w)
            os.read(release_r, 1)  # the set-up process has told the host this process's pid
            os.close(release_r)
            iso.die_with_parent()
            # the worker's own (same pid after exec); opened before the masked /proc hides process 1
            statm = os.open("/proc/self/statm", os.O_RDONLY)
            os.set_inheritable(statm, True)
            served["statm_fd"] = statm
            if view:
                try:
                    active[iso.READ_ONLY_VIEW] = iso.enter_read_only_view(
                        # (sys.executable unresolved too: the symlinks on its way, e.g. a linked venv, must exist)
                        os.path.join(settings["base_dir"], ".view"), reads + tuple(executables) + (sys.executable,),
                        call_dir)
                    active["pid_namespace"] = "the worker is process 1, a private /proc"
                except OSError as exc:  # the host then refuses to start without allow_unconfined_files
                    os.write(2, f"sandbox: the read-only view could not be built: {exc}\n".encode())
            if "pid_namespace" in active and "private_tmpfs" in active and iso.READ_ONLY_VIEW not in active:
                if iso.mount_private_proc():  # process 1 of the pid namespace, in a private mount namespace
                    active["pid_namespace"] = "the worker is process 1, a private /proc"
            # a root worker needs setuid() and cleanup rights; its children lose them at their setuid()
            if os.geteuid() == 0:
                # exec'd with its effective gid not its real one, the worker is made non-dumpable by the
                # kernel (and stays so when it takes its gid back): a call's process of the same uid
                # without capabilities (root without the uid drop) can then neither open its /proc
                # files nor ptrace it. (A non-root host's user namespace maps one gid: there, the
                # sockets, the masked /proc/1, Landlock and seccomp's ban on ptrace keep the worker apart.)
                os.setresgid(os.getgid(), SANDBOX_GID, SANDBOX_GID)
            iso.harden(keep_capabilities=drop)
            if "landlock" in active:
                fds = lambda paths: [fd for _, fd in iso.open_rule_paths(paths)]  # noqa: E731
                iso.landlock_restrict(abi, fds(reads), fds([call_dir]),
                                      fds(("/dev/urandom", "/dev/random", "/dev/zero")), fds(("/dev/null",)),
                                      fds(executables), fds(sorted(set(parents) - {"/"})))
            if "seccomp" in active:
                iso.install_seccomp()
            os.execv(sys.executable, [sys.executable, "-s", "-B", os.path.abspath(__file__), "serve",
                                      json.dumps(served)])
        except BaseException as exc:  # noqa: BLE001 - reported on stderr; the host sees the worker fail
            os.write(2, f"sandbox: the worker's kernel layers could not be set up: {exc}\n".encode())
        finally:
            os._exit(status)
    os.close(release_r)
    _write_message(1, {"server_pid": pid})
    os.write(release_w, b"x")
    os.close(release_w)
    devnull = os.open(os.devnull, os.O_RDWR)  # the channel to the host is the worker's alone
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_EXIT)


# ---------------------------------------------------------------------------- the worker (zygote)
def _zygote_state(settings: dict) -> dict:
    """Import the preloaded modules and compute what every child needs (paths, uid, memory base)."""
    import importlib

    failed, native = {}, []
    # ctypes should never be loaded here: its classes would stay reachable through __subclasses__ (see
    # isolation.py). Preloads are imported with it blocked (numpy runs without it); one that cannot
    # (sympy imports it unconditionally) is imported with it, and the host warns naming it.
    blocked = [name for name in ("ctypes", "_ctypes") if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None
    try:
        for name in settings["preload"]:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                if "halted; None in sys.modules" not in str(exc) or not blocked:
                    failed[name] = python_error(exc)
                    continue
                for blocker in blocked:
                    if sys.modules.get(blocker, 0) is None:
                        del sys.modules[blocker]
                blocked = []
                native.append(name)
                try:
                    importlib.import_module(name)
                except Exception as exc:  # noqa: BLE001
                    failed[name] = python_error(exc)
            except Exception as exc:  # noqa: BLE001 - reported to the host, which raises ConfigError
                failed[name] = python_error(exc)
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    import _signal  # noqa: F401 - loaded now: a child running as 'nobody' may not be able to read them
    import posix  # noqa: F401
    import resource  # noqa: F401

    uid = gid = None
    if settings["drop_privileges"] and os.geteuid() == 0:
        uid, gid = SANDBOX_UID, SANDBOX_GID
    layers = settings.get("active", {})  # set by the set-up process
    read_roots = tuple(settings["read_roots"]) if "read_roots" in settings else _read_roots(settings)
    call_dir = settings.get("call_dir")
    if call_dir is None:  # layers='hook-only': no set-up process
        os.chmod(settings["base_dir"], 0o711)
        call_dir = _make_call_dir(settings["base_dir"], uid, gid)
    importable = frozenset(sys.stdlib_module_names) | {n.split(".")[0] for n in settings["preload"]}
    statm = settings.get("statm_fd")
    with (os.fdopen(statm) if statm is not None else open("/proc/self/statm")) as handle:
        base_vsz = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    return {"uid": uid, "gid": gid, "base_dir": settings["base_dir"], "call_dir": call_dir,
            "read_roots": read_roots, "failed": failed, "importable": importable - DENIED_IMPORTS, "base_vsz": base_vsz, "layers": layers,
            # numpy needs no ctypes but is a memory write of its own (as_strided with any stride)
            "native_access": sorted(set(native if "_ctypes" in sys.modules else [])
                                    | {n for n in settings["preload"] if n.split(".")[0] in NATIVE_MEMORY_PACKAGES})}


def _zygote_main(settings: dict) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getegid() != os.getgid():  # (the set-up process's exec as root: see _setup_main)
        os.setresgid(os.getgid(), os.getgid(), os.getgid())
    sys.dont_write_bytecode = True
    # private copies of the protocol socket; fd 0/1 point elsewhere, so a stray print cannot corrupt them
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    state = _zygote_state(settings)
    import gc

    gc.freeze()  # the children's collections then leave the zygote's pages shared (fewer copies)
    try:
        state["spare"] = _fork_spare(settings, state)
        _write_message(proto_out, {"ready": True, "failed": state["failed"], "layers": state["layers"],
                                   "native_access": state["native_access"]})
        while True:
            header = _read_exact(proto_in, _HEADER.size)
            if header is None:  # the host closed the channel (close() or the host died)
                break
            message = _read_exact(proto_in, _HEADER.unpack(header)[0])
            if message is None or len(message) < NONCE_BYTES:
                break
            nonce, code = message[:NONCE_BYTES].hex(), message[NONCE_BYTES:]
            reply, child = _run_one(code, settings, state)
            reply["call"] = nonce
            _write_message(proto_out, reply)
            # after the reply, while the host works: reap this child, empty the folder, fork the next
            # child, then say so before reading the next call (the host reads this "ready" before the
            # next reply: a worker that dies in between never read that call, which goes to a replacement)
            _clean_up(child, state)
            state["spare"] = _fork_spare(settings, state)
            _write_message(proto_out, {"ready": True, "call": nonce})
    except ConnectionError:  # the host went away (EPIPE, or ECONNRESET on its socket)
        pass
    finally:
        spare = state.get("spare")
        if spare is not None:  # EOF on its code pipe makes it exit; the kill makes sure
            os.close(spare["code_w"])
            _kill_group(spare["pid"])
            os.waitpid(spare["pid"], 0)
        if not state["layers"]:  # (under Landlock the worker cannot; the host removes the folder)
            remove_tree(state["base_dir"])


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: the sandboxed code must not import siblings as top-level modules
    if sys.argv[1] == "setup":
        _setup_main(json.loads(sys.argv[2]))
    else:
        _zygote_main(json.loads(sys.argv[2]))
