"""Tests of the Python sandbox: normal calls, every hostile category, the pool's survival, determinism,
the memo and a clean shutdown."""

import dataclasses
import os
import shutil
import signal
import socket
import time
import warnings
from pathlib import Path

import pytest

from copes_lib.config import ConfigError
from copes_lib.tools import CodeSandboxConfig, PythonSandbox, SandboxResult, isolation, python_error
from copes_lib.tools.sandbox import CodeSandboxConfig as SandboxConfigDirect
from tests import sandbox_attacks as attacks

REPO = Path(__file__).resolve().parent.parent
# short timeout so the loop / sleep categories cost little; memo off so every call really runs
FAST = CodeSandboxConfig(timeout_s=1.0, memo_size=0, workers=2)


@pytest.fixture(scope="module")
def box():
    with PythonSandbox(FAST) as sandbox:
        yield sandbox


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before or while /proc was read (ESRCH mid-read)
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _settled_children(zygotes: list[int], timeout_s: float = 2.0) -> list[int]:
    """Children of the zygotes once each has forked its next prepared child (it does so after replying)."""
    deadline = time.monotonic() + timeout_s
    while True:
        children = [child for pid in zygotes for child in _children(pid) if _alive(child)]
        if len(children) >= len(zygotes) or time.monotonic() > deadline:
            return children
        time.sleep(0.01)


def _assert_serves(box: PythonSandbox) -> None:
    """The pool still answers a normal call correctly, in an empty folder, and the zygotes are alive."""
    for _ in range(box.config.workers):  # (memo off in these boxes or a fresh code: every worker answers)
        result = box.run(attacks.SERVES_CODE)
        assert result.ok, result.error
        assert result.output == attacks.SERVES_OUTPUT
    assert all(_alive(pid) for pid in box.worker_pids())


# ---------------------------------------------------------------------------- normal behaviour
def test_stdout_is_captured(box):
    result = box.run("print(2 + 3)")
    assert result == SandboxResult(ok=True, output="5\n", error="", elapsed_s=result.elapsed_s)
    assert result.observation() == "5\n"
    assert 0.0 < result.elapsed_s < FAST.timeout_s


def test_a_final_expression_is_not_printed(box):
    result = box.run("x = 2 + 3\nx")
    assert result.ok and result.output == ""
    assert result.observation() == "(no output)"


def test_errors_look_like_python(box):
    result = box.run("print('before')\nprint(undefined_name)")
    assert not result.ok
    assert result.error == "NameError: name 'undefined_name' is not defined"
    assert result.output == "before\n"
    assert result.observation() == "before\nNameError: name 'undefined_name' is not defined"
    assert box.run("1 / 0").error == "ZeroDivisionError: division by zero"
    assert box.run("{}['k']").error == "KeyError: 'k'"
    assert box.run("print(").error == "SyntaxError: '(' was never closed (line 1)"
    assert box.run("from decimal import Decimal\nDecimal('x')").error.startswith("decimal.InvalidOperation")


def test_python_error_matches_the_last_traceback_line():
    assert python_error(NameError("name 'x' is not defined")) == "NameError: name 'x' is not defined"
    assert python_error(ZeroDivisionError()) == "ZeroDivisionError"
    try:
        compile("x = (", "<s>", "exec")
    except SyntaxError as exc:
        assert python_error(exc) == "SyntaxError: '(' was never closed (line 1)"


def test_common_library_code_is_not_mistaken_for_an_attack(box):
    code = ("from collections import namedtuple\nimport enum, logging, typing, sys\n"
            "P = namedtuple('P', 'x y')\nColor = enum.Enum('Color', 'RED GREEN')\nT = typing.TypeVar('T')\n"
            "sys.set_int_max_str_digits(100000)\nlogging.getLogger('x').debug('quiet')\n"
            "print(P(1, 2), Color.GREEN.value, len(str(2 ** 20000)))")
    result = box.run(code)
    assert result.ok, result.error
    assert result.output == "P(x=1, y=2) 2 6021\n"


def test_calls_do_not_share_state(box):
    assert box.run("leak = 1\nprint(leak)").ok
    assert box.run("print(leak)").error == "NameError: name 'leak' is not defined"
    assert box.run("import math\nmath.pi = 3\nprint(math.pi)").output == "3\n"
    assert box.run("import math\nprint(math.pi)").output == "3.141592653589793\n"


