"""The command-line flags that set a setting: one table for the parser, the errors and the docs.

A flag wins over its environment variable (``async_task_api_worker.settings``, which
re-exports these names); ``run --processes N`` hands the flags it was given on to its worker
processes (:func:`flag_arguments`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["SETTING_FLAGS", "SettingFlag", "flag_arguments", "named"]


@dataclass(frozen=True)
class SettingFlag:
    """A command-line flag that sets one setting, winning over its variable."""

    flag: str
    """The flag, ``--concurrency``."""
    field: str
    """The :class:`WorkerSettings` field it sets, ``worker_concurrency``."""
    metavar: str
    """The value's name in the help, ``N``."""
    help: str
    """What it sets, for the help."""
    commands: tuple[str, ...] = ("run", "dev", "check", "tick")
    """The commands that take it: those on which the setting means something."""

    @property
    def variable(self) -> str:
        """The environment variable it overrides, ``WORKER_CONCURRENCY``."""
        return self.field.upper()


#: The settings people change by hand, as flags of ``run``, ``dev``, ``check`` and ``tick``
#: (``--broker-url`` also of every command that connects), each on the commands where it means
#: something (``dev`` connects to nothing; ``dev`` and ``tick`` serve no probes and run one
#: process; ``tick`` takes one delivery at a time). The one table: the parser adds these, an
#: error names the flag with its variable, docs/settings.md's table has them.
SETTING_FLAGS: Final = (
    SettingFlag(
        "--broker-url",
        "broker_url",
        "URL",
        "the broker's AMQP URL, or several separated by commas (a password here is seen by "
        "anyone who lists processes: prefer BROKER_URL for one)",
        (
            "run",
            "check",
            "tick",
            "submit",
            "cancel",
            "conformance",
            "inspect",
            "purge",
            "reports",
        ),
    ),
    SettingFlag(
        "--processes",
        "worker_processes",
        "N",
        "worker processes, each with its own broker connection, under a supervisor when above 1",
        ("run", "check"),
    ),
    SettingFlag(
        "--concurrency", "worker_concurrency", "N", "tasks run at once", ("run", "dev", "check")
    ),
    SettingFlag("--log-level", "log_level", "LEVEL", "DEBUG, INFO, WARNING, ERROR or CRITICAL"),
    SettingFlag("--log-format", "log_format", "FORMAT", "json or text"),
    SettingFlag(
        "--health-port",
        "health_check_port",
        "PORT",
        "port of the probes server, 0 for a free one",
        ("run", "check"),
    ),
)
_FLAG_OF: Final = {flag.variable: flag.flag for flag in SETTING_FLAGS}
_FIELD_FLAG: Final = {flag.field: flag.flag for flag in SETTING_FLAGS}


def named(variable: str) -> str:
    """``WORKER_PROCESSES (--processes)``: a variable with the flag that may have set it."""
    return f"{variable} ({_FLAG_OF[variable]})" if variable in _FLAG_OF else variable


def flag_arguments(values: Mapping[str, Any]) -> list[str]:
    """The command-line flags that give ``values`` (field names, as the parser collects them).

    Returns:
        ``["--concurrency", "4", ...]``, in :data:`SETTING_FLAGS`' order.

    Raises:
        KeyError: a field has no flag.
    """
    unknown = set(values) - set(_FIELD_FLAG)
    if unknown:
        raise KeyError(f"no flag sets {sorted(unknown)}")
    return [
        part
        for flag in SETTING_FLAGS
        if flag.field in values
        for part in (flag.flag, str(values[flag.field]))
    ]
