"""A module whose import fails with a broker URL, password and all, in the exception's text."""

raise RuntimeError("cannot reach amqp://worker:CANARY-hunter2@broker:5672/")