def test_preloaded_modules_and_the_temp_dir_work(box):
    code = ("import math, fractions, statistics, itertools, json\n"
            "open('notes.txt', 'w').write('ok')\n"
            "print(math.comb(5, 2), fractions.Fraction(1, 3) + fractions.Fraction(1, 6),"
            " statistics.mean([1, 2, 3]), open('notes.txt').read())")
    result = box.run(code)
    assert result.ok, result.error
    assert result.output == "10 1/2 2 ok\n"
    # the next call gets a fresh, empty working directory
    assert box.run("import os\nprint(os.listdir('.'))").output == "[]\n"


def test_output_is_truncated_to_max_output_chars(box):
    result = box.run("print('a' * 1000)")
    assert result.ok
    assert result.output.startswith("a" * FAST.max_output_chars + "\n... [output truncated")
    assert "1001 characters in total" in result.output


def test_run_many_keeps_order_and_runs_in_parallel(box):
    codes = [f"import time\ntime.sleep(0.3)\nprint({i} ** 2)" for i in range(4)]
    start = time.perf_counter()
    results = box.run_many(codes)
    wall = time.perf_counter() - start
    assert [r.output for r in results] == [f"{i ** 2}\n" for i in range(4)]
    # 4 calls of 0.3 s on 2 workers: about 0.6 s in parallel, 1.2 s serially
    assert wall < 1.1, f"run_many took {wall:.2f} s: the calls did not overlap"
    assert box.run_many([]) == []


def test_same_code_gives_the_same_output_on_every_worker(box):
    code = ("import random\nprint(random.random(), {'apple', 'pear', 'fig', 'kiwi'}, object())\n"
            "print(sorted({str(i) for i in range(20)}, key=hash)[:5])")
    outputs = {r.output for r in box.run_many([code] * 6)}
    assert len(outputs) == 1, outputs
    assert "at 0x...>" in outputs.pop()


# ---------------------------------------------------------------------------- hostile categories
# The catalogue (tests/sandbox_attacks.py) is shared with test_sandbox_nonroot.py, which runs it again
# as a throwaway non-root user.
ATTACKS = attacks.catalogue("SITE")  # names only; the codes are built per fixture with the real folder
BOXES = {  # id -> (layers, drop_privileges, without)
    "default": ("auto", True, ""),
    # what a non-root host gets (children run as the host's user): the kernel layers and the hook
    "no-uid-drop": ("auto", False, ""),
    # the configuration of issue 24's report: the audit hook alone, children as the host's user
    "hook-only": ("hook-only", False, ""),
    # the kernel layers alone, without the hook's rules: they must stop the harmful cases by themselves
    "kernel-only": ("kernel-only", False, ""),
    # hosts that lack layers: a kernel before 5.13 or a container whose seccomp profile blocks Landlock
    # (the read-only mount-namespace view replaces it); one without user namespaces (no network / mount /
    # pid namespace, no private tmpfs). 'auto' there keeps every rule of the hook: the same catalogue,
    # the same expectations. (A host with neither Landlock nor namespaces refuses: see below.)
    "no-landlock": ("auto", True, "landlock"),
    "no-landlock-no-uid-drop": ("auto", False, "landlock"),
    "no-namespaces": ("auto", False, "namespaces"),
    # neither: it refuses (below) unless the caller opts in (allow_unconfined_files) -- the opt-in's host
    "no-landlock-no-namespaces (opt-in)": ("auto", False, "landlock,namespaces"),
}


@pytest.fixture(scope="module")
def site():
    """A site-packages-like folder the workers preload from (see tests/sandbox_attacks.py)."""
    folder = attacks.make_site()
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(os.path.dirname(folder))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.path.dirname(folder),
                                                                 os.environ.get("PYTHONPATH")])))
        yield folder
    shutil.rmtree(os.path.dirname(folder), ignore_errors=True)


