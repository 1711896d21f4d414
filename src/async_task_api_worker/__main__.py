"""``python -m async_task_api_worker``: the command line."""

from async_task_api_worker.cli import main

raise SystemExit(main())
