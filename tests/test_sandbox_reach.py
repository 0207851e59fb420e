"""Issue 48: one call cannot touch another, and no call touches the host's kernel settings -- with the
audit hook switched off.

Code that corrupts the interpreter's memory switches the hook off (tests/sandbox_attacks.py's CPython
3.11 use-after-free); ``layers='kernel-only'`` is the sandbox's own way to run calls that way on any
Python: the kernel layers, the rlimits and the call's secret, and none of the hook's rules. In every
mode that starts as root (with and without the uid drop; on this host, without Landlock, i.e. under the
read-only view, and without namespaces), a call tries to reach its worker, the other workers and their
set-up processes through /proc (reopen each descriptor and write well-formed reply frames, open the
worker's memory), then innocent calls on every worker must return their own results, and the memo must
hold only those; then it tries to write the host's host name, domain name and global sysctls. The same
runs as a throwaway non-root user are in tests/test_sandbox_nonroot.py."""

import dataclasses
import os
import socket
import time

import pytest

from copes_lib.tools import CodeSandboxConfig, PythonSandbox, isolation
from copes_lib.tools import sandbox as sbx
from tests import sandbox_attacks as attacks

# (drop_privileges, CodeSandboxConfig.without): root with and without the uid drop, on this host and on
# simulated hosts without Landlock (the read-only view confines the files) or without namespaces
MODES = [(drop, without) for without in ("", "landlock", "namespaces") for drop in (True, False)]


def _mode_id(mode) -> str:
    drop, without = mode
    return ("uid-drop" if drop else "no-uid-drop") + (f",without={without}" if without else "")


@pytest.fixture(scope="module", params=MODES, ids=_mode_id)
def cross_record(request):
    drop, without = request.param
    if os.geteuid() != 0:
        pytest.skip("not root: tests/test_sandbox_nonroot.py's runs are the ones of this user")
    missing = set(isolation.KERNEL_LAYERS) - set(isolation.host_layers())
    if missing - {name for group in without.split(",") if group for name in isolation.SIMULATED_MISSING[group]}:
        pytest.skip(f"this kernel lacks {missing}")
    before = attacks.host_settings()
    try:
        return attacks.run_cross_call("kernel-only", drop, without)
    finally:
        attacks.remove_host_ipc()  # (without namespaces, a failing run's IPC objects are the host's)
        if attacks.host_settings() != before:  # (a failing run must not leave the host renamed)
            for path in ("/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname"):
                with open(path, "w") as handle:
                    handle.write(before[path])


def test_a_call_with_the_hook_off_cannot_change_another_calls_result(cross_record):
    failure = attacks.cross_call_failure(cross_record)
    assert failure is None, failure


def test_a_call_with_the_hook_off_cannot_write_the_hosts_kernel_settings(cross_record):
    failure = attacks.kernel_settings_failure(cross_record)
    assert failure is None, failure


def test_a_call_with_the_hook_off_leaves_no_ipc_object_to_a_later_call(cross_record):
    """SysV shared memory, semaphores, message queues and POSIX message queues are denied (seccomp): a call that
    loads ctypes cannot make one, so nothing outlives it in the worker's IPC namespace."""
    reason = attacks.ipc_not_tried(cross_record)
    if reason:
        pytest.skip(reason)
    failure = attacks.ipc_failure(cross_record)
    assert failure is None, failure
    assert not cross_record["ipc_left"]["ok"], cross_record["ipc_left"]  # the first IPC call ends the process


def test_the_calls_see_their_own_host_name():
    """The UTS namespace: inside, the host's name is not the host's object (the call reads its own copy)."""
    with PythonSandbox(CodeSandboxConfig(workers=1, memo_size=0)) as box:
        if "network_namespace" not in box.layers:
            pytest.skip("no namespaces on this host")
        assert "own hostname" in box.layers["network_namespace"]
        result = box.run("import os\nprint(os.uname().nodename)")
        assert result.ok and result.output == socket.gethostname() + "\n", result  # (a copy, not a new name)