@pytest.fixture(scope="module", params=list(BOXES))
def hostile_box(request, site):
    layers, drop, without = BOXES[request.param]
    if layers == "kernel-only" and set(isolation.KERNEL_LAYERS) - set(isolation.host_layers()):
        pytest.skip(f"this kernel lacks {set(isolation.KERNEL_LAYERS) - set(isolation.host_layers())}")
    config = dataclasses.replace(FAST, layers=layers, drop_privileges=drop, memo_size=64, without=without,
                                 preload=FAST.preload + "," + attacks.FAKE_PACKAGE,
                                 allow_unconfined_files=attacks.unconfined(layers, without))  # (it refuses otherwise)
    patient_config = dataclasses.replace(config, timeout_s=attacks.PATIENT_TIMEOUT_S)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", isolation.IsolationWarning)  # (the simulated hosts lack layers)
        quick, patient = PythonSandbox(config).start(), PythonSandbox(patient_config).start()
    with quick, patient:
        yield {"quick": quick, "patient": patient, "site": site}


@pytest.mark.parametrize("category", list(ATTACKS))
def test_hostile_code_fails_alone_and_the_pool_keeps_serving(hostile_box, category):
    code, expected = attacks.catalogue(hostile_box["site"])[category]
    # (an attack the sandbox stops in milliseconds runs with a 30 s limit: a loaded machine cannot time it out)
    layers = hostile_box["quick"].config.layers
    box = hostile_box["patient" if attacks.is_patient(category, layers, expected) else "quick"]
    zygotes = box.worker_pids()
    result = box.run(code)
    record = {"ok": result.ok, "output": result.output, "error": result.error}
    failure = attacks.expectation_failure(category, box.config.layers, record, expected)
    assert failure is None, failure
    if not result.ok:
        assert result.error in result.observation()
        assert code not in box._memo  # a failure, a denial above all, is never memoised
    if not (box.config.layers == "kernel-only" and category == "fork bomb" and os.geteuid() == 0):
        assert result.elapsed_s < box.config.timeout_s + 0.5
    # (kernel-only as root without the uid drop: RLIMIT_NPROC does not bind root and the worker's seccomp
    # filter must allow clone, so the forks run -- inside the worker's pid namespace -- until the timeout
    # kills them all; on a loaded machine the zygote may see the deadline late. Nothing survives. While the
    # zygote, process 1 there, kills and reaps thousands of forks after its reply, its children come and go
    # (orphans are reparented to it, then reaped): one sample of "one spare per zygote" can fall mid-way, as
    # a run of make test found (2, then 37 at the next read). Settled = that count in 5 reads in a row after a
    # fork bomb; one read elsewhere (nothing churns: 5 reads for each of the ~600 cases cost minutes)
    reads = 5 if category == "fork bomb" else 1
    deadline, in_a_row = time.monotonic() + 30.0, 0
    while in_a_row < reads and time.monotonic() < deadline:
        in_a_row = in_a_row + 1 if len(_settled_children(box.worker_pids())) == len(box.worker_pids()) else 0
        if in_a_row < reads:
            time.sleep(0.1)
    assert in_a_row == reads, _settled_children(box.worker_pids())
    # the host and its files are unharmed, and the same zygotes keep serving
    assert attacks.harm(hostile_box["site"]) == []
    assert box.worker_pids() == zygotes
    _assert_serves(box)


def test_fork_bomb_leaves_no_processes(box):
    zygotes = box.worker_pids()
    box.run_many(["import os\nfor _ in range(100):\n    try:\n        os.fork()\n    except Exception:\n        pass"] * 4)
    time.sleep(0.2)
    # each zygote keeps exactly one prepared child, and nothing else survives
    children = _settled_children(zygotes)
    assert len(children) == len(zygotes)
    assert all(_children(child) == [] for child in children)


def test_a_dead_worker_is_replaced(box):
    victim = box.worker_pids()[0]
    victim_dir = Path(box._workers[0].base_dir)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10.0  # dead, not dying: on a loaded machine 0.1 s was not always enough
    while _alive(victim) and time.monotonic() < deadline:  # (at 0984fea as now)
        time.sleep(0.02)
    results = box.run_many(["print('a')", "print('b')", "print('c')"])
    assert [r.output for r in results] == ["a\n", "b\n", "c\n"], results
    assert victim not in box.worker_pids()
    assert not victim_dir.exists()  # the host removed the dead zygote's temp dir
    _assert_serves(box)


