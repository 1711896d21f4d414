"""Argument parsing and the mapping of errors to exit codes (0 ok, 1 failure, 2 usage)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from pydantic import SecretStr

from async_task_api_worker._version import __version__
from async_task_api_worker.errors import ConfigError
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.settings import SETTING_FLAGS, WorkerSettings

__all__ = ["main"]

PROG = "async-task-api-worker"

#: The shell's convention for a process ended by SIGINT (128 + 2).
INTERRUPTED = 130
#: The shell's convention for a process ended by SIGPIPE (128 + 13): its reader went away
#: (``... | head``). Python ignores SIGPIPE and raises BrokenPipeError instead.
CLOSED_STDOUT = 128 + signal.SIGPIPE
#: The operator's commands (``cli.commands.operate``).
OPERATOR_COMMANDS = frozenset({"inspect", "purge", "reports"})


def _add_setting_flags(
    parser: argparse.ArgumentParser, command: str, *, defaults: Mapping[str, str] | None = None
) -> None:
    """Add the flags of ``settings.SETTING_FLAGS`` that ``command`` takes.

    Each stores its text under its field's name, ``None`` when absent: pydantic validates it
    with the rest, so a bad one is the same one-line error as a bad variable.
    """
    for setting in SETTING_FLAGS:
        if command not in setting.commands:
            continue
        default = (defaults or {}).get(setting.field)
        if default is None:
            value = WorkerSettings.model_fields[setting.field].default
            # BROKER_URL's default (guest on localhost) is no secret: show it, not its mask.
            default = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        parser.add_argument(
            setting.flag,
            dest=setting.field,
            default=None,
            metavar=setting.metavar,
            help=f"{setting.help} (default: {setting.variable}, else {default})",
        )


def _setting_flags(arguments: argparse.Namespace) -> dict[str, str]:
    """The settings the command line gave, by field name: they win over the environment."""
    return {
        setting.field: value
        for setting in SETTING_FLAGS
        if (value := getattr(arguments, setting.field, None)) is not None
    }


def _add_operator_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``inspect``, ``purge`` and ``reports``: the operator's commands (docs/commands.md)."""
    inspect = commands.add_parser(
        "inspect",
        help="list a service's live workers and the tasks each runs now, asked over its control "
        "exchange; name the workers that do not answer in time",
    )
    inspect.add_argument("--service", required=True, help="the worker's service name")
    inspect.add_argument(
        "--timeout-s",
        type=float,
        default=2.0,
        help="how long the workers have to answer, seconds; the command's whole run is bounded "
        "by it (default 2)",
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
    inspect.add_argument(
        "--rabbitmqctl",
        default=None,
        metavar="COMMAND",
        help="the broker's rabbitmqctl, to name the consumers that did not answer (default: the "
        "one on PATH; empty: count them only)",
    )
    _add_setting_flags(inspect, "inspect")
    purge = commands.add_parser(
        "purge", help="delete every message waiting in a service's input queue (asks first)"
    )
    purge.add_argument("--service", required=True, help="the worker's service name")
    purge.add_argument("--yes", action="store_true", help="do not ask: purge at once")
    _add_setting_flags(purge, "purge")
    reports = commands.add_parser(
        "reports",
        help="print the reports waiting in a service's output queue, as JSON lines; CONSUMES "
        "them (the API will not see them)",
    )
    reports.add_argument("--service", required=True, help="the worker's service name")
    reports.add_argument(
        "--follow", action="store_true", help="keep printing reports as they arrive, until Ctrl-C"
    )
    _add_setting_flags(reports, "reports")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Run and try AsyncTaskAPI task workers."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run a worker until SIGTERM/SIGINT, on RabbitMQ or WORKER_TRANSPORT's transport "
        "(settings from the environment)",
    )
    run.add_argument("target", help="my_module:worker (a Worker, or a function returning one)")
    _add_setting_flags(run, "run")

    check = commands.add_parser(
        "check",
        help="check a worker's definition, settings and time budget; print the shutdown bound",
    )
    check.add_argument("target", help="my_module:worker")
    _add_setting_flags(check, "check")

    vectors = commands.add_parser(
        "vectors",
        help="copy the protocol's golden vectors, their manifest.json and the JSON Schemas "
        "(DIR/schemas/) into DIR, for another language's tests (docs/conformance.md)",
    )
    vectors.add_argument("dir", metavar="DIR", help="the folder to write (created if missing)")
    vectors.add_argument(
        "--force",
        action="store_true",
        help="write into DIR even if it is not empty (files of the same names are overwritten, "
        "nothing is deleted)",
    )

    dev = commands.add_parser(
        "dev",
        help="run a worker on the embedded in-memory broker, task inputs as JSON lines",
    )
    dev.add_argument("target", help="my_module:worker")
    dev.add_argument(
        "file", nargs="?", default="-", help="JSON lines of task inputs (default: stdin)"
    )
    dev.add_argument(
        "--reload",
        action="store_true",
        help="restart the worker when a .py file under the current directory or the worker's "
        "module changes (needs the reload extra: watchfiles); each restart gets the whole input",
    )
    _add_setting_flags(dev, "dev", defaults={"log_format": "text on a terminal, json otherwise"})

    tick = commands.add_parser(
        "tick",
        help="one budgeted tick: publish finished detached results, hand new tasks to "
        "detached workers (for cron jobs)",
    )
    tick.add_argument("target", help="my_module:worker")
    tick.add_argument("--state-dir", required=True, help="the detached workers' state directory")
    tick.add_argument("--budget-s", required=True, type=float, help="the tick's budget, seconds")
    tick.add_argument(
        "--max-new", type=int, default=1, help="new tasks to take in this tick (default 1)"
    )
    _add_setting_flags(tick, "tick")

    asyncapi = commands.add_parser(
        "asyncapi",
        help="print the worker's contract as an AsyncAPI 3.1 document (JSON): its RabbitMQ "
        "queues (IN_QUEUE_NAME / OUT_QUEUE_NAME), messages, schemas and error codes",
    )
    asyncapi.add_argument("target", help="my_module:worker")

    submit = commands.add_parser(
        "submit",
        help="publish tasks to a worker and print their reports until each task's last",
    )
    inputs = submit.add_mutually_exclusive_group(required=True)
    inputs.add_argument("input", nargs="?", help="the task input, a JSON object")
    inputs.add_argument(
        "--file",
        metavar="TASKS",
        help="publish one task a line of TASKS (JSON objects, blank lines skipped; -: stdin), "
        "every line checked before the first is published",
    )
    submit.add_argument("--service", required=True, help="the worker's service name")
    submit.add_argument("--client-id", default="cli", help="the envelope's client id")
    submit.add_argument(
        "--task-id", default=None, help="the task id (default: a new UUID; not with --file)"
    )
    submit.add_argument(
        "--input-ref",
        action="append",
        default=[],
        metavar="JSON",
        help='an input reference, e.g. \'{"name": "video", "uri": "s3://b/k"}\' (repeatable; '
        "not with --file)",
    )
    submit.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="give up (exit 1) after this many seconds without every terminal report",
    )
    _add_setting_flags(submit, "submit")
    cancel = commands.add_parser(
        "cancel",
        help="ask a service's workers to cancel a task (its control exchange, "
        "CONTROL_EXCHANGE_NAME); the task then concludes with failure TASK_CANCELLED",
    )
    cancel.add_argument("task_id", metavar="TASK_ID", help="the task to cancel")
    cancel.add_argument("--service", required=True, help="the worker's service name")
    cancel.add_argument("--client-id", default="cli", help="the cancel request's client id")
    _add_setting_flags(cancel, "cancel")
    _add_operator_commands(commands)
    conformance = commands.add_parser(
        "conformance",
        help="check a running worker service of any language against the protocol, through "
        "the broker (docs/conformance.md)",
    )
    conformance.add_argument("--service", required=True, help="the worker's service name")
    _add_setting_flags(conformance, "conformance")
    conformance.add_argument(
        "--only",
        default=None,
        metavar="CASES",
        help="run these cases only (comma-separated; an opt-in case too)",
    )
    conformance.add_argument(
        "--with",
        dest="with_cases",
        default=None,
        metavar="CASES",
        help="also run these opt-in cases (comma-separated: cancel)",
    )
    conformance.add_argument(
        "--strict", action="store_true", help="a skipped case fails the run (for CI)"
    )
    conformance.add_argument(
        "--junit-xml", default=None, metavar="PATH", help="also write the verdicts as JUnit XML"
    )
    conformance.add_argument(
        "--rabbitmqctl",
        default=None,
        metavar="COMMAND",
        help="the broker's rabbitmqctl, for the cases that set a policy (default: the one on "
        "PATH; empty: skip those cases)",
    )
    conformance.add_argument(
        "--timeout-s",
        type=float,
        default=30.0,
        help="the longest wait for a report, seconds (default 30)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code.

    A closed stdout (``check ... | head -2``) stops any command quietly with
    :data:`CLOSED_STDOUT`, as SIGPIPE would: the Python documentation's recipe (``signal``,
    "Note on SIGPIPE"). stdout is flushed here, where the error can be caught, not at the
    interpreter's exit, where it would only be printed.
    """
    try:
        code = _command(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return CLOSED_STDOUT
    return code


def _discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is left in its buffer goes there at exit."""
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # a stdout with no descriptor (replaced by a test)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)


