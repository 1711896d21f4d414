"""Peer frameworks doing the benchmark's workload, for comparison with our worker.

One module per peer; each defines ``publish(url, queue, count)`` (the framework's own producer
and envelope) and runs as a worker with ``python -m bench.peers.<name> [variant]``, reading
``BROKER_URL``, ``IN_QUEUE_NAME``, ``OUT_QUEUE_NAME`` and ``BENCH_DONE_FILE``. Every finished
task appends one line to ``BENCH_DONE_FILE`` (:func:`bench.peers._done.mark`). The peers need
the ``bench`` dependency group: ``uv sync --all-extras --group bench``.
"""