# ---------------------------------------------------------------------------- memo, config, shutdown
def test_memo_reuses_successful_results_only():
    with PythonSandbox(CodeSandboxConfig(memo_size=2, workers=1, timeout_s=1.0)) as sandbox:
        first = sandbox.run("print(sum(range(10)))")
        again = sandbox.run("print(sum(range(10)))")
        assert (first.cached, again.cached) == (False, True)
        assert again.output == first.output == "45\n"
        assert not sandbox.run("print(y)").cached and not sandbox.run("print(y)").cached
        batch = sandbox.run_many(["print(1)", "print(1)", "print(2)"])
        assert [r.output for r in batch] == ["1\n", "1\n", "2\n"]
        assert batch[1].cached


def test_config_checks_name_the_parameter():
    assert CodeSandboxConfig is SandboxConfigDirect
    with pytest.raises(ConfigError, match="memory_mb"):
        CodeSandboxConfig(memory_mb=0)
    with pytest.raises(ConfigError, match="max_printed_chars"):
        CodeSandboxConfig(max_output_chars=500, max_printed_chars=100)
    with pytest.raises(ConfigError, match="preload"):
        CodeSandboxConfig(preload="math,not a module")
    with pytest.raises(ConfigError, match="preload"):
        PythonSandbox(CodeSandboxConfig(preload="math,no_such_module_xyz", workers=1)).start()


def test_close_leaves_no_processes():
    sandbox = PythonSandbox(CodeSandboxConfig(workers=2, timeout_s=1.0))
    assert sandbox.run("open('scratch.txt', 'w').write('x')\nprint('up')").output == "up\n"
    zygotes = sandbox.worker_pids()
    temp_dirs = [Path(worker.base_dir) for worker in sandbox._workers]
    assert all(path.is_dir() for path in temp_dirs)
    spares = _settled_children(zygotes)
    assert len(zygotes) == 2 and len(spares) == 2
    sandbox.close()
    time.sleep(0.05)
    assert not any(_alive(pid) for pid in zygotes + spares)
    assert not any(path.exists() for path in temp_dirs)
    with pytest.raises(RuntimeError, match="closed"):
        sandbox.run("print('after close')")


def test_a_success_needs_the_exit_status_and_the_secret():
    from copes_lib.tools import sandbox_worker as worker

    settings = {"timeout_s": 1.0}
    exited = lambda code: code << 8  # noqa: E731 - a waitpid status for a normal exit with `code`
    assert worker._verdict(exited(worker.FINISHED_EXIT), True, None, settings) == (True, "")
    ok, error = worker._verdict(exited(worker.FINISHED_EXIT), False, "forged", settings)  # os._exit(0), no secret
    assert not ok and error.startswith("SystemExit")
    ok, error = worker._verdict(exited(worker.DENIED_EXIT), True, "", settings)
    assert not ok and error.startswith("PermissionError: sandbox:")
    ok, error = worker._verdict(exited(worker.FAILED_EXIT), False, "ValueError: x", settings)
    assert (ok, error) == (False, "ValueError: x")
    ok, error = worker._verdict(signal.SIGKILL, True, None, settings)  # killed by a signal
    assert not ok and error.startswith("MemoryError")
    ok, error = worker._verdict(signal.SIGSYS, True, None, settings)  # the seccomp filter
    assert not ok and error.startswith("PermissionError: sandbox:")


# ---------------------------------------------------------------------------- isolation layers
def test_the_sandbox_records_the_kernel_layers_this_host_offers(box):
    assert set(box.layers) == set(isolation.host_layers())
    line = box.describe_layers()
    assert line.endswith("rlimits + audit hook") or "; missing: " in line
    for name in box.layers:
        assert name in line


def test_missing_layers_are_named_in_a_warning_never_silently():
    with pytest.warns(isolation.IsolationWarning) as caught:
        message = isolation.warn_missing({})
    assert message == str(caught[0].message)
    assert "audit hook and rlimits only" in message
    assert isolation.HOOK_STILL in message
    assert "not a boundary" in isolation.HOOK_STILL and "switches it off" in isolation.HOOK_STILL  # what the no-landlock / no-namespaces boxes above show
    for name in isolation.KERNEL_LAYERS:
        assert f"without {name}, {isolation.MISSING_MEANS[name]}" in message
    with pytest.warns(isolation.IsolationWarning, match="without private_tmpfs"):
        isolation.warn_missing({name: "" for name in isolation.KERNEL_LAYERS if name != "private_tmpfs"})
    assert isolation.warn_missing({name: "" for name in isolation.KERNEL_LAYERS}) is None
    with pytest.raises(ConfigError, match="layers"):
        CodeSandboxConfig(layers="docker")


