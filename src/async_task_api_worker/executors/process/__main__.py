"""``python -m async_task_api_worker.executors.process forkserver FD | child ARGS``.

The entry points of the fork server and of a freshly spawned task process. They live here, not
in their own modules, so that ``-m`` never runs a module the package has already imported.
"""

from __future__ import annotations

import sys

from async_task_api_worker.executors.process import child, forkserver

if __name__ == "__main__":
    role, *arguments = sys.argv[1:]
    if role == "forkserver":
        forkserver.main(arguments)
    else:
        child.main(arguments)
