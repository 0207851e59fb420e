"""Kernel-enforced isolation for the Python sandbox: the boundary, under the audit hook.

The audit hook of :mod:`copes_lib.tools.sandbox` runs inside the interpreter it guards. It is a
convenience layer, not a boundary: it turns most forbidden actions into Python errors a model can
learn from, but code that corrupts the interpreter's memory switches it off without any audit event.
Pure Python is enough for that on CPython 3.11 (a use-after-free such as an ``io.RawIOBase.readinto``
that keeps the memoryview ``io.BufferedReader`` lends it gives an arbitrary read/write; the attack
catalogue, tests/sandbox_attacks.py, does it), and so is a preloaded package with native memory access.
What confines the code is this module: the kernel, asked through system calls made with ctypes
(Python 3.11 has no wrappers for them), unprivileged as well as root.

ctypes is loaded only in a worker's set-up process, never in the interpreter that runs the model's
code (its classes would stay reachable through ``object.__subclasses__()``, an even easier memory
write). The set-up process applies every layer once per worker and then ``execve``s a fresh
interpreter, the worker that forks the calls' children (see :mod:`copes_lib.tools.sandbox`). The layers
are per worker, inherited by every child:

- **Landlock** (Linux >= 5.13; the ABI version decides what it covers): the child may read only the
  Python installation, the preloaded packages and a few devices, and write only in its call's folder,
  whatever path, ``dir_fd`` or file descriptor trick the code uses. ABI >= 4 also denies TCP bind and
  connect; ABI >= 6 denies signals to processes outside the sandbox and abstract unix sockets.
  Executing files is allowed only for the Python binary and its ELF interpreter (the one ``execve``
  of the set-up process); the shared-library folders become readable for the same reason.
- **read-only view** (:func:`enter_read_only_view`), where Landlock is missing but mount namespaces
  exist: the worker's root becomes a fresh tmpfs holding read-only bind mounts of exactly what
  Landlock would let it read, the four devices, the call's folder (read-write) and a fresh procfs,
  the way bubblewrap builds a sandbox; the host's root is unmounted from the namespace. Nothing else of
  the host's file system exists for the code. (Unlike Landlock it lets the code execute any file it can
  read, e.g. another program in the interpreter's folder; that program runs under the same layers.)
- **seccomp** (x86_64 only: the filter names system calls by number): kills the process on socket(),
  fork/vfork/clone3, execveat, ptrace, memfd_create, io_uring, namespaces, mounts, keyrings, bpf and
  perf events. ``clone`` (the worker forks its children), ``execve`` (the set-up process's one exec;
  Landlock then decides what may run) and signals (confined by the pid namespace) stay open.
- **no_new_privs**, and no capabilities (root workers that drop their children to 'nobody' keep theirs
  until the children's ``setuid``, which clears them).
- **namespaces**, once per worker: a network namespace without interfaces, with its own host name (UTS)
  and System V IPC (with a user namespace when the host is not root), a mount namespace in which the worker's temp folder is a private tmpfs of
  ``temp_quota_mb`` (the total quota of a call's files, which vanish with the worker), and a pid
  namespace in which the worker is process 1 and ``/proc`` is a fresh, read-only procfs of that
  namespace with process 1 and the kernel's files masked (:func:`_mask_proc`): its children cannot name,
  let alone signal, a process of the host, cannot reach the worker through ``/proc/1``, cannot write a
  host setting, and nothing they start outlives the worker.

:func:`probe` says which of these the running kernel offers; the sandbox records the active ones,
refuses to start where neither Landlock nor the read-only view confines the file system (unless the
caller opts in with ``CodeSandboxConfig.allow_unconfined_files``), and warns
(:class:`IsolationWarning`) naming any other missing layer and what the remaining layers still stop.
"""

from __future__ import annotations

import json
import os
import platform
import stat
import struct
import sys
import tempfile
import warnings

KERNEL_LAYERS = ("landlock", "seccomp", "no_new_privs", "network_namespace", "private_tmpfs", "pid_namespace")
# Where Landlock is missing, the mount namespace's read-only view confines the file system instead.
READ_ONLY_VIEW = "read_only_view"
FILE_CONFINEMENT = ("landlock", READ_ONLY_VIEW)  # a sandbox refuses to start without one of these
# CodeSandboxConfig.without: layer groups a test may switch off to simulate a host that lacks them
SIMULATED_MISSING = {"landlock": ("landlock",), "seccomp": ("seccomp",),
                     "namespaces": ("network_namespace", "private_tmpfs", "pid_namespace")}
