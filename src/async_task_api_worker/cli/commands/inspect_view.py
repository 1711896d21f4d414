"""What ``inspect`` found, and how it prints it: a table for a person, or JSON for a script.

Who should have answered: each worker process is one consumer of the service's input queue,
so the queue's consumer count (a passive ``queue.declare``, plain AMQP) says how many did not
answer. Naming them needs the consumers' tags, which AMQP does not list: ``rabbitmqctl
list_consumers`` does, where it can be run; each worker's tag is ``atw/<host>/<pid>/<nonce>``
(``protocol.inspect.consumer_tag``), so a silent one is named by host and pid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from async_task_api_worker.protocol.inspect import InspectReply, tag_owner

__all__ = ["Inspected", "render_json", "render_table"]


@dataclass
class Inspected:
    """One ``inspect`` run: the replies, the input queue's consumers, and their tags if listed.

    Attributes:
        service: the service asked.
        queue: its input queue.
        timeout_s: the bound the workers had to answer in.
        consumers: the input queue's consumer count when asked.
        replies: the readable replies.
        unreadable: why each unreadable reply was not read.
        tags: the input queue's consumer tags (``rabbitmqctl``), or ``None``: not listed.
        tags_missing: why ``tags`` is ``None``.
    """

    service: str
    queue: str
    timeout_s: float
    consumers: int = 0
    replies: list[InspectReply] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    tags: list[str] | None = None
    tags_missing: str = ""

    @property
    def answered_tags(self) -> set[str]:
        """The consumer tags of the workers that answered."""
        return {reply.consumer_tag for reply in self.replies if reply.consumer_tag}

    @property
    def silent_tags(self) -> list[str] | None:
        """The listed consumers that did not answer; ``None`` when no listing can be trusted.

        A listing of another size than the broker's consumer count is not trusted: it may come
        from another broker's ``rabbitmqctl`` (the one on PATH), or consumers came and went.
        """
        if self.tags is None or len(self.tags) != self.consumers:
            return None
        answered = self.answered_tags
        return [tag for tag in self.tags if tag not in answered]

    @property
    def unnamed_because(self) -> str:
        """Why the silent consumers are not named (empty when they are)."""
        if self.tags is not None and len(self.tags) != self.consumers:
            return (
                f"rabbitmqctl listed {len(self.tags)} consumer(s) of {self.queue} where the "
                f"broker counted {self.consumers}: is it this broker's rabbitmqctl?"
            )
        return self.tags_missing

    @property
    def missing(self) -> int:
        """How many consumers of the input queue did not answer."""
        silent = self.silent_tags
        if silent is not None:
            return len(silent)
        return max(0, self.consumers - len(self.answered_tags))

    @property
    def all_answered(self) -> bool:
        """Whether every consumer answered (and every reply could be read)."""
        return self.missing == 0 and not self.unreadable


def _who(tag: str) -> str:
    owner = tag_owner(tag)
    if owner is None:
        # A worker of this SDK before ``inspect`` (its tag names no host), or another program.
        return f"a consumer whose tag names no host and pid (tag {tag})"
    return f"host {owner[0]} pid {owner[1]} (tag {tag})"


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def render_table(found: Inspected) -> str:
    """The text a person reads: a summary line, the workers grouped by host, the silent ones."""
    lines = [
        f"service {found.service}: {len(found.replies)} worker process(es) answered within "
        f"{found.timeout_s:g} s; {found.queue} has {found.consumers} consumer(s)"
    ]
    rows = [("HOST", "PID", "SDK", "CONCURRENCY", "UPTIME", "RUNNING")]
    details: list[list[str]] = []
    for reply in sorted(found.replies, key=lambda reply: (reply.host, reply.pid)):
        running = len(reply.tasks) + reply.tasks_left_out
        rows.append(
            (
                reply.host,
                str(reply.pid),
                reply.sdk.removeprefix("async-task-api-worker "),
                str(reply.concurrency),
                _seconds(reply.uptime_s),
                str(running) if reply.consumer_tag else f"{running} (not consuming)",
            )
        )
        details.append(
            [
                f"    task {task.task_id}  attempt {task.attempt}  "
                f"elapsed {_seconds(task.elapsed_s)}"
                for task in reply.tasks
            ]
            + ([f"    ... and {reply.tasks_left_out} more"] if reply.tasks_left_out else [])
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    previous_host = None
    for index, row in enumerate(rows):
        shown = ("", *row[1:]) if index and row[0] == previous_host else row
        previous_host = row[0] if index else None
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(shown, widths, strict=True)).rstrip()
        )
        if index:
            lines.extend(details[index - 1])
    lines.extend(_silence(found))
    return "\n".join(lines)


def _silence(found: Inspected) -> list[str]:
    lines = [f"unreadable reply: {why}" for why in found.unreadable]
    silent = found.silent_tags
    if silent is not None:
        lines.extend(f"NOT ANSWERING: {_who(tag)}" for tag in silent)
    elif found.missing:
        lines.append(
            f"NOT ANSWERING: {found.missing} consumer(s) of {found.queue}; they cannot be named "
            f"without their consumer tags ({found.unnamed_because}): list them with rabbitmqctl "
            f"list_consumers or the management UI, tags atw/<host>/<pid>/..."
        )
    return lines


def render_json(found: Inspected) -> str:
    """One JSON object: ``answered`` (the replies), ``not_answering`` and the counts."""
    silent = found.silent_tags
    document = {
        "service": found.service,
        "queue": found.queue,
        "timeout_s": found.timeout_s,
        "consumers": found.consumers,
        "answered": [reply.model_dump(mode="json") for reply in found.replies],
        "not_answering_count": found.missing,
        "not_answering": None
        if silent is None
        else [
            {
                "consumer_tag": tag,
                "host": owner[0] if owner else None,
                "pid": owner[1] if owner else None,
            }
            for tag in silent
            for owner in [tag_owner(tag)]
        ],
        "not_named_because": None if silent is not None else found.unnamed_because,
        "unreadable": found.unreadable,
    }
    return json.dumps(document, ensure_ascii=False)
