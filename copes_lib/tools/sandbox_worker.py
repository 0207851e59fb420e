"""The worker side of :mod:`copes_lib.tools.sandbox`: the set-up process, the zygote and its children.

This file runs as a script (``python sandbox_worker.py setup|serve SETTINGS``), never imported by the code it
runs: under Landlock it is the one file of copes_lib the worker may read, so it imports nothing from copes_lib
(isolation.py, the kernel layers, is loaded by path in the set-up process only, before the layers apply) and
only the standard library the zygote keeps loaded. The host (:mod:`copes_lib.tools.sandbox`) imports its
constants, the error formatting and the protocol's framing from here. How a call runs, which layer stops
what, and what the layers do not stop: the host module's docstring and docs/sandbox.md.
"""

from __future__ import annotations

import dataclasses  # noqa: F401 - (this and the other unused imports: see below)
import json
import math
import os
import queue  # noqa: F401
import re
import select
import signal
import stat
import struct
import sys
import tempfile  # noqa: F401
import threading  # noqa: F401
import time
import weakref  # noqa: F401
from collections import OrderedDict  # noqa: F401
from concurrent.futures import ThreadPoolExecutor  # noqa: F401

# The unused imports above are what the worker had loaded when it was one file with the host: a call can import
# only what the worker has loaded (``logging``, for one, comes with concurrent.futures), and what a call can import
# decides what model-generated code does, so the split keeps the worker's modules as they were (a test compares).

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
NONCE_BYTES = 16  # names each call in the worker's reply (see _Worker.call)


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


# ============================================================================ zygote side
# Everything below runs in the zygote (started as ``python sandbox_worker.py SETTINGS``) or in its children.
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
            # kill again before each wait: a fork bomb's process can have been forking during the last kill, and
            # the child it made then keeps forking (root is not bound by RLIMIT_NPROC) while this loop waits.
            # Between two kills, every child that has ended is reaped: one kill(-1), which walks every process,
            # per reaped child made the clean-up after a fork bomb quadratic in its processes (seconds)
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(-1, 0)
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
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
    if sys.argv[1] != "serve":
        sys.exit(f"usage: {sys.argv[0]} serve SETTINGS (the set-up process is sandbox_setup.py)")
    _zygote_main(json.loads(sys.argv[2]))