# What a missing layer leaves to the layers above it (quoted in the warning).
MISSING_MEANS = {
    "landlock": "nothing in the kernel confines file reads and writes (including through dir_fd and "
                "descriptors) unless the read-only mount-namespace view replaces it; the audit hook alone "
                "is no boundary (memory corruption from pure Python switches it off)",
    "seccomp": "sockets, ptrace, memfd, io_uring, fork and new namespaces are stopped only by the audit hook "
               "and, where present, Landlock, the namespaces and RLIMIT_NPROC",
    "no_new_privs": "seccomp and unprivileged Landlock cannot be used",
    "network_namespace": "the network is closed by seccomp where present (and by the audit hook, which is "
                         "no boundary)",
    "private_tmpfs": "a call's storage is bounded by the audit hook's count of the bytes and entries it "
                     "creates (and RLIMIT_FSIZE per file), in the shared temp folder",
    "pid_namespace": "signals to the host's processes are stopped only by Landlock (ABI >= 6) (and the audit "
                     "hook, which is no boundary), /proc is the host's, and a process a call starts could "
                     "outlive it where RLIMIT_NPROC does not bind (root without the uid drop)",
}

# ---------------------------------------------------------------------------- kernel constants
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS = {  # access right -> (bit, first ABI that has it)
    "execute": (1 << 0, 1), "write_file": (1 << 1, 1), "read_file": (1 << 2, 1), "read_dir": (1 << 3, 1),
    "remove_dir": (1 << 4, 1), "remove_file": (1 << 5, 1), "make_char": (1 << 6, 1),
    "make_dir": (1 << 7, 1), "make_reg": (1 << 8, 1), "make_sock": (1 << 9, 1), "make_fifo": (1 << 10, 1),
    "make_block": (1 << 11, 1), "make_sym": (1 << 12, 1), "refer": (1 << 13, 2), "truncate": (1 << 14, 3),
    "ioctl_dev": (1 << 15, 5),
}
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2  # ABI >= 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2  # ABI >= 6
_PR_SET_NO_NEW_PRIVS, _PR_GET_SECCOMP, _PR_SET_SECCOMP, _PR_CAP_AMBIENT = 38, 21, 22, 47
_SECCOMP_MODE_FILTER = 2
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x40000000, 0x20000000
_CLONE_NEWUTS, _CLONE_NEWIPC = 0x04000000, 0x08000000
_PR_SET_PDEATHSIG = 1
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 0x4000, 1 << 18
_MS_REMOUNT, _MS_BIND, _MNT_DETACH = 32, 4096, 2
# statvfs f_flag bits -> the mount flags a read-only remount must keep (a user namespace may not clear them)
_KEEP_FLAGS = ((os.ST_NOEXEC, _MS_NOEXEC), (os.ST_NODEV, _MS_NODEV), (os.ST_NOATIME, 1024), (os.ST_NODIRATIME, 2048),
               (os.ST_RELATIME, 1 << 21))
_SYS_PIVOT_ROOT = 155
_SYS_CAPSET, _CAPABILITY_VERSION_3 = 126, 0x20080522
_AUDIT_ARCH_X86_64, _X32_BIT = 0xC000003E, 0x40000000
_RET_KILL_PROCESS, _RET_ALLOW = 0x80000000, 0x7FFF0000
# x86_64 system calls neither the worker nor its children need. (clone: the worker forks with it;
# execve: the set-up process's exec into the worker, Landlock decides what may be executed; pidfd_open:
# the worker waits on its children with it; the kill family: confined by the pid namespace; socketpair:
# the worker's channels to each call's child, which an unnamed pair of Unix sockets cannot leave.)
_DENIED_SYSCALLS_X86_64 = {
    "socket": 41, "fork": 57, "vfork": 58, "ptrace": 101,
    "chroot": 161, "pivot_root": 155, "mount": 165, "umount2": 166, "add_key": 248, "request_key": 249,
    "keyctl": 250, "unshare": 272, "perf_event_open": 298, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "memfd_create": 319, "bpf": 321, "execveat": 322, "userfaultfd": 323,
    "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "memfd_secret": 447,
    # System V IPC and POSIX message queues: their objects live in the IPC namespace, not in the call's folder,
    # so they would outlive the call that made them and reach every later call of its worker (or, without
    # namespaces, the host's); no preloaded module needs them (POSIX shared memory is a file in /dev/shm)
    "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66, "shmdt": 67, "msgget": 68,
    "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220, "mq_open": 240, "mq_unlink": 241,
    "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
}


