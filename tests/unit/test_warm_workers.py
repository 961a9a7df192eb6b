"""A node's zygote (backends/warm): a forked rank runs its script as `python -u script ARGS` would,
with its own argv, environment, directory, stdio, exit status and random seeds; commands it cannot
fork are refused; its end ends its children; a module that starts a thread makes it unfit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainflow.backends.warm.child import WORKER, NotForkable
from trainflow.backends.warm.client import ZygoteChannel
from trainflow.backends.warm.preload import modules_to_preload, script_imports

SCRIPT = """
import json, os, random, sys
import numpy
record = {"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0], "cwd": os.getcwd(),
          "env": dict(os.environ), "random": random.random(), "numpy": float(numpy.random.random())}
print(json.dumps(record))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("the script's own error")
sys.exit(int(sys.argv[1]))
"""


def start_zygote(preload: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, ZygoteChannel]:
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainflow.backends.warm.zygote",
            "--channel-fd",
            str(theirs.fileno()),
            "--stop-grace-s",
            "5",
            "--preload",
            *preload,
        ],
        pass_fds=[theirs.fileno()],
        env=env,
        start_new_session=True,
    )
    theirs.close()
    return process, ZygoteChannel(ours)


@pytest.fixture
def zygote():
    process, channel = start_zygote(["numpy", "json"])
    assert channel.wait_ready(120) is not None
    yield channel
    channel.close()
    process.wait(30)


def run_forked(channel: ZygoteChannel, script: Path, arg: str, tmp_path: Path) -> tuple[int, dict, str]:
    out, err = tmp_path / f"out-{arg}", tmp_path / f"err-{arg}"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        env = {"PATH": os.environ["PATH"], "ONLY_THIS": arg}
        child = channel.fork(
            WORKER, [sys.executable, "-u", str(script), arg], env, str(tmp_path), [0, stdout.fileno(), stderr.fileno()]
        )
        code = child.wait(60)
    return code, json.loads(out.read_text().splitlines()[0]), err.read_text()


def test_a_forked_rank_runs_its_script_as_a_new_interpreter_would(zygote, tmp_path):
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    code, seen, stderr = run_forked(zygote, script, "3", tmp_path)
    assert code == 3
    assert seen["argv"] == [str(script), "3"] and seen["name"] == "__main__" and seen["file"] == str(script)
    assert seen["path0"] == str(script.parent.resolve()) and seen["cwd"] == str(tmp_path)
    assert seen["env"] == {"PATH": os.environ["PATH"], "ONLY_THIS": "3"}  # the request's, nothing of the zygote's
    assert stderr == "to stderr\n"
    code, again, _ = run_forked(zygote, script, "0", tmp_path)
    assert code == 0
    # each fork draws its own seeds, as a new interpreter does
    assert (again["random"], again["numpy"]) != (seen["random"], seen["numpy"])


def test_an_uncaught_exception_exits_1_with_the_scripts_own_traceback(zygote, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code, _, stderr = run_forked(zygote, script, "raise", tmp_path)
    assert code == 1
    lines = stderr.splitlines()
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[2].startswith(f'  File "{script}"')  # no frame of the zygote's or runpy's before it
    assert lines[-1] == "ValueError: the script's own error"


def test_a_signal_ends_a_forked_rank_with_that_signal(zygote, tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    with open(tmp_path / "out", "w") as out:
        child = zygote.fork(WORKER, [sys.executable, "-u", str(script)], {}, str(tmp_path), [0, out.fileno(), 2])
    assert os.getsid(child.pid) == child.pid  # a session of its own, as torchrun gives each rank
    while (tmp_path / "out").read_text() != "up\n":
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL


def test_commands_it_cannot_fork_are_refused(zygote, tmp_path):
    with pytest.raises(NotForkable, match="not this interpreter"):
        zygote.fork(WORKER, ["/bin/true"], {}, str(tmp_path), [0, 1, 2])
    with pytest.raises(NotForkable, match="interpreter options"):
        zygote.fork(WORKER, [sys.executable, "-X", "dev", "x.py"], {}, str(tmp_path), [0, 1, 2])


def test_closing_its_channel_ends_its_children_and_then_itself(tmp_path):
    process, channel = start_zygote([])
    assert channel.wait_ready(60) is not None
    script = tmp_path / "wait.py"
    script.write_text(
        textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM", flush=True), sys.exit(7)))
        print("up", flush=True)
        time.sleep(60)
    """)
    )
    with open(tmp_path / "out", "w") as out:
        child = channel.fork(WORKER, [sys.executable, "-u", str(script)], {}, str(tmp_path), [0, out.fileno(), 2])
    while "up" not in (tmp_path / "out").read_text():
        time.sleep(0.05)
    channel.close()  # as when the orchestrator dies: the child gets SIGTERM, then the zygote leaves
    assert process.wait(30) == 0
    assert (tmp_path / "out").read_text() == "up\nSIGTERM\n"
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)


