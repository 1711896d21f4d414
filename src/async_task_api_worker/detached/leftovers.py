"""What a killed process leaves in the state directory, found and cleaned by the sweep (issue 30).

- **Abandoned claims** (:func:`abandoned_claims`): a result or a marker claimed by a sweep or a
  worker that died before it was done with it; the sweep takes it over as soon as that process
  is known dead (``claims.abandoned``), and delivers or expires it as its own.
- **Temporary files** of a writer that died before its rename: removed once it is known dead.
  One of them may be a hand-out's staged input: before the marker (the commit), the work is not
  handed out and runs again; after it, the marker is concluded without it.
- **Inputs whose work is not handed out** (``state.handed_out``): a hand-out puts its input in
  place only after its marker, so such an input is a leftover (of a hand-out before issue 30,
  or a hand edit); a tick never takes it for a hand-out. Removed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from async_task_api_worker.detached.claims import CLAIMED, abandoned, claim
from async_task_api_worker.detached.state import INPUT_SUFFIX, Clocks, handed_out

__all__ = ["abandoned_claims", "drop_leftovers"]


def abandoned_claims(state_dir: Path, suffix: str, clocks: Clocks) -> list[Path]:
    """The files of ``suffix`` claimed by a process known dead (sorted by name)."""
    this_boot, now_s = clocks.this_boot(), clocks.wall()
    return [
        path
        for path in sorted(state_dir.glob(f"*{suffix}{CLAIMED}*"))
        if abandoned(path, this_boot=this_boot, now_s=now_s)
    ]


def drop_leftovers(state_dir: Path, clocks: Clocks) -> None:
    """Remove abandoned temporary files, and inputs whose work is not handed out."""
    for path in state_dir.glob(".*.tmp"):
        if abandoned(path, this_boot=clocks.this_boot(), now_s=clocks.wall()):
            path.unlink(missing_ok=True)
    for path in sorted(state_dir.glob(f"*{INPUT_SUFFIX}")):
        _drop_if_orphan(state_dir, path)
    for path in abandoned_claims(state_dir, INPUT_SUFFIX, clocks):
        _drop_if_orphan(state_dir, path)


def _drop_if_orphan(state_dir: Path, path: Path) -> None:
    """Remove an input (or an abandoned claim of one) whose work is not handed out.

    It is claimed first, then the test is made again: a hand-out that committed meanwhile gets
    back what was taken, unless it has put its own input in place since.
    """
    correlation_id = path.name.split(CLAIMED, 1)[0][: -len(INPUT_SUFFIX)]
    original = state_dir / f"{correlation_id}{INPUT_SUFFIX}"
    if path == original and handed_out(state_dir, correlation_id):
        return  # kept until the work's outcome is sent
    claimed = claim(path)
    if claimed is None:
        return
    if handed_out(state_dir, correlation_id):
        with contextlib.suppress(FileExistsError):
            os.link(claimed, original)
    claimed.unlink(missing_ok=True)