class IsolationWarning(UserWarning):
    """A kernel isolation layer is unavailable: the sandbox runs with fewer layers (it says which)."""


class ConfinementError(RuntimeError):
    """The kernel cannot confine the sandboxed code's file access here, and the caller did not opt in."""


_LIBC: tuple | None = None  # (ctypes, libc), made once per process (a worker's children inherit it)


def _libc():
    global _LIBC
    if _LIBC is None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _LIBC = ctypes, libc
    return _LIBC


def _fail(ctypes, what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{what}: {os.strerror(errno)}")


# ---------------------------------------------------------------------------- probing
def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    try:
        ctypes, libc = _libc()
    except OSError:
        return 0
    version = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(version))


def seccomp_supported() -> bool:
    """seccomp filters need a kernel with them and a system-call table built in here (x86_64)."""
    if platform.machine() != "x86_64":
        return False
    try:
        _ctypes, libc = _libc()
    except OSError:
        return False
    return libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) >= 0


def set_no_new_privs() -> bool:
    """prctl(PR_SET_NO_NEW_PRIVS) on this process (inherited by its children); False where unsupported."""
    try:
        _ctypes, libc = _libc()
    except OSError:
        return False
    return libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0


def enter_namespaces(temp_dir: str, quota_mb: int, max_files: int) -> dict[str, str]:
    """Move this process into a new network namespace and a mount namespace in which ``temp_dir`` is a
    private tmpfs of ``quota_mb`` MiB and ``max_files`` inodes, and make its next child process 1 of a
    new pid namespace. Unprivileged hosts get a user namespace that maps only their own uid and gid.
    Returns {layer: detail} of what succeeded (maybe nothing).

    Called once per worker, before its children are forked; never in the host process."""
    ctypes, libc = _libc()
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    active: dict[str, str] = {}
    # UTS and IPC with the network: the host's hostname and domain name, and its System V IPC objects,
    # are then out of reach (a write changes only the worker's copy)
    user = 0 if root else _CLONE_NEWUSER
    base = user | _CLONE_NEWUTS | _CLONE_NEWIPC
    for flags in (base | _CLONE_NEWNET | _CLONE_NEWNS | _CLONE_NEWPID, base | _CLONE_NEWNET | _CLONE_NEWNS,
                  base | _CLONE_NEWNET):
        if libc.unshare(flags) == 0:
            break
    else:
        return active
    if flags & _CLONE_NEWPID:  # the caller stays outside; its next child is process 1 of the namespace
        active["pid_namespace"] = "the worker is process 1"
    if user:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
    active["network_namespace"] = ("no interfaces, own hostname and IPC" + ("" if root else ", in a user namespace"))
    if not flags & _CLONE_NEWNS:
        return active
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    # private first: a mount made below must not propagate back to the host's namespace
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return active
    options = f"size={quota_mb * 1024}k,nr_inodes={max_files},mode=0711".encode()
    if libc.mount(b"copes-sandbox", os.fsencode(temp_dir), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                  options) == 0:
        active["private_tmpfs"] = f"{quota_mb} MiB, {max_files} files"
    return active


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    ctypes, libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    encode = lambda value: None if value is None else os.fsencode(value)  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        raise _fail(ctypes, f"mount {target}")