def test_a_module_that_starts_a_thread_makes_it_unfit(tmp_path):
    (tmp_path / "threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    )
    process, channel = start_zygote(["threaded"], env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert channel.wait_ready(60) is None
    assert channel.ready["op"] == "unfit" and "threaded" in channel.ready["reason"]
    assert process.wait(30) == 0


def test_the_scripts_leading_installed_imports_are_preloaded_and_its_own_modules_are_not(tmp_path):
    (tmp_path / "helpers.py").write_text("")
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        import json, helpers
        from numpy import linalg
        try:
            import yaml
        except ImportError:
            yaml = None
        import os
        os.environ["SOME_LIBRARY_SETTING"] = "1"  # what follows may read it at import
        import decimal
        def main():
            import csv
    """)
    )
    assert script_imports(script) == ["json", "helpers", "numpy", "yaml", "os"]
    modules = modules_to_preload(str(script), ["fractions"], uses_runtime=True, cwd=tmp_path)
    assert {"json", "numpy", "yaml", "fractions", "torch", "trainflow.runtime"} <= set(modules)
    assert not {"helpers", "decimal", "csv"} & set(modules)
    plain = modules_to_preload(str(script), [], uses_runtime=False, cwd=tmp_path)
    assert "trainflow.runtime" not in plain and "torch.distributed.run" in plain


def test_a_clone_serves_on_its_own_channel_and_log_with_the_imports_done(zygote, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with open(tmp_path / "clone.log", "w") as log:
        channel, clone = zygote.clone(log.fileno())
    ready = channel.wait_ready(60)
    assert ready is not None and ready["imported"] == ["numpy", "json"] and ready["import_s"] == 0.0
    assert os.getsid(clone.pid) == clone.pid and clone.poll() is None
    code, seen, stderr = run_forked(channel, script, "4", tmp_path)  # a rank forked by the clone
    assert code == 4 and seen["argv"] == [str(script), "4"] and stderr == "to stderr\n"
    channel.close()  # its own channel ending ends the clone, not its source
    assert clone.wait(30) == 0
    code, _, _ = run_forked(zygote, script, "0", tmp_path)
    assert code == 0


def test_a_clone_can_be_cloned_in_turn(zygote, tmp_path):
    with open(tmp_path / "clone.log", "w") as log:
        channel, clone = zygote.clone(log.fileno())
    assert channel.wait_ready(60) is not None
    with open(tmp_path / "again.log", "w") as log:
        grandchild_channel, grandchild = channel.clone(log.fileno())
    assert grandchild_channel.wait_ready(60) is not None
    grandchild_channel.close()
    assert grandchild.wait(30) == 0
    channel.close()
    assert clone.wait(30) == 0


def test_ending_the_source_ends_its_clones(tmp_path):
    process, channel = start_zygote([])
    assert channel.wait_ready(60) is not None
    with open(tmp_path / "clone.log", "w") as log:
        clone_channel, clone = channel.clone(log.fileno())
    assert clone_channel.wait_ready(60) is not None
    channel.close()  # release ends every zygote at once; the source's end reaches its clones too
    assert process.wait(30) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(clone.pid, 0)
    clone_channel.close()


DDP_AFTER_PRELOAD = """
import importlib, json, pathlib, sys
from trainflow.backends.warm.preload import modules_to_preload
for name in modules_to_preload(sys.argv[1], [], uses_runtime=False, cwd=pathlib.Path.cwd()):
    importlib.import_module(name)
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
before = set(sys.modules)
model = DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(3, 4)).sum().backward()
print(json.dumps(sorted(set(sys.modules) - before)))
dist.destroy_process_group()
"""


def test_the_preload_leaves_torch_dynamo_to_the_rank(tmp_path):
    """A rank forked from a process that imported torch._dynamo deadlocks at exit far more often in
    torch 2.13 (docs/warm-workers.md), so the rank imports it itself, as DDP's constructor does:
    neither the preload nor anything it imports brings it in."""
    from trainflow.backends.ports import free_port

    script = tmp_path / "plain.py"
    script.write_text("import torch\nimport torch.distributed as dist\n")
    result = subprocess.run(
        [sys.executable, "-c", DDP_AFTER_PRELOAD, str(script), str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported_late = json.loads(result.stdout.strip().splitlines()[-1])
    assert "torch._dynamo" in imported_late


def test_a_scripts_exit_message_is_recorded_in_torchruns_error_file_as_record_would(tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from trainflow.backends.torchrun_report import error_file_line

    error_file = tmp_path / "run" / "attempt_0" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)

    def ends(code: str) -> subprocess.CompletedProcess:
        """A forked worker's script ending: `_run` ends the process itself, with the script's code."""
        source = f"import sys\nfrom trainflow.backends.script_main import _run\n_run(lambda: sys.exit({code}))\n"
        env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
        return subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=60)

    gave_up = ends('"train.py: ran out of data"')
    assert gave_up.returncode == 1 and gave_up.stderr.strip() == "train.py: ran out of data", gave_up.stderr
    assert error_file_line(tmp_path, 0) == "SystemExit: train.py: ran out of data"
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(error_file))  # as torchrun reads it
    assert failure.message["message"] == "SystemExit: train.py: ran out of data" and failure.timestamp > 0

    error_file.unlink()
    assert ends("3").returncode == 3  # a bare exit code says nothing more than the code
    assert not error_file.exists()


def test_closing_a_rank_the_zygote_already_reaped_closes_its_streams_and_does_not_raise(tmp_path):
    # torchrun polls the rank's stand-in, finds it running, and signals its process group: between
    # the two the zygote may have reaped it, and no process is left to signal
    from trainflow.backends.warm.torchrun_hook import ForkingSubprocessHandler

    gone = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    gone.wait(timeout=60)
    handler = ForkingSubprocessHandler.__new__(ForkingSubprocessHandler)
    handler.proc = gone
    handler._stdout, handler._stderr = open(tmp_path / "out", "w"), open(tmp_path / "err", "w")  # noqa: SIM115
    handler.close(signal.SIGTERM)
    assert handler._stdout.closed and handler._stderr.closed


SPARE_SCRIPT = """
import json, os, sys
print(json.dumps({"dynamo_imported": "torch._dynamo" in sys.modules, "env": dict(os.environ), "pid": os.getpid()}))
sys.exit(int(sys.argv[1]))
"""


def test_a_job_that_replaces_ranks_in_place_gets_its_next_rank_from_a_spare_with_torch_dynamo_imported(tmp_path):
    import psutil

    from trainflow.worker_config import MEMORY_COPIES_ENV

    process, channel = start_zygote(["json"])
    assert channel.wait_ready(120) is not None
    script = tmp_path / "train.py"
    script.write_text(SPARE_SCRIPT)
    env = {"PATH": os.environ["PATH"], MEMORY_COPIES_ENV: str(tmp_path)}
    seen = []
    for code in (3, 4):
        with open(tmp_path / f"out-{code}", "w") as out:
            child = channel.fork(
                WORKER, [sys.executable, "-u", str(script), str(code)], env, str(tmp_path), [0, out.fileno(), 2]
            )
            assert child.wait(120) == code
        seen.append(json.loads((tmp_path / f"out-{code}").read_text()))
    cold, spare = seen
    assert not cold["dynamo_imported"] and spare["dynamo_imported"]
    assert spare["env"] == env and spare["pid"] == child.pid
    waiting = psutil.Process(process.pid).children()  # the next spare
    assert len(waiting) == 1
    channel.close()
    assert process.wait(30) == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in waiting)


def test_a_job_without_in_place_replacement_gets_no_spare(tmp_path):
    import psutil

    process, channel = start_zygote(["json"])
    assert channel.wait_ready(120) is not None
    script = tmp_path / "train.py"
    script.write_text(SPARE_SCRIPT)
    with open(tmp_path / "out", "w") as out:
        child = channel.fork(WORKER, [sys.executable, "-u", str(script), "0"], {}, str(tmp_path), [0, out.fileno(), 2])
        assert child.wait(60) == 0
    assert psutil.Process(process.pid).children() == []
    channel.close()
    assert process.wait(30) == 0
