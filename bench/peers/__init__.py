"""Peer frameworks doing the benchmark's workload, for comparison with our worker.

One module per peer; each defines ``publish(url, queue, count)`` (the framework's own producer
and envelope) and runs as a worker with ``python -m bench.peers.<name> [variant]``, reading
``BROKER_URL``, ``IN_QUEUE_NAME``, ``OUT_QUEUE_NAME`` and ``BENCH_DONE_FILE`` (and
``BENCH_QUEUE_TYPE``, ``BENCH_REDIS_URL``, ``BENCH_RUN_ID``, which the bench sets). Every
finished task appends one line to ``BENCH_DONE_FILE`` (:func:`bench.peers._done.mark`): after
its result is stored, for the variants with a result backend on Redis; not at all for Celery's
``rpc://`` variants, which the bench times by their result messages. Each task also calls
:func:`bench.peers._done.mark_start` (for ``bench.cold_start``). The modules that a framework's
own CLI can run with several processes also define the factory that the CLI imports
(``cli_setup``, ``cli_broker``, ``cli_app``). The peers need the ``bench`` dependency group:
``uv sync --all-extras --group bench``.
"""