def _mirror(root: str, path: str, depth: int = 0) -> str:
    """Make ``path`` resolve inside ``root`` as it does on the host: every symlink on the way is
    recreated there (so /lib64/ld-linux-x86-64.so.2 finds the loader on a merged-/usr system).
    Returns the host's resolved path, which the caller binds at ``root`` + that path."""
    if depth > 40:
        raise OSError(f"too many symlinks under {path}")
    done = "/"
    parts = [part for part in path.split("/") if part not in ("", ".")]
    for index, part in enumerate(parts):
        here = os.path.join(done, part)
        if os.path.islink(here):
            target = os.readlink(here)
            inside = root + here
            if not os.path.lexists(inside):
                os.makedirs(os.path.dirname(inside), exist_ok=True)
                os.symlink(target, inside)
            rest = "/".join(parts[index + 1:])
            resolved = os.path.normpath(os.path.join(done, target))
            return _mirror(root, os.path.join(resolved, rest) if rest else resolved, depth + 1)
        done = here
    return done


def _bind(root: str, path: str, writable: bool = False, device: bool = False) -> None:
    """Bind the host's ``path`` (a folder or file) at the same path inside ``root``: read-only,
    nosuid, nodev (except for ``device``), noexec where ``writable``."""
    real = _mirror(root, path)
    target = root + real
    if os.path.isdir(real):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(real, target, None, _MS_BIND | _MS_REC)
    kept = os.statvfs(real).f_flag
    flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID | sum(bit for st, bit in _KEEP_FLAGS if kept & st)
    flags |= 0 if device else _MS_NODEV
    flags |= _MS_NOEXEC if writable else 0
    flags |= 0 if writable else _MS_RDONLY
    _mount(None, target, None, flags)
    if not writable and not device:  # mounts below the bound folder stay writable unless remounted too
        for below in _mounts_below(target):
            below_flags = os.statvfs(below).f_flag
            _mount(None, below, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
                   | sum(bit for st, bit in _KEEP_FLAGS if below_flags & st))


def _mounts_below(folder: str) -> list[str]:
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(folder + "/"):
                found.append(point)
    return found


def enter_read_only_view(view: str, reads, writable: str, devices=("/dev/urandom", "/dev/random", "/dev/zero"),
                         writable_devices=("/dev/null",)) -> str:
    """Make this process's root (in its own, private mount namespace) a fresh tmpfs at ``view`` that holds
    read-only binds of ``reads`` (folders or files), the ``devices``, the folder ``writable``
    (read-write, noexec) and a fresh procfs (this process must be process 1 of its pid namespace); then
    pivot into it and unmount the host's root. Every path keeps its host name. The stand-in for Landlock
    where it is missing (bubblewrap's approach). Returns the detail recorded for the layer."""
    ctypes, libc = _libc()
    os.makedirs(view, exist_ok=True)
    _mount("copes-view", view, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=16384,mode=0755")
    bound: list[str] = []  # a path beneath one already bound is in the view already
    for path in sorted(reads, key=lambda p: len(os.path.realpath(p))):
        real = os.path.realpath(path)
        if os.path.exists(path) and not any(real == b or real.startswith(b.rstrip("/") + "/") for b in bound):
            _bind(view, path)
            bound.append(real)
        elif os.path.exists(path):
            _mirror(view, path)  # (its symlinks, e.g. /lib64 -> usr/lib64, still have to exist)
    for path in devices:
        _bind(view, path, device=True)
    for path in writable_devices:
        _bind(view, path, writable=True, device=True)
    _bind(view, writable, writable=True)
    for folder in ("proc", ".old"):
        os.makedirs(os.path.join(view, folder), exist_ok=True)
    # the fresh procfs, before the host's root (and its /proc) leaves the namespace: a user namespace may
    # mount procfs only while an instance of it is fully visible there (the kernel's mnt_already_visible)
    _mount("proc", view + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)
    _mask_proc(view + "/proc")
    if libc.syscall(_SYS_PIVOT_ROOT, os.fsencode(view), os.fsencode(view + "/.old")) != 0:
        raise _fail(ctypes, "pivot_root")
    os.chdir("/")
    if libc.umount2(b"/.old", _MNT_DETACH) != 0:
        raise _fail(ctypes, "umount2 /.old")
    os.rmdir("/.old")
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    return "read-only binds of the interpreter's files, a fresh root"


# What a fresh /proc hides, as container runtimes do: the kernel's memory and timers (files), the
# hardware's folders. (/proc/sys, sysrq-trigger, irq and bus are read-only with the whole mount.)
PROC_MASKED_FILES = ("kcore", "keys", "timer_list", "sched_debug", "kallsyms", "kmsg", "sysrq-trigger")
PROC_MASKED_FOLDERS = ("acpi", "scsi", "irq", "bus", "driver", "fs", "sys")


def _mask_proc(proc: str) -> None:
    """Hide process 1 (the worker: no call may read its memory or reopen its descriptors) and the host's
    kernel files under a read-only procfs at ``proc``: an empty read-only tmpfs over each folder, the
    read-only /dev/null over each file. /proc/sys then reads as empty: its writable settings exist only
    as unreachable files. Raises OSError when a mask cannot be mounted (the view is then refused)."""
    def empty(target: str) -> None:
        _mount("copes-mask", target, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY,
               "size=4k,nr_inodes=1,mode=0555")

    empty(proc + "/1")
    for name in PROC_MASKED_FOLDERS:
        if os.path.isdir(f"{proc}/{name}"):
            empty(f"{proc}/{name}")
    for name in PROC_MASKED_FILES:
        if os.path.lexists(f"{proc}/{name}"):
            _mount("/dev/null", f"{proc}/{name}", None, _MS_BIND)
            _mount(None, f"{proc}/{name}", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC)


def mount_private_proc() -> bool:
    """Mount a fresh, read-only procfs on /proc with process 1 and the kernel's files masked
    (:func:`_mask_proc`; this process must be process 1 of its pid namespace, in a private mount
    namespace): the code sees only its own processes. False where the kernel refuses (an unprivileged
    user namespace on a host whose /proc has parts hidden by other mounts); /proc is then unmounted
    again if the masks failed, so the host's stays (which Landlock keeps out of reach)."""
    try:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)
    except OSError:
        return False
    try:
        _mask_proc("/proc")
    except OSError:
        _ctypes, libc = _libc()
        libc.umount2(b"/proc", _MNT_DETACH)
        return False
    return True


