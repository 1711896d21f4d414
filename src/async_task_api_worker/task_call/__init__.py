"""The task call: the handler's context, the call, and its conclusion, for every face.

One handler call is the same wherever it runs: on the event loop (the inline executor), in a
thread (the thread executor), in a process-isolated child, in a detached worker or in a Step
Functions child. Each of them calls the handler and concludes here, so that the same handler
raising the same exception is reported with the same code and message whatever face runs it
(docs/architecture.md, "The task call"):

- a return value is validated by the task's output model and dumped as JSON
  (``INVALID_RESULT`` when it fails);
- a well-formed ``FatalError`` or ``RetryableError`` gives its code and message;
- a deadline passed gives ``TASK_TIMEOUT``;
- an ``IsolatedTaskError`` (a child that died, a broken channel) gives its own code;
- anything else gives ``INTERNAL_ERROR``, its text never published: the log gets its type and
  frames (``observability.redaction``).

:mod:`.fields` holds who the call works for and its context, :mod:`.conclude` what it concludes
and the one wording of each end, :mod:`.call` the call under its deadline, :mod:`.error_hooks`
the worker's ``on_task_error`` hooks, told of an ``INTERNAL_ERROR``'s exception. The conclusion's
value types and their JSON shape are in :mod:`async_task_api_worker.conclusion`.
"""

from async_task_api_worker.task_call import call, conclude, error_hooks, fields
from async_task_api_worker.task_call.call import *  # noqa: F403 - the package is its parts
from async_task_api_worker.task_call.conclude import *  # noqa: F403
from async_task_api_worker.task_call.error_hooks import *  # noqa: F403
from async_task_api_worker.task_call.fields import *  # noqa: F403

__all__ = call.__all__ + conclude.__all__ + error_hooks.__all__ + fields.__all__
