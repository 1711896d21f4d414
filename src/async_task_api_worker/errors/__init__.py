"""The SDK's exceptions, all rooted at :class:`AsyncTaskWorkerError`.

The tree::

    AsyncTaskWorkerError
    ├── TaskError                  raised by handlers on purpose; carries a protocol code
    │   ├── FatalError             conclude the task now with this code
    │   └── RetryableError         requeue and try again, up to the delivery limit
    ├── TaskTimeoutError           the handler ran past its timeout (code TASK_TIMEOUT)
    ├── TaskCancelledError         the task's client cancelled it (code TASK_CANCELLED)
    ├── IsolatedTaskError          a task's child process crashed or left no valid result
    ├── RemoteHandlerError         a handler raised in its child process (INTERNAL_ERROR)
    ├── ProtocolError              bytes that do not follow docs/protocol.md
    │   ├── EnvelopeDecodeError    an inbound body that is not a valid envelope (a poison message)
    │   ├── CancelDecodeError      a control message that is not a valid cancel request
    │   └── ReportEncodeError      a report that cannot be encoded (too large, not JSON)
    ├── TransportError             a broker operation failed (mapped from the client library)
    │   ├── PublishError           a report was not confirmed by the broker
    │   │   └── MessageTooLargeError   the broker refused it for its size, for good
    │   ├── SettleError            an ack, requeue or reject did not reach the broker
    │   └── BrokerUnavailableError the broker could not be reached in time
    └── ConfigError (ValueError)   misuse and configuration, kept apart from runtime failures
        ├── SettingsError          an invalid setting (the CLI exits 2)
        │   └── TimeBudgetError    the task timeout does not fit under the consumer timeout
        ├── BrokerRefusedError     the broker refused the credentials, vhost or a queue (exit 2)
        │   └── BrokerTLSError     an untrusted or mismatched certificate, a refused client one
        ├── TargetError            ``module:attribute`` does not name a loadable Worker
        ├── InvalidErrorCodeError  a FatalError / RetryableError code outside the code rule
        └── DefinitionError (TypeError)   a mistake in a Worker definition
            ├── InvalidWorkerNameError
            ├── DuplicateTaskError
            ├── NoTaskError
            ├── InvalidTimeoutError
            ├── HandlerSignatureError
            │   ├── HandlerKindError
            │   ├── ContextParameterError
            │   ├── InputModelError
            │   └── OutputModelError
            ├── IsolationError
            ├── ErrorDeclarationError
            ├── HookNotAsyncError
            └── InvalidProbeNameError

Every class has a class-level ``code`` (from the protocol's error-code table, see
``protocol.codes``) and ``retryable``; instances of :class:`TaskError` carry their own code.
The tree lives in four modules, one branch each: ``root``, ``task`` (how a task fails),
``wire`` (the protocol and the broker) and ``config`` (misuse); import every name from here.
"""

from __future__ import annotations

from async_task_api_worker.errors.config import (
    BrokerRefusedError,
    BrokerTLSError,
    ConfigError,
    ContextParameterError,
    DefinitionError,
    DuplicateTaskError,
    ErrorDeclarationError,
    HandlerKindError,
    HandlerSignatureError,
    HookNotAsyncError,
    InputModelError,
    InvalidErrorCodeError,
    InvalidProbeNameError,
    InvalidTimeoutError,
    InvalidWorkerNameError,
    IsolationError,
    NoTaskError,
    OutputModelError,
    SettingsError,
    TargetError,
    TimeBudgetError,
)
from async_task_api_worker.errors.root import AsyncTaskWorkerError
from async_task_api_worker.errors.wire import (
    BrokerUnavailableError,
    CancelDecodeError,
    EnvelopeDecodeError,
    MessageTooLargeError,
    ProtocolError,
    PublishError,
    ReportEncodeError,
    ReportRefusedError,
    SettleError,
    TransportError,
)

# isort: split
# Imported last: the task errors use the protocol's code rule (protocol.codes), and the protocol
# package, imported on the way, takes the wire's exceptions from this package.
from async_task_api_worker.errors.task import (
    FatalError,
    IsolatedTaskError,
    RemoteHandlerError,
    RetryableError,
    TaskCancelledError,
    TaskError,
    TaskTimeoutError,
)
from async_task_api_worker.errors.task import (
    is_well_formed as is_well_formed,  # the task call's, not in __all__
)

__all__ = [
    "AsyncTaskWorkerError",
    "BrokerRefusedError",
    "BrokerTLSError",
    "BrokerUnavailableError",
    "CancelDecodeError",
    "ConfigError",
    "ContextParameterError",
    "DefinitionError",
    "DuplicateTaskError",
    "EnvelopeDecodeError",
    "ErrorDeclarationError",
    "FatalError",
    "HandlerKindError",
    "HandlerSignatureError",
    "HookNotAsyncError",
    "InputModelError",
    "InvalidErrorCodeError",
    "InvalidProbeNameError",
    "InvalidTimeoutError",
    "InvalidWorkerNameError",
    "IsolatedTaskError",
    "IsolationError",
    "MessageTooLargeError",
    "NoTaskError",
    "OutputModelError",
    "ProtocolError",
    "PublishError",
    "RemoteHandlerError",
    "ReportEncodeError",
    "ReportRefusedError",
    "RetryableError",
    "SettingsError",
    "SettleError",
    "TargetError",
    "TaskCancelledError",
    "TaskError",
    "TaskTimeoutError",
    "TimeBudgetError",
    "TransportError",
]

# Each class keeps the one name it is imported and logged by (``errors.FatalError``), whichever
# module of the package defines it.
for _class in (globals()[name] for name in __all__):
    _class.__module__ = __name__
del _class