def _probe_here() -> dict[str, str]:
    """{layer: detail} of the kernel layers, tried in THIS process (it changes its namespaces: run it
    only in a throwaway process, as :func:`probe` does). A process with threads (numpy's) cannot
    unshare a user namespace, so it would under-report."""
    found: dict[str, str] = {}
    abi = landlock_abi()
    if abi:
        found["landlock"] = f"ABI {abi}"
    if seccomp_supported():
        found["seccomp"] = "x86_64 filter"
    if set_no_new_privs():
        found["no_new_privs"] = "set"
    folder = tempfile.mkdtemp(prefix="copes-probe-")
    try:
        found.update(enter_namespaces(folder, 1, 16))
        if "private_tmpfs" in found:
            found["private_tmpfs"] = "temp_quota_mb per worker"
    except OSError:
        pass
    finally:
        if "private_tmpfs" in found:  # mounted in this process's namespace only
            _ctypes, libc = _libc()
            libc.umount2(os.fsencode(folder), 2)  # MNT_DETACH
        os.rmdir(folder)
    return found


def probe() -> dict[str, str]:
    """{layer: detail} of the kernel layers this host offers, measured in a fresh child interpreter
    (single-threaded, so its user namespace is not refused; the probe changes the child's namespaces,
    never this process's). {} when the child cannot run."""
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-s", os.path.abspath(__file__)], capture_output=True,
                              text=True, timeout=30, env={"PATH": os.defpath})
        return json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}


_HOST_LAYERS: dict[str, str] | None = None


def host_layers() -> dict[str, str]:
    """:func:`probe`, run once per host process."""
    global _HOST_LAYERS
    if _HOST_LAYERS is None:
        _HOST_LAYERS = probe()
    return dict(_HOST_LAYERS)


# What the warnings say of the hook (tests/test_sandbox.py checks every warning carries it).
HOOK_STILL = ("The audit hook is a convenience layer, not a boundary: it turns most forbidden actions into "
              "Python errors, but code that corrupts the interpreter's memory (a CPython use-after-free "
              "reachable from pure Python, or a preloaded package with native memory access) switches it off "
              "without an audit event, and then only the kernel layers confine it. rlimits still bound CPU, "
              "memory, file size and descriptors.")