def test_hook_only_runs_without_kernel_layers():
    with PythonSandbox(dataclasses.replace(FAST, layers="hook-only", workers=1, allow_unconfined_files=True)) as sandbox:
        assert sandbox.run("print(1)").output == "1\n"
        assert sandbox.layers == {}
        assert "hook-only" in sandbox.describe_layers()


def test_a_call_may_use_its_quota_and_files_vanish_afterwards(box):
    code = ("import os\nfor i in range(6):\n    open(f'f{i}', 'wb').write(b'x' * 8 * 2**20)\n"
            "print(sum(os.path.getsize(f'f{i}') for i in range(6)) // 2**20)")
    result = box.run(code)
    assert result.ok and result.output == "48\n", result
    assert box.run("import os\nprint(os.listdir('.'))").output == "[]\n"


def test_dir_fd_inside_the_working_directory_still_works(box):
    code = ("import os, shutil\nos.makedirs('a/b')\nopen('a/b/x', 'w').write('1')\nfd = os.open('a', os.O_RDONLY)\n"
            "os.rename('b/x', 'b/y', src_dir_fd=fd, dst_dir_fd=fd)\nos.remove('b/y', dir_fd=fd)\nos.close(fd)\n"
            "shutil.rmtree('a')\nprint(os.listdir('.'))")
    result = box.run(code)
    assert result.ok and result.output == "[]\n", result


# ---------------------------------------------------------------------------- issue 33
def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_process_that_runs_the_code_never_loaded_ctypes(box):
    """The set-up process holds _ctypes (it applies the kernel layers); the worker it execs and the
    children it forks do not: no ctypes class exists in their memory to be found."""
    _assert_serves(box)
    for worker in box._workers:
        assert "_ctypes" in _maps(worker.proc.pid)  # the check can see it where it is
        assert worker.server_pid is not None and worker.server_pid != worker.proc.pid
        assert "_ctypes" not in _maps(worker.server_pid)
        for child in _settled_children([worker.server_pid]):
            assert "_ctypes" not in _maps(child)
    result = box.run("found = [c for c in object.__subclasses__() if c.__module__ == '_ctypes']\nprint(found)")
    assert result.ok and result.output == "[]\n", result


def test_preloads_that_give_native_memory_access_are_named_in_a_warning():
    with pytest.warns(isolation.IsolationWarning, match="numpy give the sandboxed code native memory access"):
        with PythonSandbox(dataclasses.replace(FAST, workers=1, preload="math,numpy", memory_mb=1024)) as sandbox:
            assert sandbox.native_access == ["numpy"]
            assert sandbox.run("import numpy\nprint(numpy.ones(2).sum())").output == "2.0\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error", isolation.IsolationWarning)
        with PythonSandbox(dataclasses.replace(FAST, workers=1)) as sandbox:
            assert sandbox.native_access == []


def test_without_a_private_tmpfs_the_quota_counts_bytes_and_entries():
    # (10 s: 4,096 folders took ~1.1 s under load at 0984fea as now, past FAST's 1 s)
    config = dataclasses.replace(FAST, workers=1, without="namespaces", temp_quota_mb=1, file_size_mb=1,
                                 timeout_s=10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", isolation.IsolationWarning)
        sandbox = PythonSandbox(config).start()
    with sandbox:
        assert "private_tmpfs" not in sandbox.layers
        # dozens of small files and folders are ordinary use
        many = ("import os\nfor i in range(60):\n    os.mkdir(f'd{i}')\n    open(f'd{i}/f', 'w').write('x')\n"
                "print(len(os.listdir('.')))")
        assert sandbox.run(many).output == "60\n"
        # bytes: a file may not be opened for writing once the call's files hold temp_quota_mb
        big = "for i in range(3):\n    open(f'f{i}', 'wb').write(b'x' * 2**20)"
        assert sandbox.run(big).error.startswith("PermissionError: sandbox: storage quota"), sandbox.run(big)
        # entries: folders count (5000 > TEMP_MAX_FILES)
        folders = "import os\nfor i in range(5000):\n    os.mkdir(f'd{i}')"
        assert sandbox.run(folders).error.startswith("PermissionError: sandbox: more than 4096 files and folders")
        assert sandbox.run("import os\nprint(os.listdir('.'))").output == "[]\n"


def test_probe_measures_in_a_child_process():
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)  # a thread here would make an in-process probe under-report
    thread.start()
    try:
        assert isolation.probe() == isolation.host_layers()
    finally:
        stop.set()
        thread.join()


