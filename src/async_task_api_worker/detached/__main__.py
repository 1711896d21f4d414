"""``python -m async_task_api_worker.detached ...``: a detached worker (see ``run.main``)."""

from async_task_api_worker.detached.run import main

if __name__ == "__main__":
    main()