# Why the sandbox refuses to start without file confinement (quoted in ConfinementError).
UNCONFINED = ("Without it, nothing in the kernel keeps the sandboxed code off the host's files: pure Python "
              "can switch the audit hook off (a CPython 3.11 use-after-free gives it a memory read/write) and "
              "then read the user's files and the checkout, and write a .pth into a site-packages folder "
              "(code that runs in every later Python of this user). Opt in with "
              "CodeSandboxConfig(allow_unconfined_files=True) only where the code is trusted, or run the "
              "workers in a container or under bubblewrap, nsjail or gVisor (docs/sandbox.md).")


def file_confinement(active: dict[str, str]) -> str | None:
    """The layer that confines the file system here ('landlock' or the read-only view), or None."""
    return next((name for name in FILE_CONFINEMENT if name in active), None)


def refusal(active: dict[str, str], why: str) -> ConfinementError:
    """The error of a sandbox that will not start: ``why`` names what is missing and where."""
    present = ", ".join(name for name in (*KERNEL_LAYERS, READ_ONLY_VIEW) if name in active) or "none"
    return ConfinementError(f"the Python sandbox refuses to start: {why} (kernel layers present: {present}). "
                            + UNCONFINED)


def warn_native_access(packages: list[str], active: dict[str, str]) -> str:
    """Warn that the preloaded ``packages`` loaded ctypes into the worker: what the code can do then."""
    kernel = [name for name in KERNEL_LAYERS if name in active]
    message = (f"the preloaded package(s) {', '.join(packages)} give the sandboxed code native memory access "
               "(ctypes' classes through object.__subclasses__, numpy's as_strided with any stride): it can "
               "switch the audit hook off and forge a successful result. Only the kernel layers bind then: "
               + (", ".join(kernel) if kernel else "none on this host, so the code is not confined at all")
               + ". Preload only the standard library, or run the workers in a container.")
    warnings.warn(message, IsolationWarning, stacklevel=3)
    return message


def describe(active: dict[str, str]) -> str:
    """One line for reports: the active layers, then the missing ones."""
    layers = [f"{name} ({active[name]})" for name in (*KERNEL_LAYERS, READ_ONLY_VIEW) if name in active]
    missing = [name + (" (replaced by read_only_view)" if name == "landlock" and READ_ONLY_VIEW in active else "")
               for name in KERNEL_LAYERS if name not in active]
    text = " + ".join(layers + ["rlimits", "audit hook"])
    return text + (f"; missing: {', '.join(missing)}" if missing else "")


def warn_missing(active: dict[str, str], wanted: tuple[str, ...] = KERNEL_LAYERS) -> str | None:
    """Warn (once per distinct message) naming each missing layer and what the others still stop."""
    missing = [name for name in wanted if name not in active]
    if not missing:
        return None
    if not any(name in active for name in KERNEL_LAYERS):
        head = "the Python sandbox runs with its audit hook and rlimits only: no kernel isolation is available"
    else:
        head = f"the Python sandbox runs without {', '.join(missing)}"
    means = {**MISSING_MEANS}
    if READ_ONLY_VIEW in active:
        means["landlock"] = ("the file system is confined by the read-only mount-namespace view instead (the "
                             "code can also execute the programs it can read, under the same layers)")
    message = (head + ". " + "; ".join(f"without {name}, {means[name]}" for name in missing)
               + ". " + HOOK_STILL)
    warnings.warn(message, IsolationWarning, stacklevel=3)
    return message


# ---------------------------------------------------------------------------- in the child
def open_rule_paths(paths) -> list[tuple[str, int]]:
    """O_PATH descriptors of existing ``paths`` (opened once in the worker; the children inherit them)."""
    opened = []
    for path in paths:
        try:
            opened.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
        except OSError:
            continue
    return opened