def test_without_names_only_layers_that_can_be_left_out():
    with pytest.raises(ConfigError, match="without: 'selinux'"):
        CodeSandboxConfig(without="selinux")
    with pytest.raises(ConfigError, match="without needs layers='auto' or 'kernel-only'"):
        CodeSandboxConfig(without="landlock", layers="hook-only")


# ---------------------------------------------------------------------------- issue 40
@pytest.mark.parametrize("without", ["landlock,namespaces", "landlock,namespaces,seccomp"])
def test_a_host_without_file_confinement_refuses_to_start(without):
    """Neither Landlock nor namespaces for the read-only view: refuse, naming the layer, why, the opt-in."""
    message = attacks.start_refusal(without)
    assert message.startswith("the Python sandbox refuses to start"), message
    for words in ("Landlock", "read-only view", "use-after-free", "allow_unconfined_files=True", without):
        assert words in message, (words, message)
    with pytest.raises(isolation.ConfinementError, match="layers='hook-only'"):
        PythonSandbox(dataclasses.replace(FAST, layers="hook-only", workers=1)).start()


def test_the_opt_in_starts_and_still_warns():
    config = dataclasses.replace(FAST, workers=1, without="landlock,namespaces", allow_unconfined_files=True)
    with pytest.warns(isolation.IsolationWarning, match="without landlock, nothing in the kernel confines"):
        sandbox = PythonSandbox(config).start()
    with sandbox:
        assert isolation.file_confinement(sandbox.layers) is None
        assert sandbox.run("print(1)").output == "1\n"


def test_without_landlock_the_read_only_view_confines_the_files():
    config = dataclasses.replace(FAST, workers=1, without="landlock")
    with pytest.warns(isolation.IsolationWarning, match="read-only mount-namespace view instead"):
        sandbox = PythonSandbox(config).start()
    with sandbox:
        assert isolation.file_confinement(sandbox.layers) == isolation.READ_ONLY_VIEW
        assert "/proc" in sandbox.layers["pid_namespace"]
        # os.stat has no audit event: it sees what the kernel shows, and the host's files are not there
        probe = f"import os\nprint(os.path.exists('/etc/passwd'), os.path.exists({str(REPO / 'pyproject.toml')!r}))"
        assert sandbox.run(probe).output == "False False\n"


@pytest.mark.parametrize("category", [attacks.MEMORY_NAME])
def test_memory_corruption_from_pure_python_is_stopped_by_the_kernel(hostile_box, category):
    """The hook is switched off from pure Python (a CPython 3.11 use-after-free); what the kernel layers
    of each host mode still stop. (hook-only has none: it escapes there, so it is not run; the opt-in's
    documented risk.)"""
    box, site = hostile_box["quick"], hostile_box["site"]  # (quick: it may end by the time limit)
    if attacks.memory_attack_skip_reason():
        pytest.skip(attacks.memory_attack_skip_reason())
    if attacks.unconfined(box.config.layers, box.config.without):
        pytest.skip("no kernel file confinement (the opt-in): the attack escapes (docs/sandbox.md); not run here")
    result = box.run(attacks.memory_attack(site))
    record = {"ok": result.ok, "output": result.output, "error": result.error}
    failure = attacks.memory_failure(record)
    assert failure is None, failure
    assert attacks.harm(site) == []
    time.sleep(0.2)  # (a forked process would be starting)
    if "pid_namespace" in box.layers or box.config.drop_privileges:
        # nothing the call forked outlives it (a pid namespace, or RLIMIT_NPROC = 0 for 'nobody')
        assert len(_settled_children(box.worker_pids())) == len(box.worker_pids())
        assert all(_children(child) == [] for child in _settled_children(box.worker_pids()))
    # (root without the uid drop and without a pid namespace: a forked process that calls setsid() leaves
    # the call's group and lives on, confined by Landlock and seccomp; docs/sandbox.md says so)
    _assert_serves(box)


