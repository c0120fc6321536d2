"""What ``oar`` shows while it works, drawn with ``rich``: one live table for many runs (``oar compare``, the warm
start included), and one step line for a single loop (``oar train``, ``oar eval``).

A run reports progress as plain dicts (``{"run": name, "step": ..., "done": ..., "accuracy": ...}``), so a worker
process can send them through a queue; :class:`RunTable` folds them into its rows. Imports only ``rich``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def format_duration(seconds: float | None) -> str:
    """``75`` -> ``"1:15"``, ``3725`` -> ``"1:02:05"``; ``None`` -> ``"–"``."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "–"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass
class RunRow:
    """One line of the live table.

    ``done``: share of the run's budget used, 0..1; ``accuracy``: latest held-out accuracy (0..1);
    ``s_per_step``: training seconds per update; ``note``: a short free text (e.g. the SFT loss).
    """

    name: str
    status: str = "queued"  # queued | starting | running | done | cached | failed
    step: int = 0
    total: int | None = None  # steps, when the run counts steps rather than seconds
    done: float = 0.0
    accuracy: float | None = None
    s_per_step: float | None = None
    note: str = ""
    started: float | None = None  # time.monotonic() at the first report
    ended: float | None = None


@dataclass
class RunTable:
    """Live state of a set of runs, ``workers`` at a time; renders as a ``rich`` table with an overall ETA.

    ``before``/``after``: stages drawn above/below the runs (the warm start, the report), not counted in the
    ETA. ``update(run=name, **fields)`` takes one progress report; an unknown name adds a stage at the end.
    """

    names: list[str]
    workers: int = 1
    title: str = ""
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    rows: dict[str, RunRow] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        for name in (*self.before, *self.names, *self.after):
            self.rows.setdefault(name, RunRow(name))

    def update(self, run: str, **fields) -> None:
        row = self.rows.setdefault(run, RunRow(run))
        now = time.monotonic()
        if row.started is None and fields.get("status", "running") == "running":
            row.started = now
        if row.status in ("queued", "starting") and "status" not in fields:
            row.status = "running"
        for key, value in fields.items():
            setattr(row, key, value)
        if row.status in ("done", "cached", "failed"):
            row.ended = row.ended or now
            if row.status != "failed":
                row.done = 1.0

    def eta_s(self) -> float | None:
        """Seconds until every run has ended: the work left (each unfinished run projected from the runs seen so
        far, measured in wall seconds) spread over ``workers``; None before any run has used 5% of its budget."""
        now = time.monotonic()
        runs = [self.rows[n] for n in self.names]  # the runs, not the stages before them (the warm start)
        lengths = [r.ended - r.started for r in runs if r.status == "done" and r.started is not None]
        lengths += [(now - r.started) / r.done for r in runs if r.status == "running" and r.started is not None
                    and r.done >= 0.05]
        if not lengths:
            return None
        length = sum(lengths) / len(lengths)
        left = 0.0
        for r in runs:
            if r.status in ("queued", "starting"):
                left += length
            elif r.status == "running" and r.started is not None:
                projected = (now - r.started) / r.done if r.done >= 0.05 else length
                left += max(projected - (now - r.started), 0.0)
        return left / max(1, min(self.workers, sum(r.status in ("queued", "starting", "running") for r in runs)))

    def __rich__(self):
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self.title or None, title_justify="left", box=None, pad_edge=False, expand=False)
        # fixed columns keep their width; the free-text note is the one that shrinks on a narrow terminal
        width = max(map(len, self.rows), default=3)
        for name, justify, min_width in (("run", "left", width), ("", "left", 8), ("step", "right", 5),
                                         ("budget", "right", 13), ("accuracy", "right", 8), ("s/step", "right", 6)):
            table.add_column(name, justify=justify, no_wrap=True, min_width=min_width)
        table.add_column("", overflow="ellipsis", no_wrap=False)
        for r in self.rows.values():
            step = f"{r.step}/{r.total}" if r.total else (str(r.step) if r.step else "")
            table.add_row(
                r.name, _STATUS.get(r.status, r.status), step,
                _bar(r.done) if r.status != "queued" and (r.total or r.name in self.names) else "",
                f"{100 * r.accuracy:.1f}%" if r.accuracy is not None else "",
                f"{r.s_per_step:.2f}" if r.s_per_step else "", Text(r.note, no_wrap=True, overflow="ellipsis"),
            )
        eta = self.eta_s()
        ended = sum(self.rows[n].status in ("done", "cached") for n in self.names)
        table.caption = (f"{ended}/{len(self.names)} runs done · elapsed {format_duration(time.monotonic() - self.t0)}"
                         + (f" · ETA {format_duration(eta)}" if eta is not None and ended < len(self.names) else ""))
        table.caption_justify = "left"
        return table


_STATUS = {"queued": "[dim]queued[/]", "starting": "[yellow]starting[/]", "running": "[yellow]running[/]",
           "done": "[green]done[/]", "cached": "[green]cached[/]", "failed": "[red]failed[/]"}


def _bar(done: float, width: int = 8) -> str:
    done = min(max(done, 0.0), 1.0)
    full = int(done * width)
    return "█" * full + "░" * (width - full) + f" {100 * done:3.0f}%"


class ProgressLines:
    """Live step lines drawn together, one per name: ``name  done/total  bar  fields  elapsed  ETA``
    (the warm start; ``oar eval``, one line per benchmark with its running accuracy; ``oar train``).

    ``advance(name, n, **fields)`` moves a line on and sets its shown fields (e.g. ``acc="52.3%"``);
    ``close()`` leaves the last state printed. A no-op when ``enabled`` is False.
    """

    def __init__(self, totals: dict[str, int | None], enabled: bool = True) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from rich import progress as rp

        self._progress = rp.Progress(
            rp.TextColumn("{task.description}"), rp.MofNCompleteColumn(), rp.BarColumn(bar_width=20),
            rp.TextColumn("{task.fields[info]}"), rp.TimeElapsedColumn(), rp.TextColumn("ETA"),
            rp.TimeRemainingColumn(), transient=False)
        width = max(map(len, totals), default=0)
        self._tasks = {name: self._progress.add_task(name.ljust(width), total=total, info="", start=False)
                       for name, total in totals.items()}
        self._progress.start()

    def advance(self, name: str, n: int = 1, **fields) -> None:
        if not self.enabled:
            return
        task = self._tasks[name]
        self._progress.start_task(task)  # the clock of a line starts with its first step
        self._progress.update(task, advance=n, info="  ".join(f"{k} {v}" for k, v in fields.items()))

    def close(self) -> None:
        if self.enabled:
            self._progress.stop()
            self.enabled = False