def landlock_restrict(abi: int, read_fds: list[int], read_write_fds: list[int], device_fds: list[int],
                      writable_device_fds: list[int], exec_fds: list[int] = (), list_fds: list[int] = ()) -> None:
    """Restrict this process (irreversibly) to reading beneath ``read_fds``, reading and writing beneath
    ``read_write_fds``, the device files given, executing the files ``exec_fds`` and listing (not
    reading) the folders ``list_fds``. Needs no_new_privs (or root)."""
    ctypes, libc = _libc()
    rights = {name: bit for name, (bit, since) in _FS.items() if since <= abi}
    handled_fs = sum(rights.values())
    if abi >= 6:
        attr, size = struct.pack("<QQQ", handled_fs, _NET_BIND_TCP | _NET_CONNECT_TCP,
                                 _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL), 24
    elif abi >= 4:
        attr, size = struct.pack("<QQ", handled_fs, _NET_BIND_TCP | _NET_CONNECT_TCP), 16
    else:
        attr, size = struct.pack("<Q", handled_fs), 8
    buffer = ctypes.create_string_buffer(attr, size)
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, buffer, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail(ctypes, "landlock_create_ruleset")
    read = rights["read_file"] | rights["read_dir"]
    write = sum(rights.get(n, 0) for n in ("write_file", "remove_dir", "remove_file", "make_dir", "make_reg",
                                            "refer", "truncate"))
    file_write = rights["write_file"] | rights.get("truncate", 0)
    rules = ([(fd, read) for fd in read_fds] + [(fd, read | write) for fd in read_write_fds]
             + [(fd, rights["read_file"]) for fd in device_fds]
             + [(fd, rights["read_file"] | file_write) for fd in writable_device_fds]
             + [(fd, rights["read_file"] | rights["execute"]) for fd in exec_fds]
             + [(fd, rights["read_dir"]) for fd in list_fds])
    file_rights = sum(rights.get(n, 0) for n in ("execute", "write_file", "read_file", "truncate", "ioctl_dev"))
    try:
        for fd, access in rules:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):  # a rule on a file may grant only file rights
                access &= file_rights
            rule = ctypes.create_string_buffer(struct.pack("<Qi", access, fd), 12)
            if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                            rule, ctypes.c_uint32(0)) != 0:
                raise _fail(ctypes, "landlock_add_rule")
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _fail(ctypes, "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
# the part of the program that does not depend on the child's pid, built once
_SECCOMP_HEAD = b"".join(
    [_op(_LD, 4), _op(_JEQ, _AUDIT_ARCH_X86_64, 1, 0), _op(_RET, _RET_KILL_PROCESS),
     _op(_LD, 0), _op(_JGE, _X32_BIT, 0, 1), _op(_RET, _RET_KILL_PROCESS)]
    + [_op(_JEQ, n, 0, 1) + _op(_RET, _RET_KILL_PROCESS) for n in sorted(_DENIED_SYSCALLS_X86_64.values())])


def _seccomp_program() -> bytes:
    """BPF: kill on a foreign architecture, x32 calls and the denied calls."""
    return _SECCOMP_HEAD + _op(_RET, _RET_ALLOW)


def drop_capabilities() -> None:
    """Empty every capability set of this process (with no_new_privs, an exec does not give them back)."""
    ctypes, libc = _libc()
    header = ctypes.create_string_buffer(struct.pack("<Ii", _CAPABILITY_VERSION_3, 0), 8)
    data = ctypes.create_string_buffer(bytes(24), 24)  # effective, permitted, inheritable: all empty
    if libc.syscall(_SYS_CAPSET, header, data) != 0:
        raise _fail(ctypes, "capset")
    libc.prctl(_PR_CAP_AMBIENT, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL (EINVAL on old kernels: nothing to clear)


def harden(keep_capabilities: bool) -> None:
    """no_new_privs (irreversible; needed before Landlock and seccomp), and no capabilities unless
    ``keep_capabilities`` (a root worker that drops its children to 'nobody' needs them until then)."""
    ctypes, libc = _libc()
    if not keep_capabilities:
        drop_capabilities()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail(ctypes, "prctl(PR_SET_NO_NEW_PRIVS)")


def die_with_parent() -> None:
    """SIGKILL this process when its parent (the set-up process) dies; survives execve."""
    ctypes, libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)


def install_seccomp() -> None:
    """Install the seccomp filter of :func:`_seccomp_program` (after :func:`harden`)."""
    ctypes, libc = _libc()
    program = _seccomp_program()
    filters = ctypes.create_string_buffer(program, len(program))
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;}: 2 bytes, padding, a pointer
    fprog = ctypes.create_string_buffer(struct.pack("<H6xQ", len(program) // 8, ctypes.addressof(filters)), 16)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise _fail(ctypes, "prctl(PR_SET_SECCOMP)")


if __name__ == "__main__":  # the throwaway process of probe()
    print(json.dumps(_probe_here()))