def test_a_malformed_worker_reply_is_a_failed_call(monkeypatch):
    with PythonSandbox(dataclasses.replace(FAST, workers=1)) as sandbox:
        worker = sandbox._workers[0]
        real = worker._receive
        for bad in ({"ok": True, "output": "x"}, {"ok": "yes", "output": "", "error": "", "elapsed_s": 0.1},
                    {"ok": True, "output": "", "error": "", "elapsed_s": True}, ["ok"], None):
            monkeypatch.setattr(worker, "_receive", attacks.replacing_next_reply(real, bad))
            result = sandbox.run("print('innocent')")
            assert not result.ok and result.error.startswith("RuntimeError: the sandbox worker"), (bad, result)
            monkeypatch.setattr(worker, "_receive", real)
            assert sandbox.run("print(6 * 7)").output == "42\n"
    # bytes that are not JSON (or not UTF-8) are no reply
    from copes_lib.tools import sandbox as sbx

    ours, theirs = socket.socketpair()
    holder = type("W", (), {"channel": ours})()
    for payload in (b"\xff{", b"{\"ok\": tru"):
        theirs.sendall(sbx.worker._HEADER.pack(len(payload)) + payload)
        assert sbx._Worker._receive(holder, time.monotonic() + 5) is None
    theirs.close()
    ours.close()


@pytest.mark.parametrize("without", ["", "namespaces"])
def test_close_and_run_never_raise_after_a_deep_folder_and_a_killed_worker(without):
    """The folder chain stays behind when its worker is killed before cleaning up: the host removes it
    (without recursion), the next call is served by a replacement, and close() does not raise."""
    config = dataclasses.replace(FAST, workers=1, without=without)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", isolation.IsolationWarning)
        sandbox = PythonSandbox(config).start()
    code, _ = attacks.DEEP_FOLDERS["1,500-deep folder chain"]
    hold = code.replace("print('built')", "import time\nprint('built', flush=True)\ntime.sleep(30)")
    base = Path(sandbox._workers[0].base_dir)
    results = []
    import threading

    thread = threading.Thread(target=lambda: results.append(sandbox.run(hold)))
    thread.start()
    time.sleep(0.8)
    os.kill(sandbox.worker_pids()[0], signal.SIGKILL)
    thread.join()
    assert not results[0].ok
    assert sandbox.run(attacks.SERVES_CODE).output == attacks.SERVES_OUTPUT
    assert not base.exists()
    sandbox.close()


def test_a_worker_killed_while_cleaning_up_never_fails_the_next_call():
    """Killed right after replying (while it empties a deep chain, or just after): the next call goes to
    a replacement or to the cleaned worker, and is correct either way. (10 s to build the chain: on a
    loaded machine the 1 s of FAST stopped it part-way, at 0984fea as now.)

    The next call starts once the kill has taken effect as the host sees it (the set-up process above the
    zygote has exited): os.kill only queues the signal, and under load the zygote could still send its
    "ready" and take the next code before dying; that call then fails with the reason (never a wrong
    result), which is not the case this test is about (the fresh-clone 3.12 and 3.13 runs under load hit it once each)."""
    with PythonSandbox(dataclasses.replace(FAST, workers=1, timeout_s=10.0)) as sandbox:
        code, _ = attacks.DEEP_FOLDERS["1,500-deep folder chain"]
        for _ in range(3):
            assert sandbox.run(code).output == "built\n"
            os.kill(sandbox.worker_pids()[0], signal.SIGKILL)
            deadline = time.monotonic() + 30.0
            while not sandbox._workers[0].exited() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sandbox._workers[0].exited(), "the killed worker was still running after 30 s"
            result = sandbox.run(attacks.SERVES_CODE)
            assert result.ok and result.output == attacks.SERVES_OUTPUT, result
