"""Tests of the Python sandbox: normal calls, every hostile category, the pool's survival, determinism,
the memo and a clean shutdown."""

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from copes_lib.config import ConfigError
from copes_lib.tools import CodeSandboxConfig, PythonSandbox, SandboxResult, python_error
from copes_lib.tools.sandbox import CodeSandboxConfig as SandboxConfigDirect

REPO = Path(__file__).resolve().parent.parent
# short timeout so the loop / sleep categories cost little; memo off so every call really runs
FAST = CodeSandboxConfig(timeout_s=1.0, memo_size=0, workers=2)


@pytest.fixture(scope="module")
def box():
    with PythonSandbox(FAST) as sandbox:
        yield sandbox


@pytest.fixture(scope="module", params=[True, False], ids=["default", "audit-hook-only"])
def hostile_box(request):
    """The default sandbox and one without the uid drop: what a non-root user (e.g. on a cluster) gets,
    where only the audit hook and the rlimits stand between the code and the host."""
    with PythonSandbox(dataclasses.replace(FAST, drop_privileges=request.param)) as sandbox:
        yield sandbox


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
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
    """The pool still answers a normal call correctly, and the zygotes are alive."""
    result = box.run("print(6 * 7)")
    assert result.ok, result.error
    assert result.output == "42\n"
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
HOSTILE = {
    "infinite loop": ("while True:\n    pass", "TimeoutError"),
    "sleeping forever": ("import time\ntime.sleep(60)", "TimeoutError"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "PermissionError: sandbox: os.fork"),
    "subprocess": ("import subprocess\nsubprocess.run(['true'])", "ImportError: sandbox: module 'subprocess'"),
    "raw fork_exec": ("import _posixsubprocess", "ImportError: sandbox: module '_posixsubprocess'"),
    "os.system": ("import os\nos.system('touch /tmp/copes_pwned')", "PermissionError: sandbox: os.system"),
    "huge allocation": ("x = bytearray(50 * 2**30)", "MemoryError"),
    # touching 512 MiB may take longer than the 1 s timeout on a busy machine: either limit may stop it
    "growing list": ("x = []\nwhile True:\n    x.append(bytearray(2**20))", ("MemoryError", "TimeoutError")),
    "read /etc/passwd": ("print(open('/etc/passwd').read())", "PermissionError: sandbox: reading '/etc/passwd'"),
    "read a repo file": (f"print(open({str(REPO / 'pyproject.toml')!r}).read())",
                         "PermissionError: sandbox: reading"),
    "read via os.open": ("import os\nos.read(os.open('/etc/hostname', os.O_RDONLY), 100)",
                         "PermissionError: sandbox: reading"),
    "list the root dir": ("import os\nprint(os.listdir('/'))", "PermissionError: sandbox: reading '/'"),
    "write outside": ("open('/tmp/copes_sandbox_escape.txt', 'w').write('x')",
                      "PermissionError: sandbox: writing '/tmp/copes_sandbox_escape.txt'"),
    "write via ..": ("open('../../copes_sandbox_escape.txt', 'w').write('x')", "PermissionError: sandbox"),
    "symlink out": ("import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())",
                    "PermissionError: sandbox: os.symlink"),
    "socket": ("import socket\nsocket.socket().connect(('127.0.0.1', 80))", "ImportError: sandbox: module 'socket'"),
    "kill the parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "PermissionError: sandbox: os.kill"),
    "kill the group": ("import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
                       "PermissionError: sandbox: os.killpg"),
    "pidfd signal": ("import os\nos.pidfd_open(os.getppid())", "AttributeError"),
    "ctypes": ("import ctypes", "ImportError: sandbox: module 'ctypes'"),
    "raise the limits": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
                         "PermissionError: sandbox: resource.setrlimit"),
    "gc escape": ("import gc\nprint(len(gc.get_objects()))", "PermissionError: sandbox: gc.get_objects"),
    "trace hook": ("import sys\nsys.settrace(lambda *a: None)", "PermissionError: sandbox: sys.settrace"),
    "traceback frames": ("try:\n    open('/etc/passwd')\nexcept Exception as e:\n    tb = e.__traceback__\n"
                         "    while tb.tb_next:\n        tb = tb.tb_next\n    print(tb.tb_frame.f_locals)",
                         "PermissionError: sandbox: reading '/etc/passwd'"),
    "lying str": ("class S(str):\n    pass\n__import__(S('socket'))", "PermissionError: sandbox: import"),
    "sys.exit": ("import sys\nsys.exit(3)", "SystemExit: 3"),
    "os._exit": ("import os\nos._exit(0)", "SystemExit: the process exited with status 0"),
    "deep recursion": ("def f(n):\n    return f(n + 1)\nf(0)", "RecursionError"),
    "C-stack overflow": ("import sys, json\nsys.setrecursionlimit(10**6)\nx = []\n"
                         "for _ in range(10**5):\n    x = [x]\nprint(json.dumps(x))", "RecursionError"),
    "print 10 MB": ("print('x' * 10_000_000)", "OutputLimitError"),
    "print loop": ("while True:\n    print('spam')", "OutputLimitError"),
    "caught violation": ("try:\n    open('/etc/passwd')\nexcept Exception:\n    pass\nprint('fine')",
                         "PermissionError: sandbox: reading '/etc/passwd'"),
    "third-party import": ("import torch", "ImportError: sandbox: module 'torch'"),
}


