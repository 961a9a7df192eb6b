"""A live progress line for the terminal: the watcher publishes, the CLI draws (when stderr is a
terminal). In-process only; the Prefect UI has its own progress artifact."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class Progress:
    step: int = 0
    total: int = 0
    attempt: int = 1
    loss: float | None = None
    started_at: float = 0.0
    first_step: int = 0

    def eta_s(self) -> float | None:
        done = self.step - self.first_step
        if done <= 0 or not self.total:
            return None
        return (time.time() - self.started_at) / done * (self.total - self.step)


_lock = threading.Lock()
_current = Progress()


def publish(step: int, total: int, attempt: int, loss: float | None) -> None:
    with _lock:
        # a new attempt, or a step behind the last one (another run in this process): a new rate
        if attempt != _current.attempt or not _current.started_at or step < _current.step:
            _current.attempt, _current.started_at, _current.first_step = attempt, time.time(), step
        _current.step, _current.total = step, total
        if loss is not None:
            _current.loss = loss


def current() -> Progress:
    with _lock:
        return Progress(**vars(_current))


def draw_while(running: threading.Event) -> None:
    """Redraw a rich progress bar on stderr until `running` is cleared."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    with Bar(
        TextColumn("attempt {task.fields[attempt]}"),
        BarColumn(),
        TextColumn("{task.fields[steps]}"),
        TextColumn("loss {task.fields[loss]}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("train", total=1, attempt=1, loss="-", steps=steps_text(current()))
        while running.is_set():
            now = current()
            loss = f"{now.loss:.4f}" if now.loss is not None else "-"
            bar.update(
                task, completed=now.step, total=max(now.total, 1), attempt=now.attempt, loss=loss, steps=steps_text(now)
            )
            time.sleep(0.25)


def steps_text(progress: Progress) -> str:
    """'step 20/60', or 'starting…' until the first step is reported (provisioning, image, launch)."""
    return f"step {progress.step}/{progress.total}" if progress.total else "starting…"
