"""A rank's script run through script_main is run as `python -u script.py ARGS` would run it, and a
`sys.exit("why")` message is kept in torchrun's error file for the rank."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from torch.distributed.elastic.multiprocessing import api, subprocess_handler

from trainflow.backends import script_main
from trainflow.backends.script_main import MODULE, wrapped
from trainflow.backends.torchrun_report import error_file_line

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    def main():
        print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "file": __file__}))
        if sys.argv[1:] == ["--give-up"]:
            sys.exit("train.py: ran out of data")
        if sys.argv[1:] == ["--raise"]:
            raise ValueError("a bad batch")
    if __name__ == "__main__":
        main()
    """
)


def run_through(tmp_path, *args: str, error_file=None) -> subprocess.CompletedProcess:
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    env = {"PATH": "/usr/bin:/bin", **({"TORCHELASTIC_ERROR_FILE": str(error_file)} if error_file else {})}
    return subprocess.run(
        [sys.executable, "-u", "-m", MODULE, str(script), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": ":".join(p for p in sys.path if p)},
        timeout=60,
    )


def test_the_script_sees_what_a_new_interpreter_would_show_it(tmp_path):
    done = run_through(tmp_path, "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    script = str(tmp_path / "code" / "train.py")
    assert seen == {
        "argv": [script, "--lr", "0.1"],
        "path0": str(tmp_path / "code"),
        "name": "__main__",
        "file": script,
    }


def test_an_exit_message_goes_to_the_error_file_and_an_exception_is_printed_without_our_frames(tmp_path):
    error_file = tmp_path / "run" / "attempt_0" / "0" / "error.json"
    error_file.parent.mkdir(parents=True)
    gave_up = run_through(tmp_path, "--give-up", error_file=error_file)
    assert gave_up.returncode == 1 and gave_up.stderr.strip().endswith("train.py: ran out of data"), gave_up.stderr
    assert error_file_line(tmp_path, 0) == "SystemExit: train.py: ran out of data"

    error_file.unlink()
    raised = run_through(tmp_path, "--raise", error_file=error_file)
    assert raised.returncode == 1 and raised.stderr.strip().endswith("ValueError: a bad batch"), raised.stderr
    assert "script_main" not in raised.stderr and "runpy" not in raised.stderr, raised.stderr
    assert not error_file.exists()  # an exception is the script's to record (torch's @record)


def test_torchrun_starts_a_ranks_script_through_it_and_nothing_else(monkeypatch):
    python = sys.executable
    assert wrapped(python, ("-u", "train.py", "--lr", "1")) == ("-u", "-m", MODULE, "train.py", "--lr", "1")
    assert wrapped(python, ("-u", "-m", "pkg.train")) == ("-u", "-m", "pkg.train")  # a module: as it is
    assert wrapped("/usr/bin/env", ("-u", "train.py")) == ("-u", "train.py")  # another program (--no-python)

    monkeypatch.setattr(api, "get_subprocess_handler", subprocess_handler.get_subprocess_handler)
    script_main.install()
    assert api.get_subprocess_handler is not subprocess_handler.get_subprocess_handler

    def forking(**kwargs):  # the warm workers' handler: they run each rank this way already
        raise AssertionError("not called")

    monkeypatch.setattr(api, "get_subprocess_handler", forking)
    script_main.install()
    assert api.get_subprocess_handler is forking


LEAVING = textwrap.dedent(
    """
    import atexit, concurrent.futures, sys, threading, time
    from pathlib import Path
    atexit.register(lambda: Path("atexit-ran").write_text("yes"))
    def upload():
        time.sleep(0.5)
        Path("upload-done").write_text("yes")
    threading.Thread(target=upload).start()  # a checkpoint still uploading as the script fails
    concurrent.futures.ThreadPoolExecutor(1).submit(time.sleep, 0.1)  # an idle pool, never shut down
    print("leaving with 3", end="")  # not flushed yet
    sys.exit(3)
    """
)


def test_a_failing_script_ends_with_its_own_code_after_its_threads_and_exit_handlers(tmp_path):
    """The end a failing rank gets without the interpreter's teardown (where gloo may abort it):
    what an interpreter's exit does first is still done, and the code is the script's."""
    script = tmp_path / "leaving.py"
    script.write_text(LEAVING)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-m", MODULE, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "leaving with 3"
    assert (tmp_path / "upload-done").exists() and (tmp_path / "atexit-ran").exists()