def _command(argv: Sequence[str] | None) -> int:
    arguments = _parser().parse_args(argv)
    flags = _setting_flags(arguments)
    try:
        if arguments.command == "run":
            from async_task_api_worker.cli.commands.run import run_command

            return run_command(arguments.target, flags=flags)
        if arguments.command == "check":
            from async_task_api_worker.cli.commands.check import check_command

            return check_command(arguments.target, flags=flags)
        if arguments.command == "vectors":
            from async_task_api_worker.cli.commands.vectors import vectors_command

            return vectors_command(arguments.dir, force=arguments.force)
        if arguments.command == "tick":
            from async_task_api_worker.cli.commands.tick import tick_command

            return tick_command(
                arguments.target,
                state_dir=arguments.state_dir,
                budget_s=arguments.budget_s,
                max_new=arguments.max_new,
                flags=flags,
            )
        if arguments.command == "dev" and arguments.reload:
            from async_task_api_worker.cli.commands.reload import reload_command

            return reload_command(arguments.target, arguments.file, flags=flags)
        if arguments.command == "dev":
            from async_task_api_worker.cli.commands.dev import dev_command

            return dev_command(arguments.target, arguments.file, flags=flags)
        if arguments.command == "conformance":
            from async_task_api_worker.cli.commands.conformance import conformance_command

            return conformance_command(
                service=arguments.service,
                broker_url=flags.get("broker_url"),
                rabbitmqctl=arguments.rabbitmqctl,
                only=arguments.only,
                junit=arguments.junit_xml,
                timeout_s=arguments.timeout_s,
                opt_in=arguments.with_cases,
                strict=arguments.strict,
            )
        if arguments.command == "cancel":
            from async_task_api_worker.cli.commands.cancel import cancel_command

            return cancel_command(
                arguments.task_id,
                service=arguments.service,
                client_id=arguments.client_id,
                flags=flags,
            )
        if arguments.command in OPERATOR_COMMANDS:
            from async_task_api_worker.cli.commands.operate import operator_command

            return operator_command(arguments, flags=flags)
        if arguments.command == "asyncapi":
            from async_task_api_worker.cli.commands.asyncapi import asyncapi_command

            return asyncapi_command(arguments.target)
        from async_task_api_worker.cli.commands.submit import submit_command

        return submit_command(
            arguments.input,
            file=arguments.file,
            service=arguments.service,
            client_id=arguments.client_id,
            task_id=arguments.task_id,
            input_refs=arguments.input_ref,
            timeout_s=arguments.timeout_s,
            flags=flags,
        )
    except ConfigError as exc:
        say_error(exc)
        return ExitCode.CONFIG
    except KeyboardInterrupt:  # Ctrl-C outside a worker's own signal handling (submit)
        print(f"{PROG}: interrupted", file=sys.stderr)
        return INTERRUPTED
