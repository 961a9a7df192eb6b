"""A rank's script run as `python -u script.py ARGS` would run it, with one addition: a failure's own
word is kept where torchrun's failure report reads it.

An uncaught exception is printed and the process exits 1, as the interpreter does; `sys.exit("why")`
prints its message and exits 1 too, but leaves no traceback, so a report that looks for one finds
nothing to quote. Here the message is also written to torchrun's error file for the rank (where
torch's `@record` writes an exception), unless the script recorded one itself. A failing script's
process ends with its own code once its threads and exit handlers are done, without the
interpreter's teardown, where a gloo thread left in a collective would abort it (`_leave`).

Warm workers (trainflow/backends/warm/) run every rank this way in a forked interpreter. A node
whose ranks start as new interpreters (Slurm's, or the local backend without warm workers) gets the
same through its agent: `install()` makes torchrun start `python -u -m trainflow.backends.script_main
script.py ARGS` in place of `python -u script.py ARGS`.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

MODULE = "trainflow.backends.script_main"


def run_as_main(target: str, args: list[str], as_module: bool = False) -> None:
    """Run the script (or module) as `__main__` with `args`; returns only by SystemExit."""
    sys.argv = [target, *args]
    if as_module:
        sys.path[0] = os.getcwd()
        _run(lambda: runpy.run_module(target, run_name="__main__", alter_sys=True))
    else:
        sys.path[0] = str(Path(target).resolve().parent)
        _run(lambda: runpy.run_path(target, run_name="__main__"))


def _run(run_script) -> None:
    """An uncaught exception goes to sys.excepthook without this file's and runpy's frames, and
    the process exits 1, as a script run by `python` does; unless every rank recovers in place
    from it (trainflow/runtime/in_place.py), and the script runs again in this process."""
    while True:
        try:
            run_script()
            break
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                if exc.code:
                    _leave(exc.code)
                raise
            record_exit_message(str(exc.code))
            print(exc.code, file=sys.stderr)  # as the interpreter prints it
            _leave(1)
        except BaseException as exc:
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
                tb = tb.tb_next
            exc = exc.with_traceback(tb)
            if _recovered_in_place(exc):
                continue
            sys.excepthook(type(exc), exc, tb)
            if isinstance(exc, KeyboardInterrupt):
                sys.stdout.flush()
                sys.stderr.flush()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            _leave(1)
    sys.exit(0)


def _recovered_in_place(exc: BaseException) -> bool:
    """A runtime script's ranks may all go back to their memory copies instead of ending."""
    in_place = sys.modules.get("trainflow.runtime.in_place")
    if in_place is None or not in_place.recover(exc):
        return False
    in_place.forget_script_objects(exc)
    return True


def _leave(code: int) -> NoReturn:
    """A failing script's end, with the code it chose. As at any exit, its threads are waited for
    (a checkpoint still uploading) and its exit handlers run, but the interpreter is not torn down:
    a rank leaving while its peers are still in a collective leaves a gloo worker thread in it, and
    finalizing the interpreter under that thread aborts the process (SIGABRT), which would hide the
    code and the reason."""
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own first step at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code & 0xFF)  # as the interpreter ends with sys.exit(code)


def record_exit_message(message: str) -> None:
    """`sys.exit("why")` is the script's own word on its failure: written where torch's `@record`
    writes an exception (torchrun's error file for this rank), unless the script recorded one."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    try:
        with open(path, "x", encoding="utf-8") as file:
            extra = {"py_callstack": "", "timestamp": str(int(time.time()))}  # torch's reader needs both
            json.dump({"message": {"message": f"SystemExit: {message}", "extraInfo": extra}}, file)
    except OSError:
        pass  # the message is still on stderr


def wrapped(entrypoint: str, args: tuple) -> tuple:
    """torchrun's `python -u script.py ARGS` for a rank, as this module's; anything else as it is."""
    if entrypoint != sys.executable or len(args) < 2 or args[0] != "-u" or str(args[1]).startswith("-"):
        return args
    return ("-u", "-m", MODULE, *args[1:])


def install() -> None:
    """In a node's agent whose ranks start as new interpreters: each starts through this module."""
    from torch.distributed.elastic.multiprocessing import api, subprocess_handler

    if api.get_subprocess_handler is not subprocess_handler.get_subprocess_handler:
        return  # the warm workers' forking handler: they run each rank this way already
    make_handler = api.get_subprocess_handler

    def handler(entrypoint: str, args: tuple, *rest, **kwargs):
        return make_handler(entrypoint, wrapped(entrypoint, args), *rest, **kwargs)

    api.get_subprocess_handler = handler


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: python -m {MODULE} SCRIPT [ARGS...]")
    run_as_main(sys.argv[1], sys.argv[2:])