def test_a_root_worker_is_out_of_reach_of_a_root_process_without_capabilities():
    """As root without the uid drop, the calls run as root without capabilities; the worker is exec'd
    non-dumpable, so such a process can neither read its /proc files nor (seccomp aside) ptrace it."""
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("not root")
    probe = ("import os, sys\nfrom copes_lib.tools import isolation\nisolation.drop_capabilities()\n"
             "pid = int(sys.argv[1])\n"
             "for name in ('environ', 'mem'):\n"
             "    try:\n        open(f'/proc/{pid}/{name}', 'rb').close()\n        print(name, 'OPENED')\n"
             "    except OSError as exc:\n        print(name, type(exc).__name__)\n")
    # the control: a dumpable root process without capabilities, as the worker is apart from dumpability
    control = subprocess.Popen([sys.executable, "-c", "from copes_lib.tools import isolation\n"
                                "isolation.drop_capabilities()\nimport time\ntime.sleep(60)"])
    try:
        time.sleep(1.0)  # (its capabilities dropped)
        with PythonSandbox(CodeSandboxConfig(workers=1, drop_privileges=False)) as box:
            worker = box.worker_pids()[0]
            ours = subprocess.run([sys.executable, "-c", probe, str(control.pid)], capture_output=True, text=True)
            theirs = subprocess.run([sys.executable, "-c", probe, str(worker)], capture_output=True, text=True)
            assert box.run("print(1)").output == "1\n"
    finally:
        control.kill()
        control.wait()
    assert ours.stdout == "environ OPENED\nmem OPENED\n", ours  # (the check can see a dumpable process)
    assert theirs.stdout == "environ PermissionError\nmem PermissionError\n", theirs


# ---------------------------------------------------------------------------- the reply's nonce
def test_a_reply_that_names_another_call_fails_and_shifts_nothing(monkeypatch):
    """A well-formed reply frame that does not carry this call's nonce (as a forged frame written into the
    channel would not) fails the call with a reason and replaces the worker; the next calls are right."""
    with PythonSandbox(CodeSandboxConfig(workers=1, memo_size=0, timeout_s=1.0)) as box:
        worker = box._workers[0]
        real = worker._receive
        forged = {"ok": True, "output": "forged", "error": "", "elapsed_s": 0.0}

        for bad in (forged, {**forged, "call": "00" * sbx.NONCE_BYTES}):
            monkeypatch.setattr(worker, "_receive", attacks.replacing_next_reply(real, bad))
            pid = box.worker_pids()[0]
            result = box.run("print('innocent')")
            assert not result.ok and "did not name this call" in result.error, result
            assert box.worker_pids()[0] != pid  # replaced
            monkeypatch.setattr(worker, "_receive", real)
            for i in range(3):
                assert box.run(f"print({i} + 40)").output == f"{i + 40}\n"


# ---------------------------------------------------------------------------- issue 48's lower items
def test_the_worker_stderr_reaches_the_host_framed(capfd):
    """What a worker writes on its stderr (a socket the host reads, which no call can reopen through
    /proc) comes to the host's stderr only as one quoted line naming the worker: no raw bytes."""
    theirs, ours = socket.socketpair()
    holder = sbx._Worker.__new__(sbx._Worker)  # (no process: only its stderr socket)
    holder.errors, holder.server_pid, holder.proc = ours, 4242, None
    ours.setblocking(False)
    theirs.sendall(b"raw \x1b[31mred\n[sandbox worker 1] ok: True\n")
    capfd.readouterr()
    sbx._Worker.relay_stderr(holder)
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[sandbox worker 4242] stderr: 'raw \\x1b[31mred\\n"), err
    assert "\x1b" not in err
    theirs.close()
    ours.close()


def test_a_killed_hosts_temp_folders_are_removed_by_the_next_start(tmp_path):
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    left = tmp_path / f"{sbx.TEMP_PREFIX}{dead}-abc"
    (left / "call" / "deep").mkdir(parents=True)
    (left / "call" / "deep" / "f").write_text("x")
    mine = tmp_path / f"{sbx.TEMP_PREFIX}{os.getpid()}-xyz"  # a live host's: kept
    mine.mkdir()
    other = tmp_path / "copes-sandbox-old"  # not ours by name: kept
    other.mkdir()
    config = CodeSandboxConfig(workers=1, temp_root=str(tmp_path))
    with PythonSandbox(config) as box:
        assert box.run("print(1)").output == "1\n"
        assert not left.exists() and mine.exists() and other.exists()
        assert box.stale_removed == [str(left)]


def test_without_a_tmpfs_the_quota_accounting_is_linear():
    """2,000 small files without a private tmpfs: the hook counts each once (their bytes are re-read only
    for files that may still grow), so the call finishes; the bound itself: test_sandbox.py."""
    config = dataclasses.replace(CodeSandboxConfig(workers=1, memo_size=0, timeout_s=10.0), without="namespaces")
    code = "for i in range(2000):\n    open(f'f{i}', 'w').write('x')\nprint('made')"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", isolation.IsolationWarning)
        box = PythonSandbox(config).start()
    with box:
        assert "private_tmpfs" not in box.layers
        result = box.run(code)
        assert result.ok and result.output == "made\n", result
        # (its cost, 13 s before, is measured in benchmarks/bench_sandbox.py, not timed here)
