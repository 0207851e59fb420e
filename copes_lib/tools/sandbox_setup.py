"""The set-up process of a sandbox worker (``python sandbox_setup.py SETTINGS``; see :mod:`copes_lib.tools.sandbox`).

It runs no model code. It loads ctypes (:mod:`copes_lib.tools.isolation`, this folder's sibling, imported as a
top-level module: the package copes_lib would load numpy here), enters the worker's namespaces, forks the
worker, which sets no_new_privs, Landlock and seccomp on itself and execs a fresh interpreter on
``sandbox_worker.py serve``: the one file of copes_lib the worker may read. Then it waits for the worker and exits
with it.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys

if __name__ == "__main__":  # the set-up process: this file's folder is sys.path[0] (the package would load numpy)
    import isolation
    import sandbox_worker
else:  # imported (the doctest collection imports every module of copes_lib)
    from copes_lib.tools import isolation, sandbox_worker

WORKER = os.path.abspath(sandbox_worker.__file__)


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


def _setup_main(settings: dict) -> None:
    """The set-up process (layers 'auto' / 'kernel-only'): it loads ctypes, enters the worker's
    namespaces, forks the worker, which sets no_new_privs, Landlock and seccomp on itself and execs a
    fresh interpreter (``sandbox.py serve``) that never loads ctypes; then it waits for the worker and
    exits with it. It runs no code of the model."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    iso = isolation
    without = set(settings.get("without", ()))
    active: dict[str, str] = {}
    if "namespaces" not in without:
        try:
            active.update(iso.enter_namespaces(settings["base_dir"], settings["temp_quota_mb"], sandbox_worker.TEMP_MAX_FILES))
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
    uid, gid = (sandbox_worker.SANDBOX_UID, sandbox_worker.SANDBOX_GID) if drop else (None, None)
    os.chmod(settings["base_dir"], 0o711)  # children (maybe 'nobody') must traverse into their folder
    call_dir = sandbox_worker._make_call_dir(settings["base_dir"], uid, gid)
    parents: list[str] = []
    read_roots = sandbox_worker._read_roots(settings, parents)
    libraries, executables = _library_paths()  # (reads /proc/self/maps: before the view replaces the root)
    # (this file too: the worker runs it; the rest of copes_lib stays unreadable)
    reads = read_roots + tuple(libraries) + (WORKER,)
    # no Landlock: the mount namespace's read-only view confines the file system instead (built by the
    # worker: a fresh /proc can be mounted only by a process of the pid namespace, before the pivot)
    view = "landlock" not in active and "private_tmpfs" in active and "pid_namespace" in active
    served = {**settings, "active": active, "read_roots": read_roots, "call_dir": call_dir}
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = sandbox_worker.SETUP_EXIT
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
                os.setresgid(os.getgid(), sandbox_worker.SANDBOX_GID, sandbox_worker.SANDBOX_GID)
            iso.harden(keep_capabilities=drop)
            if "landlock" in active:
                fds = lambda paths: [fd for _, fd in iso.open_rule_paths(paths)]  # noqa: E731
                iso.landlock_restrict(abi, fds(reads), fds([call_dir]),
                                      fds(("/dev/urandom", "/dev/random", "/dev/zero")), fds(("/dev/null",)),
                                      fds(executables), fds(sorted(set(parents) - {"/"})))
            if "seccomp" in active:
                iso.install_seccomp()
            os.execv(sys.executable, [sys.executable, "-s", "-B", WORKER, "serve",
                                      json.dumps(served)])
        except BaseException as exc:  # noqa: BLE001 - reported on stderr; the host sees the worker fail
            os.write(2, f"sandbox: the worker's kernel layers could not be set up: {exc}\n".encode())
        finally:
            os._exit(status)
    os.close(release_r)
    sandbox_worker._write_message(1, {"server_pid": pid})
    os.write(release_w, b"x")
    os.close(release_w)
    devnull = os.open(os.devnull, os.O_RDWR)  # the channel to the host is the worker's alone
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else sandbox_worker.SETUP_EXIT)


if __name__ == "__main__":
    _setup_main(json.loads(sys.argv[1]))