# Forged reports: the child's report pipe is an inherited descriptor that the code can write to.
_FORGE = ("import os\n"
          "def forge():\n"
          "    for fd in range(3, 64):\n"
          "        try:\n"
          "            os.write(fd, b'1 0 6\\nforged')\n"
          "        except OSError:\n"
          "            pass\n")
FORGED = {
    # the attack of issue 17: hit a denied action, catch it, write a well-formed ok record
    "deny, catch, forge": _FORGE + "try:\n    open('/etc/passwd')\nexcept Exception:\n    pass\nforge()\n"
                                   "os._exit(0)",
    "forge, deny, catch, exit 0": _FORGE + "forge()\ntry:\n    open('/etc/passwd')\nexcept Exception:\n"
                                           "    pass\nos._exit(0)",
    "forge, then raise": _FORGE + "forge()\nraise ValueError('real failure')",
    "empty the denial record": _FORGE + "import sys\ntry:\n    open('/etc/passwd')\nexcept Exception:\n"
                                        "    pass\nfor value in sys._getframe(1).f_locals.values():\n"
                                        "    if isinstance(value, list):\n        value.clear()\nprint('fine')",
}


@pytest.mark.parametrize("attempt", list(FORGED))
def test_a_forged_report_does_not_hide_a_failure(hostile_box, attempt):
    result = hostile_box.run(FORGED[attempt])
    assert not result.ok, f"{attempt}: {result}"
    assert result.output != "forged", f"{attempt}: {result}"
    if attempt != "forge, then raise":
        assert result.error.startswith("PermissionError: sandbox: "), f"{attempt}: {result.error!r}"
    _assert_serves(hostile_box)


@pytest.mark.parametrize("category", list(HOSTILE))
def test_hostile_code_fails_alone_and_the_pool_keeps_serving(hostile_box, category):
    box = hostile_box
    code, expected = HOSTILE[category]
    zygotes = box.worker_pids()
    result = box.run(code)
    assert not result.ok, f"{category}: {result}"
    assert result.error.startswith(expected), f"{category}: {result.error!r}"
    assert result.error in result.observation()
    assert result.elapsed_s < FAST.timeout_s + 0.5
    # the host and its files are unharmed, and the same zygotes keep serving
    assert not Path("/tmp/copes_sandbox_escape.txt").exists()
    assert not Path("/tmp/copes_pwned").exists()
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
    time.sleep(0.1)
    results = box.run_many(["print('a')", "print('b')", "print('c')"])
    assert [r.output for r in results] == ["a\n", "b\n", "c\n"]
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


def test_the_verdict_comes_from_the_exit_status_not_the_report():
    from copes_lib.tools import sandbox as sbx

    settings = {"timeout_s": 1.0}
    exited = lambda code: code << 8  # noqa: E731 - a waitpid status for a normal exit with `code`
    forged_ok = (True, "", "forged")
    assert sbx._verdict(exited(sbx.FINISHED_EXIT), forged_ok, settings) == (True, "", "forged")
    ok, error, _ = sbx._verdict(exited(sbx.DENIED_EXIT), forged_ok, settings)
    assert not ok and error.startswith("PermissionError: sandbox:")
    ok, error, _ = sbx._verdict(exited(sbx.FAILED_EXIT), forged_ok, settings)
    assert not ok and error
    ok, error, _ = sbx._verdict(exited(sbx.FINISHED_EXIT), None, settings)
    assert not ok and error.startswith("SystemExit")
    ok, error, _ = sbx._verdict(signal.SIGKILL, None, settings)  # killed by a signal
    assert not ok and error.startswith("MemoryError")
