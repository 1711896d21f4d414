"""Example workers (``async-task-api-worker run examples.count_words:worker``)."""
