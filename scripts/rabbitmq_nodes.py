"""RabbitMQ nodes of the tests' own: 3.10 (the machine's), 4.0 (Debian 13) and 4.3 (Debian sid).

4.0 and 4.3 run chrooted, each in a Debian root of its own.

Each node gets its own node name, AMQP port, distribution port, data and log directories,
``rabbitmq.conf``, ``advanced.config`` and an enabled-plugins file holding ``[].`` (no management
listener, so nothing clashes with the machine's broker on 127.0.0.1:5672, which this module never
touches). The broker listens on ``127.0.0.1:PORT`` only, with ``loopback_users = none`` so that
``guest`` may log in.

Usage as a command (stdlib only; ``uv run --locked python`` or the system ``python3``)::

    python scripts/rabbitmq_nodes.py root [--version 4.3] [--dir D]  # Debian root of 4.0 / 4.3
    # start prints URL=... and RABBITMQCTL=... (shell-quoted) for eval:
    eval "$(python scripts/rabbitmq_nodes.py start --name atw-r1 --version 3.10 --port 5701)"
    ATW_RABBITMQ_URL=$URL ATW_RABBITMQCTL=$RABBITMQCTL uv run pytest -q tests/integration
    python scripts/rabbitmq_nodes.py stop --name atw-r1 [--purge]
    python scripts/rabbitmq_nodes.py cluster start --version 3.10 --ports 5701,5702,5703
    python scripts/rabbitmq_nodes.py cluster stop --ports 5701,5702,5703 [--purge]
    python scripts/rabbitmq_nodes.py start --name atw-q1 --version 4.3 --port 5772 --epmd-port 4371
    python scripts/rabbitmq_nodes.py cluster start --version 4.3 --ports 5801,5802,5803 \
        --epmd-port 4401                                       # its own epmd (4.0, 4.3)

Usage as a library (from the repository root, e.g. in the tests)::

    from scripts.rabbitmq_nodes import Node, NodeSpec, running_node, start_cluster, stop_cluster

    spec = NodeSpec(name="atw-r1", port=5701, conf={"consumer_timeout": "10000"})
    with running_node(spec) as node:   # fresh; stopped and deleted afterwards
        node.url("my-vhost")            # amqp://guest:guest@127.0.0.1:5701/my-vhost
        node.ctl("list_queues", "-p", "my-vhost")
        node.ctl_command()              # argv prefix of its rabbitmqctl, for ATW_RABBITMQCTL
        node.set_memory_alarm(True)     # publishers block; False clears it
        node.leader_of("q", "my-vhost") # the quorum queue's leader, e.g. "atw-r1@localhost"
        node.restart()                  # a real process stop and start, data kept
        node.kill()                     # SIGKILL of the beam process; start() brings it back

API:

- ``NodeSpec`` (keyword-only dataclass): ``name`` (short, e.g. ``atw-r1``; the node is
  ``NAME@localhost``), ``port`` (AMQP), ``version`` (``VERSIONS``: ``"3.10"``, ``"4.0"``,
  ``"4.3"``), ``dist_port`` (0: ``port + 20000``), ``epmd_port`` (4.0 and 4.3; 0: 4370 for
  4.0, 4371 for 4.3), ``base_dir`` (data, logs, configuration and the state file
  ``node.json``; default ``/var/tmp/atw/nodes/NAME`` for 3.10 and ``ROOT/var/lib/atw-nodes/NAME``
  for 4.0 and 4.3, where it must be inside the root), ``conf`` (extra ``rabbitmq.conf`` lines,
  overriding the defaults), ``advanced_config`` (Erlang terms for ``advanced.config``, e.g.
  ``[{rabbit, [{channel_tick_interval, 1000}]}].``), ``root`` (4.0 and 4.3; default
  ``default_root(version)``).
- ``Node(spec)``: ``start(fresh=False)``, ``stop()``, ``restart()``, ``kill()``, ``remove()``
  (stop, then delete ``base_dir``), ``ctl(*args)``, ``ctl_command(tool="rabbitmqctl")``,
  ``url(vhost)``, ``pid``, ``running``, ``server_version()``, ``set_memory_alarm(on)``,
  ``alarms()``, ``leader_of(queue, vhost)``, ``running_nodes()``, ``log_tail()``,
  ``server_env()``, ``server_command()``; ``Node.load(base_dir)`` reads a node back from its
  state file. Errors are ``NodeError`` (with the broker's words or the end of its logs).
- ``start_cluster(members, version=..., epmd_port=...)`` / ``stop_cluster(nodes)``: three (or
  more) nodes, the second and later joined to the first.
- ``running_node(spec)`` / ``running_cluster(members)``: context managers that start fresh and
  always stop and delete the data on exit, also when the start fails.
- ``build_root(dir, version=...)``, ``root_ready(dir)``, ``default_root(version="4.0")``
  (``$ATW_RABBITMQ4_ROOT`` or ``/var/tmp/atw/trixie-root``; 4.3: ``$ATW_RABBITMQ43_ROOT`` or
  ``/var/tmp/atw/sid-root``), ``default_epmd_port(version)``, ``default_base_dir(...)``;
  ``ROOTS`` (each chrooted version's suite, variable, default directory and epmd port).

What was verified on this machine (Debian 12, RabbitMQ 3.10.8 on Erlang/OTP 25; the trixie root
holds Debian 13's RabbitMQ 4.0.5 on Erlang/OTP 27, the sid root RabbitMQ 4.3.6 on OTP 27):

- 3.10: ``/usr/sbin/rabbitmq-server`` and ``/usr/sbin/rabbitmqctl`` are a wrapper that, run as
  root, does ``su rabbitmq`` (``HOME=/var/lib/rabbitmq``) and re-quotes the arguments for
  ``sh -c`` (only ``"`` is escaped, so ``$`` and backticks in arguments get expanded). Nodes here
  run ``/usr/lib/rabbitmq/bin/rabbitmq-server`` as root instead, with ``RABBITMQ_NODENAME``,
  ``RABBITMQ_NODE_PORT``, ``RABBITMQ_DIST_PORT``, ``RABBITMQ_MNESIA_BASE``,
  ``RABBITMQ_LOG_BASE``, ``RABBITMQ_CONFIG_FILE`` (3.10 takes the path *with* its ``.conf``
  extension), ``RABBITMQ_ADVANCED_CONFIG_FILE``, ``RABBITMQ_ENABLED_PLUGINS_FILE``,
  ``RABBITMQ_PID_FILE`` and ``RABBITMQ_CONF_ENV_FILE`` (a file of the node's own, so
  ``/etc/rabbitmq/rabbitmq-env.conf``, which names ``rabbit@localhost``, is not read).
- The Erlang cookie is ``$HOME/.erlang.cookie``: root's plain ``rabbitmqctl`` goes through the
  wrapper and so uses ``/var/lib/rabbitmq/.erlang.cookie`` (there is no ``/root/.erlang.cookie``
  here; the unwrapped CLI run as root would create a random one there). The 3.10 nodes and their
  ``ctl_command()`` therefore run with ``HOME=/var/lib/rabbitmq``: every 3.10 node shares the
  machine's cookie (clusters join, and ``rabbitmqctl -n NAME@localhost`` works too). Nothing is
  written there. Without that file a cookie of the tooling's own is made in
  ``/var/tmp/atw/erlang-home``.
- 3.10 nodes register with the machine's epmd (4369). The distribution listener is bound to
  127.0.0.1 (``-kernel inet_dist_use_interface {127,0,0,1}``, as the machine's node does).
- ``rabbitmq-server -detached`` loses every early error (a bad ``rabbitmq.conf`` leaves no log
  and ``rabbitmqctl wait`` runs into its timeout), so the server is started in the background
  in a session of its own with stdout and stderr in ``BASE_DIR/startup.log``, and ``start()``
  polls ``rabbitmqctl await_startup`` until it answers or the process is gone. The start
  script forks ``erl`` and waits for it (both versions), so the pid file holds the beam's pid.
- ``rabbitmqctl stop PIDFILE`` stops the node and waits for the process to end (3.10, 4.0, 4.3).
- 4.0 (and 4.3): the broker needs ``/proc`` in the root (bind-mounted here, once; unmounted
  again when the last process in the root has stopped). It runs as the root's ``rabbitmq`` user
  (uid 101/gid 102 in the root; those ids belong to other users on the host) through
  ``chroot --userspec=UID:GID --groups=GID ROOT /usr/lib/rabbitmq/bin/rabbitmq-server`` with
  ``HOME=/var/lib/rabbitmq`` (the root's cookie, made by the package) and ``ERL_EPMD_PORT``
  (default 4370, 4.3: 4371; the node starts an epmd of the root's own on it;
  ``ERL_EPMD_ADDRESS=127.0.0.1`` keeps it on loopback). The same environment works through the
  root's ``/usr/sbin/rabbitmq-server`` wrapper (its ``su`` keeps the environment), but the wrapper
  is not used: no ``su``/PAM, no re-quoting of arguments. Paths in the environment are the ones
  the broker sees, inside the root; the node's files are chowned to the root's ``rabbitmq`` user.
  An epmd of the root with no node left on its port is stopped with the last such node.
- 4.0 needs no other variables than 3.10. Its default ``vm_memory_high_watermark`` is 0.6
  (3.10: 0.4), so ``set_memory_alarm(False)`` restores the configured value rather than 0.4.
- 4.3 (Debian sid) runs the same way as 4.0 (uid/gid 101/101 in its root). Its root needs an
  ``/etc/hosts`` naming ``localhost`` (``build_root`` copies the host's), or the node dies in
  prelaunch with ``{error,nxdomain}``. Its metadata store is Khepri; a cluster still forms
  with ``stop_app``, ``join_cluster``, ``start_app`` on fresh nodes (no ``reset``). Its
  watermark default is 0.6 (``{ok,0.6}``, as on 4.0).
- Every CLI call and server sets ``ERL_EPMD_ADDRESS=127.0.0.1``: an epmd that one of them
  starts listens on loopback only (127.0.0.1 and ::1).
- Memory alarm: ``rabbitmqctl set_vm_memory_high_watermark 0.0000001`` and
  ``rabbit_alarm:set_alarm({{resource_limit, memory, node()}, []})`` both block publishers on
  3.10 and 4.0 (``connection.blocked``, publishes stall); the CLI command is used (on 4.3
  too: the alarm shows within 1.3 s, and clears within 1.8 s).
- ``rabbitmqctl list_queues name leader --formatter json`` names a quorum queue's leader on
  3.10, 4.0 and 4.3 (``rabbitmq-queues quorum_status`` works too, with different columns).
- Start times (2 cores): a 3.10 node about 5 s, a 4.0 or 4.3 node about 2-3 s; a 4.3
  cluster of three 10 s.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "NodeError",
    "NodeSpec",
    "Node",
    "start_cluster",
    "stop_cluster",
    "running_node",
    "running_cluster",
    "build_root",
    "root_ready",
    "default_root",
    "default_base_dir",
    "VERSIONS",
    "ROOTS",
    "HOST_BIN",
]

VERSIONS = ("3.10", "4.0", "4.3")
HOST_BIN = Path("/usr/lib/rabbitmq/bin")
ROOT_BIN = "/usr/lib/rabbitmq/bin"
MACHINE_RABBITMQ_HOME = Path("/var/lib/rabbitmq")
TOOL_DIR = Path("/var/tmp/atw")  # noqa: S108 (a fixed place, root-only tooling)
NODES_DIR = TOOL_DIR / "nodes"
NODES_DIR_IN_ROOT = "var/lib/atw-nodes"
DIST_PORT_OFFSET = 20000
MACHINE_EPMD_PORT = 4369
STATE_FILE = "node.json"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DIST_ERL_ARGS = "-kernel inet_dist_use_interface {127,0,0,1}"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")


class NodeError(RuntimeError):
    """A node did not start, stop or answer; the message carries the broker's words."""


class RootKind(NamedTuple):
    """A chrooted version's Debian root: its suite, where it is, its nodes' default epmd."""

    suite: str
    variable: str
    default_dir: Path
    epmd_port: int


#: The versions that run chrooted in a Debian root of their own, and that root. Each root's
#: nodes start an epmd of the root's own, so the two default to different epmd ports.
ROOTS = {
    "4.0": RootKind("trixie", "ATW_RABBITMQ4_ROOT", TOOL_DIR / "trixie-root", 4370),
    "4.3": RootKind("sid", "ATW_RABBITMQ43_ROOT", TOOL_DIR / "sid-root", 4371),
}


def _root_kind(version: str) -> RootKind:
    if version not in ROOTS:
        raise ValueError(f"version {version!r} has no root (those that do: {', '.join(ROOTS)})")
    return ROOTS[version]


def default_epmd_port(version: str) -> int:
    """The epmd port a node of ``version`` uses unless told: 4369 (3.10) or its root's.

    Args:
        version: One of ``VERSIONS``.

    Returns:
        The port.
    """
    return ROOTS[version].epmd_port if version in ROOTS else MACHINE_EPMD_PORT


def default_root(version: str = "4.0") -> Path:
    """The root of ``version``'s nodes: ``$ATW_RABBITMQ4_ROOT`` / ``$ATW_RABBITMQ43_ROOT``.

    Unset, ``/var/tmp/atw/trixie-root`` (4.0) or ``/var/tmp/atw/sid-root`` (4.3).

    Args:
        version: ``"4.0"`` or ``"4.3"``.

    Returns:
        The root directory (it may not exist yet).

    Raises:
        ValueError: For a version that runs from no root (3.10).
    """
    kind = _root_kind(version)
    return Path(os.environ.get(kind.variable) or kind.default_dir)


def root_ready(root: Path) -> bool:
    """Whether ``root`` holds a finished Debian root with RabbitMQ installed.

    Args:
        root: The root directory.

    Returns:
        True when ``ROOT/usr/sbin/rabbitmq-server`` exists.
    """
    return (root / "usr" / "sbin" / "rabbitmq-server").exists()


def default_base_dir(name: str, version: str, root: Path | None = None) -> Path:
    """Where a node keeps its files when its spec names no ``base_dir``.

    Args:
        name: The node's short name.
        version: One of ``VERSIONS``.
        root: The root of a 4.0 or 4.3 node (default: ``default_root(version)``).

    Returns:
        ``/var/tmp/atw/nodes/NAME`` (3.10) or ``ROOT/var/lib/atw-nodes/NAME`` (4.0, 4.3).
    """
    if version in ROOTS:
        return (root or default_root(version)) / NODES_DIR_IN_ROOT / name
    return NODES_DIR / name


#: Seconds a timed-out command's killed process group has to be reaped.
REAP_S = 5.0


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _run(
    argv: Sequence[str],
    *,
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (no shell), capturing its output; never raises on a non-zero exit.

    It runs in a session of its own: ``rabbitmqctl`` is a script whose child, the CLI's Erlang
    VM, holds the pipes, so a timeout kills the whole group, and reaps it, leaving no process
    behind (a CLI that outlives its killed script keeps the root's epmd busy).
    """
    process = subprocess.Popen(  # noqa: S603 (argv lists built here, no shell)
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    with process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            _kill_group(process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=REAP_S)  # read to the end: the group has ended
            raise NodeError(f"{shlex.join(argv)}: no answer within {timeout_s} s") from error
        except BaseException:  # KeyboardInterrupt...: the group goes too
            _kill_group(process.pid)
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _checked(argv: Sequence[str], *, timeout_s: float = 120) -> str:
    done = _run(argv, timeout_s=timeout_s)
    if done.returncode != 0:
        words = (done.stderr.strip() or done.stdout.strip())[-4000:]
        raise NodeError(f"{shlex.join(argv)} exited {done.returncode}: {words}")
    return done.stdout


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path}: not written)"
    return "\n".join(text.splitlines()[-lines:])


def _process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``Z``...), or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    return _process_state(pid) not in (None, "Z", "X")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended with all its threads (only then are its sockets closed).

    After SIGKILL the thread group leader shows ``Z`` while its other threads still exit.
    """
    if _alive(pid):
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


# --- the Debian roots -----------------------------------------------------------------------


def build_root(
    root: Path | None = None,
    *,
    version: str = "4.0",
    suite: str | None = None,
    timeout_s: float = 1800,
) -> Path:
    """Build the root of ``version``'s nodes with debootstrap, unless it is there already.

    Runs ``debootstrap --variant=minbase --include=rabbitmq-server SUITE DIR`` (trixie: about
    35 s; sid: about 100 s) into ``DIR.partial`` and renames it when done, so a root that
    exists is a finished one. Installs debootstrap with apt-get when it is missing. A root
    whose ``/etc/hosts`` names no ``localhost`` (sid's has none) gets the host's: without it a
    node dies in prelaunch with ``{error,nxdomain}``. A finished root is only given that file.

    Args:
        root: The directory (default: ``default_root(version)``).
        version: ``"4.0"`` (Debian 13, trixie) or ``"4.3"`` (Debian unstable, sid).
        suite: The Debian suite (default: the version's).
        timeout_s: How long debootstrap may take.

    Returns:
        The root directory.

    Raises:
        NodeError: When debootstrap fails or ``root`` exists without RabbitMQ in it.
        ValueError: For a version that runs from no root.
    """
    suite = suite or _root_kind(version).suite
    root = (root or default_root(version)).absolute()
    root.parent.mkdir(parents=True, exist_ok=True)
    with _root_lock(root):  # one builder at a time (CI and the fault suite may both ask)
        if not root_ready(root):
            _debootstrap(root, suite, timeout_s)
        _resolve_localhost(root)
    return root


def _resolve_localhost(root: Path) -> None:
    """Give ``root`` the host's ``/etc/hosts`` unless its own names ``localhost``."""
    hosts = root / "etc" / "hosts"
    with contextlib.suppress(OSError):
        if re.search(r"^\s*127\.0\.0\.1\s.*\blocalhost\b", hosts.read_text(), re.MULTILINE):
            return
    shutil.copyfile("/etc/hosts", hosts)


def _install_debootstrap() -> None:
    # Two roots are built side by side (.ci/run): both would run apt-get at once, and the second
    # fails on apt's lock. One install at a time, and none once the first has put it there.
    TOOL_DIR.mkdir(parents=True, exist_ok=True)
    with open(TOOL_DIR / ".apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("debootstrap") is not None:
            return
        environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "debootstrap"],
        ):
            done = _run(argv, timeout_s=600, env=environment)
            if done.returncode != 0:
                raise NodeError(f"{shlex.join(argv)}: {done.stderr.strip()[-2000:]}")


def _debootstrap(root: Path, suite: str, timeout_s: float) -> None:
    if root.exists():
        if any(root.iterdir()):
            raise NodeError(f"{root} exists but holds no rabbitmq-server: remove it first")
        root.rmdir()
    _install_debootstrap()
    partial = root.with_name(root.name + ".partial")
    if partial.exists():
        _unmount_under(partial)  # a failed debootstrap can leave its /proc and /sys mounted
        shutil.rmtree(partial)
    argv = ["debootstrap", "--variant=minbase", "--include=rabbitmq-server", suite, str(partial)]
    done = _run(argv, timeout_s=timeout_s)
    if done.returncode != 0 or not root_ready(partial):
        log = _tail(partial / "debootstrap" / "debootstrap.log", 30)
        raise NodeError(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}{log}")
    partial.rename(root)


def _root_user(root: Path) -> tuple[int, int]:
    """The uid and gid of the root's ``rabbitmq`` user (from ``ROOT/etc/passwd``)."""
    for line in (root / "etc" / "passwd").read_text().splitlines():
        parts = line.split(":")
        if parts[0] == "rabbitmq":
            return int(parts[2]), int(parts[3])
    raise NodeError(f"{root} has no rabbitmq user")


def _mount_points() -> set[str]:
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point))
    return points


def _proc_mounted(root: Path) -> bool:
    return str((root / "proc").resolve()) in _mount_points()


def _mount_proc(root: Path) -> None:
    if not _proc_mounted(root):
        _checked(["mount", "--bind", "/proc", str(root / "proc")])


def _unmount_proc(root: Path) -> None:
    if _proc_mounted(root):
        _checked(["umount", str(root / "proc")])


def _unmount_under(folder: Path) -> None:
    """Unmount everything mounted below ``folder``, the deepest first."""
    prefix = str(folder.resolve()) + "/"
    for point in sorted((p for p in _mount_points() if p.startswith(prefix)), reverse=True):
        _checked(["umount", point])


def _processes_in(root: Path) -> list[tuple[int, str, int | None]]:
    """``(pid, command name, ERL_EPMD_PORT)`` of each live process chrooted into ``root``."""
    target = str(root.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "root") != target or not _alive(int(entry.name)):
                continue
            comm = (entry / "comm").read_text().strip()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        port = next((v[14:] for v in environ if v.startswith(b"ERL_EPMD_PORT=")), b"")
        found.append((int(entry.name), comm, int(port) if port.isdigit() else None))
    return found


@contextlib.contextmanager
def _root_lock(root: Path) -> Iterator[None]:
    """Serialise launching nodes in ``root`` against cleaning it up (other processes too)."""
    lock = root.parent / f".{root.name}.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tidy_root(root: Path) -> None:
    """Stop the root's idle epmds, and unmount its /proc once nothing runs in it (lock held).

    An epmd is idle when no other process in the root uses its port (a node that was just
    launched carries ``ERL_EPMD_PORT`` in its environment before it registers).
    """
    processes = _processes_in(root)
    busy = {port for _, comm, port in processes if comm != "epmd"}
    for pid, comm, port in processes:
        if comm == "epmd" and port not in busy:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, 10)
    if not _processes_in(root):
        _unmount_proc(root)


# --- nodes ----------------------------------------------------------------------------------


def _cookie_home() -> Path:
    """The ``HOME`` of the 3.10 nodes and their CLI: where the shared Erlang cookie is."""
    if (MACHINE_RABBITMQ_HOME / ".erlang.cookie").is_file():
        return MACHINE_RABBITMQ_HOME
    home = TOOL_DIR / "erlang-home"
    cookie = home / ".erlang.cookie"
    if not cookie.exists():
        home.mkdir(parents=True, exist_ok=True)
        cookie.write_text(secrets.token_hex(20).upper())
        cookie.chmod(0o400)
    return home


@dataclass(kw_only=True)
class NodeSpec:
    """What a node is: its name, version, ports, files and configuration.

    Attributes:
        name: Short node name (``NAME@localhost``), letters, digits, ``-`` and ``_``.
        port: The AMQP port (on 127.0.0.1).
        version: ``"3.10"`` (the machine's binaries), ``"4.0"`` (the Debian 13 root's) or
            ``"4.3"`` (the Debian unstable root's).
        dist_port: The Erlang distribution port; 0 means ``port + 20000``.
        epmd_port: The epmd port of a 4.0 or 4.3 node; 0 means the version's
            (``default_epmd_port``: 4370, 4371; 3.10 nodes use the machine's, 4369).
        base_dir: Where data, logs, configuration and ``node.json`` go (see
            ``default_base_dir``); a 4.0 or 4.3 node's must be inside its root.
        conf: Extra ``rabbitmq.conf`` settings, e.g. ``{"max_message_size": "1048576"}``.
        advanced_config: Erlang terms for ``advanced.config``, or None for ``[].``.
        root: The Debian root of a 4.0 or 4.3 node (default: ``default_root(version)``).
    """

    name: str
    port: int
    version: str = "3.10"
    dist_port: int = 0
    epmd_port: int = 0
    base_dir: Path | None = None
    conf: dict[str, str] = field(default_factory=dict)
    advanced_config: str | None = None
    root: Path | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or self.name == "rabbit":
            raise ValueError(f"bad node name {self.name!r} (and 'rabbit' is the machine's)")
        if self.version not in VERSIONS:
            raise ValueError(f"version {self.version!r} is not one of {', '.join(VERSIONS)}")
        if self.port == 5672:
            raise ValueError("5672 is the machine's broker: pick another port")
        if not self.dist_port:
            self.dist_port = self.port + DIST_PORT_OFFSET
        if self.version not in ROOTS or not self.epmd_port:
            self.epmd_port = default_epmd_port(self.version)
        for key, value in self.conf.items():
            if "\n" in key + str(value) or "=" in key:
                raise ValueError(f"bad rabbitmq.conf setting {key!r} = {value!r}")


class Node:
    """One RabbitMQ node: start, stop, restart, kill, and its rabbitmqctl.

    Args:
        spec: What the node is.

    Raises:
        ValueError: When a 4.0 or 4.3 node's ``base_dir`` lies outside its root.
    """

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.version = spec.version
        self.nodename = f"{spec.name}@localhost"
        self.port = spec.port
        self.dist_port = spec.dist_port
        self.epmd_port = spec.epmd_port
        self.root: Path | None = None
        if spec.version in ROOTS:
            self.root = (spec.root or default_root(spec.version)).absolute()
        base = spec.base_dir or default_base_dir(spec.name, spec.version, self.root)
        self.base_dir = Path(os.path.abspath(base))
        if self.root is not None and not self.base_dir.is_relative_to(self.root):
            raise ValueError(
                f"a {self.version} node's base_dir must be inside {self.root}: {self.base_dir}"
            )

    def __repr__(self) -> str:
        return f"Node({self.nodename}, {self.version}, port {self.port}, {self.base_dir})"

    # -- files -------------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """``RABBITMQ_MNESIA_BASE`` (host path)."""
        return self.base_dir / "mnesia"

    @property
    def log_dir(self) -> Path:
        """``RABBITMQ_LOG_BASE`` (host path)."""
        return self.base_dir / "log"

    @property
    def pid_file(self) -> Path:
        """``RABBITMQ_PID_FILE`` (host path)."""
        return self.base_dir / "pid"

    @property
    def startup_log(self) -> Path:
        """The server's stdout and stderr (early errors land here, before the log file)."""
        return self.base_dir / "startup.log"

    @property
    def state_file(self) -> Path:
        """``node.json``: the spec, for ``Node.load`` and the CLI's ``stop``."""
        return self.base_dir / STATE_FILE

    def _seen(self, path: Path) -> str:
        """``path`` as the broker sees it (inside the root for 4.0 and 4.3)."""
        if self.root is None:
            return str(path)
        return "/" + str(path.relative_to(self.root))

    def _write_files(self) -> None:
        for folder in (self.base_dir, self.data_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        settings = {
            "listeners.tcp.default": f"127.0.0.1:{self.port}",
            "loopback_users": "none",
            **self.spec.conf,
        }
        lines = [f"# {self.nodename}, written by scripts/rabbitmq_nodes.py"]
        lines += [f"{key} = {value}" for key, value in settings.items()]
        (self.base_dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        (self.base_dir / "advanced.config").write_text((self.spec.advanced_config or "[].") + "\n")
        (self.base_dir / "enabled_plugins").write_text("[].\n")
        (self.base_dir / "rabbitmq-env.conf").write_text(
            "# The node's own (empty): keeps /etc/rabbitmq/rabbitmq-env.conf out.\n"
        )
        self.pid_file.unlink(missing_ok=True)
        self.state_file.write_text(json.dumps(self._state(), indent=2) + "\n")
        if self.root is not None:
            uid, gid = _root_user(self.root)
            for walked, _, files in os.walk(self.base_dir):
                os.chown(walked, uid, gid)
                for name in files:
                    os.chown(Path(walked) / name, uid, gid)

    def _state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "port": self.port,
            "dist_port": self.dist_port,
            "epmd_port": self.epmd_port,
            "base_dir": str(self.base_dir),
            "root": None if self.root is None else str(self.root),
            "conf": self.spec.conf,
            "advanced_config": self.spec.advanced_config,
        }

    @classmethod
    def load(cls, base_dir: Path) -> Node:
        """The node whose state file is in ``base_dir``.

        Args:
            base_dir: The node's base directory.

        Returns:
            The node (running or not).

        Raises:
            NodeError: When there is no state file.
        """
        try:
            state = json.loads((base_dir / STATE_FILE).read_text())
        except OSError as error:
            raise NodeError(f"no node in {base_dir} ({error.strerror})") from error
        root = state.get("root")
        return cls(
            NodeSpec(
                name=state["name"],
                port=state["port"],
                version=state["version"],
                dist_port=state["dist_port"],
                epmd_port=state["epmd_port"],
                base_dir=Path(state["base_dir"]),
                conf=dict(state.get("conf") or {}),
                advanced_config=state.get("advanced_config"),
                root=None if root is None else Path(root),
            )
        )

    # -- commands ----------------------------------------------------------------------------

    def _chroot(self) -> list[str]:
        if self.root is None:
            return []
        uid, gid = _root_user(self.root)
        return ["chroot", f"--userspec={uid}:{gid}", f"--groups={gid}", str(self.root)]

    def _home(self) -> str:
        return "/var/lib/rabbitmq" if self.root is not None else str(_cookie_home())

    def server_env(self) -> dict[str, str]:
        """The whole environment of the server process (nothing inherited).

        Returns:
            The variables.
        """
        environment = {
            "PATH": PATH,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": self._home(),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": self._seen(self.data_dir),
            "RABBITMQ_LOG_BASE": self._seen(self.log_dir),
            "RABBITMQ_CONFIG_FILE": self._seen(self.base_dir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": self._seen(self.base_dir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": self._seen(self.base_dir / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": self._seen(self.base_dir / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": self._seen(self.pid_file),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": DIST_ERL_ARGS,
            # An epmd that this start (or a CLI call) launches listens on loopback only.
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        if self.root is not None:
            environment["ERL_EPMD_PORT"] = str(self.epmd_port)
        return environment

    def server_command(self) -> list[str]:
        """The argv that runs the server in the foreground (``start()`` backgrounds it).

        Returns:
            The argv.
        """
        if self.root is None:
            return [str(HOST_BIN / "rabbitmq-server")]
        return [*self._chroot(), f"{ROOT_BIN}/rabbitmq-server"]

    def ctl_command(self, tool: str = "rabbitmqctl") -> list[str]:
        """The argv prefix that runs this node's ``rabbitmqctl`` (or ``rabbitmq-queues``...).

        It sets its own environment (``env -i``), so it works from any shell as root; join it
        with ``shlex.join`` for ``ATW_RABBITMQCTL``.

        Args:
            tool: ``rabbitmqctl``, ``rabbitmq-diagnostics``, ``rabbitmq-queues``...

        Returns:
            The argv prefix; append the command and its arguments.
        """
        environment = ["/usr/bin/env", "-i", f"PATH={PATH}", "LC_ALL=C.UTF-8"]
        environment += [f"HOME={self._home()}", "ERL_EPMD_ADDRESS=127.0.0.1"]
        if self.root is None:
            return [*environment, str(HOST_BIN / tool), "-n", self.nodename]
        environment.append(f"ERL_EPMD_PORT={self.epmd_port}")
        return [*self._chroot(), *environment, f"{ROOT_BIN}/{tool}", "-n", self.nodename]

    def _ctl_run(
        self, *arguments: str, tool: str = "rabbitmqctl", timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return _run([*self.ctl_command(tool), *arguments], timeout_s=timeout_s)

    def ctl(self, *arguments: str, tool: str = "rabbitmqctl", timeout_s: float = 120) -> str:
        """Run this node's ``rabbitmqctl`` (or ``tool``) with ``arguments``.

        Args:
            *arguments: The command and its arguments, e.g. ``"list_queues", "-p", "v"``.
            tool: The CLI tool.
            timeout_s: How long it may take.

        Returns:
            Its stdout.

        Raises:
            NodeError: On a non-zero exit (with its stderr) or a timeout.
        """
        done = self._ctl_run(*arguments, tool=tool, timeout_s=timeout_s)
        if done.returncode != 0:
            words = (done.stderr.strip() or done.stdout.strip())[-4000:]
            raise NodeError(f"{tool} -n {self.nodename} {shlex.join(arguments)}: {words}")
        return done.stdout

    def url(self, vhost: str = "") -> str:
        """``amqp://guest:guest@127.0.0.1:PORT/VHOST``, the vhost URL-quoted.

        Args:
            vhost: The vhost (``""``: the default one, ``/``).

        Returns:
            The URL.
        """
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{urllib.parse.quote(vhost, safe='')}"

    # -- process -----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The beam process's pid while it runs, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError):
            return None
        return pid if comm == "beam.smp" and _alive(pid) else None

    @property
    def running(self) -> bool:
        """Whether the node's beam process is alive (booted or not)."""
        return self.pid is not None

    def log_tail(self, lines: int = 40) -> str:
        """The end of the startup output and of the node's log file.

        The startup output is short (it stops when the node switches to its log file), and a
        failed boot's cause comes before a long crash report: five times ``lines`` of it.

        Args:
            lines: How many lines of the log file.

        Returns:
            Both, headed by their paths.
        """
        log = self.log_dir / f"{self.nodename}.log"
        return (
            f"--- {self.startup_log}\n{_tail(self.startup_log, 5 * lines)}\n"
            f"--- {log}\n{_tail(log, lines)}"
        )

    def start(self, *, fresh: bool = False, timeout_s: float = 120) -> None:
        """Start the node and wait until RabbitMQ runs in it.

        Args:
            fresh: Delete the data of an earlier run first (``remove_data``).
            timeout_s: How long the boot may take.

        Raises:
            NodeError: When it is running already, a port is taken, the binaries or the root
                are missing, or it does not boot (with the end of its logs).
        """
        if self.running:
            raise NodeError(f"{self.nodename} is running already (pid {self.pid})")
        if fresh:
            self.remove_data()
        for port in (self.port, self.dist_port):
            if _listening(port):
                raise NodeError(f"port {port} of {self.nodename} is in use on 127.0.0.1")
        if self.root is None:
            if not (HOST_BIN / "rabbitmq-server").exists():
                raise NodeError(f"no {HOST_BIN / 'rabbitmq-server'}: install rabbitmq-server")
        elif not root_ready(self.root):
            raise NodeError(
                f"no {self.version} root at {self.root}: "
                f"run scripts/rabbitmq_nodes.py root --version {self.version}"
            )
        self._write_files()
        if self.root is None:
            launcher = self._launch()
        else:
            with _root_lock(self.root):
                _mount_proc(self.root)
                launcher = self._launch()
        try:
            self._await_startup(launcher, timeout_s)
        except BaseException:
            self._halt(launcher)
            raise

    def _launch(self) -> int:
        """Start the server in the background, in a session of its own; the launcher's pid."""
        script = 'log=$1; shift; exec "$@" >>"$log" 2>&1 </dev/null & echo $!'
        argv = ["/bin/sh", "-c", script, "sh", str(self.startup_log), *self.server_command()]
        try:
            started = subprocess.run(  # noqa: S603 (argv lists built here)
                argv,
                env=self.server_env(),
                cwd=self.base_dir,
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
                start_new_session=True,
            )
        except subprocess.SubprocessError as error:
            raise NodeError(f"could not launch {self.nodename}: {error}") from error
        return int(started.stdout.strip())

    def _await_startup(self, launcher: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running and not _alive(launcher):
                raise NodeError(f"{self.nodename} exited while starting:\n{self.log_tail()}")
            # An attempt may use the rest of the boot's time, the CLI's wait too: under load the
            # CLI's own VM can take over 30 s to answer (CI, three 4.3 nodes booting at once).
            left = max(deadline - time.monotonic(), 1.0)
            try:
                wait = ("--timeout", str(int(left)))
                done = self._ctl_run("await_startup", *wait, timeout_s=left)
                if done.returncode == 0:
                    return
                why = done.stderr.strip()[-500:]
            except NodeError as error:
                why = str(error)
            if time.monotonic() > deadline:
                raise NodeError(
                    f"{self.nodename} did not start within {timeout_s} s ({why}):\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.25)

    def _halt(self, launcher: int | None = None) -> None:
        """Kill whatever runs of the node (a failed start), quietly.

        Args:
            launcher: The launch's pid: its session goes too, for a server that has not yet
                written its pid file (a boot whose deadline came first, under load).
        """
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10)
        if launcher is not None and _alive(launcher):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(launcher)
                if group != os.getpgrp():  # the launch's own session, never the caller's
                    os.killpg(group, signal.SIGKILL)
            _wait_gone(launcher, 10)
        self._after_stop()

    def _after_stop(self) -> None:
        self.pid_file.unlink(missing_ok=True)
        if self.root is not None:
            with _root_lock(self.root):
                _tidy_root(self.root)

    def stop(self, *, timeout_s: float = 60) -> None:
        """Stop the node (``rabbitmqctl stop PIDFILE``, which waits for the process to end).

        A node that does not run is left alone. Its data stays. If the CLI cannot stop it, the
        process gets SIGTERM, then SIGKILL. For a 4.0 or 4.3 node the root is tidied up after
        (idle epmd stopped, ``/proc`` unmounted once nothing runs in the root).

        Args:
            timeout_s: How long the CLI's stop may take; the signals after it, as long again.

        Raises:
            NodeError: When the process survives even SIGKILL.
        """
        pid = self.pid
        if pid is not None:
            try:
                stopped = self._ctl_run("stop", self._seen(self.pid_file), timeout_s=timeout_s)
            except NodeError:  # the CLI did not answer in time: the signals below still stop it
                stopped = None
            if stopped is None or stopped.returncode != 0 or not _wait_gone(pid, 5):
                for number in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, number)
                        # A stopped (frozen) node acts on SIGTERM only once it runs again.
                        os.kill(pid, signal.SIGCONT)
                    if _wait_gone(pid, timeout_s / 2):
                        break
                else:
                    raise NodeError(f"{self.nodename} (pid {pid}) survived SIGKILL")
        self._after_stop()

    def restart(self, *, timeout_s: float = 120) -> None:
        """Stop the process and start it again (a broker restart; the data stays).

        Args:
            timeout_s: How long the boot may take.
        """
        self.stop()
        self.start(timeout_s=timeout_s)

    def kill(self) -> None:
        """SIGKILL the beam process (a hard fault) and wait until it is gone.

        ``start()`` brings the node back with its data.

        Raises:
            NodeError: When the node does not run.
        """
        pid = self.pid
        if pid is None:
            raise NodeError(f"{self.nodename} does not run")
        os.kill(pid, signal.SIGKILL)
        if not _wait_gone(pid, 10):
            raise NodeError(f"{self.nodename} (pid {pid}) survived SIGKILL")

    def remove_data(self) -> None:
        """Delete ``base_dir`` (only one that holds a node's state file, or is empty).

        Raises:
            NodeError: When the node runs, or ``base_dir`` holds something else.
        """
        if self.running:
            raise NodeError(f"{self.nodename} is running: stop it first")
        if not self.base_dir.exists():
            return
        if any(self.base_dir.iterdir()) and not self.state_file.exists():
            raise NodeError(f"{self.base_dir} holds no {STATE_FILE}: not deleting it")
        shutil.rmtree(self.base_dir)

    def remove(self) -> None:
        """Stop the node and delete its files."""
        self.stop()
        self.remove_data()

    # -- broker state ------------------------------------------------------------------------

    def server_version(self) -> str:
        """The running broker's version, e.g. ``"3.10.8"``, ``"4.0.5"`` or ``"4.3.6"``.

        Returns:
            The version.
        """
        return str(json.loads(self.ctl("status", "--formatter", "json"))["rabbitmq_version"])

    def running_nodes(self) -> list[str]:
        """The cluster's running nodes as this node sees them (``cluster_status``).

        Returns:
            Node names, e.g. ``["atw-c1@localhost", ...]``.
        """
        status = json.loads(self.ctl("cluster_status", "--formatter", "json"))
        return sorted(status.get("running_nodes", []))

    def alarms(self) -> str:
        """The node's resource alarms, as Erlang terms (``rabbit_alarm:get_alarms()``).

        Returns:
            E.g. ``[{{resource_limit,memory,'atw-r1@localhost'},[]}]``, or ``[]``.
        """
        return self.ctl("eval", "rabbit_alarm:get_alarms().").strip()

    def set_memory_alarm(self, on: bool, *, timeout_s: float = 30) -> None:
        """Raise or clear the memory alarm, which blocks publishers (``connection.blocked``).

        On: ``set_vm_memory_high_watermark 0.0000001``. Off: the configured watermark again
        (0.4 on 3.10, 0.6 on 4.0 and 4.3, or what ``conf`` says). Waits until the alarm shows
        (or is gone).

        Args:
            on: Raise it (True) or clear it (False).
            timeout_s: How long to wait for the alarm's state.

        Raises:
            NodeError: When the alarm does not follow.
        """
        if on:
            self.ctl("set_vm_memory_high_watermark", "0.0000001")
        else:
            configured = self.ctl(
                "eval", "element(2, application:get_env(rabbit, vm_memory_high_watermark))."
            ).strip()
            absolute = re.fullmatch(r"\{absolute,\s*(.+)\}", configured)
            relative = re.fullmatch(r"\{relative,\s*(.+)\}", configured)
            if absolute:
                value = ["absolute", absolute.group(1).strip('"')]
            else:
                value = [relative.group(1) if relative else configured]
            self.ctl("set_vm_memory_high_watermark", *value)
        deadline = time.monotonic() + timeout_s
        while ("resource_limit,memory" in self.alarms()) != on:
            if time.monotonic() > deadline:
                raise NodeError(f"{self.nodename}: memory alarm not {'on' if on else 'off'}")
            time.sleep(0.2)

    def leader_of(self, queue: str, vhost: str = "/") -> str:
        """The node that leads the quorum queue ``queue`` (``list_queues name leader``).

        Args:
            queue: The queue's name.
            vhost: Its vhost.

        Returns:
            The leader's node name, e.g. ``"atw-c2@localhost"``.

        Raises:
            LookupError: When there is no such queue or it has no leader (not a quorum queue).
        """
        rows = json.loads(
            self.ctl("list_queues", "-q", "-p", vhost, "name", "leader", "--formatter", "json")
        )
        for row in rows:
            if row.get("name") == queue and row.get("leader"):
                return str(row["leader"])
        raise LookupError(f"no quorum queue {queue!r} with a leader in vhost {vhost!r}")


# --- clusters and context managers ----------------------------------------------------------


def _cluster_nodes(
    members: Sequence[tuple[str, int]],
    *,
    version: str,
    base_dir: Path | None,
    conf: dict[str, str] | None,
    advanced_config: str | None,
    root: Path | None,
    epmd_port: int,
) -> list[Node]:
    return [
        Node(
            NodeSpec(
                name=name,
                port=port,
                version=version,
                epmd_port=epmd_port,
                base_dir=None if base_dir is None else base_dir / name,
                conf=dict(conf or {}),
                advanced_config=advanced_config,
                root=root,
            )
        )
        for name, port in members
    ]


def start_cluster(
    members: Sequence[tuple[str, int]],
    *,
    version: str = "3.10",
    base_dir: Path | None = None,
    conf: dict[str, str] | None = None,
    advanced_config: str | None = None,
    root: Path | None = None,
    epmd_port: int = 0,
    timeout_s: float = 180,
) -> list[Node]:
    """Start fresh nodes, join the second and later ones to the first, wait for all of them.

    The nodes boot in parallel; each joins with ``stop_app``, ``join_cluster FIRST``,
    ``start_app`` (on 4.3's Khepri too); then ``cluster_status`` on the first must list every
    node as running. On a failure the nodes are stopped again (their data stays, for the logs).

    Args:
        members: ``(name, port)`` of each node, e.g. ``[("atw-c1", 5701), ...]``.
        version: One of ``VERSIONS``.
        base_dir: Parent of the nodes' base directories (default: each node's default).
        conf: Extra ``rabbitmq.conf`` settings of every node.
        advanced_config: ``advanced.config`` of every node.
        root: The root of 4.0 or 4.3 nodes.
        epmd_port: The 4.0 or 4.3 nodes' epmd port, shared by them (0: the version's).
        timeout_s: How long the whole start may take.

    Returns:
        The nodes, the first being the one the others joined.

    Raises:
        NodeError: When a node does not start or join (the nodes are stopped).
    """
    nodes = _cluster_nodes(
        members, version=version, base_dir=base_dir, conf=conf,
        advanced_config=advanced_config, root=root, epmd_port=epmd_port,
    )  # fmt: skip
    try:
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            for future in [pool.submit(n.start, fresh=True, timeout_s=timeout_s) for n in nodes]:
                future.result()
        first, *others = nodes
        for node in others:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.nodename)
            node.ctl("start_app")
        wanted = sorted(node.nodename for node in nodes)
        deadline = time.monotonic() + timeout_s
        while (running := first.running_nodes()) != wanted:
            if time.monotonic() > deadline:
                raise NodeError(f"cluster of {wanted}: only {running} running")
            time.sleep(0.5)
    except BaseException:
        with contextlib.suppress(NodeError):
            stop_cluster(nodes)
        raise
    return nodes


def stop_cluster(nodes: Sequence[Node], *, purge: bool = False) -> None:
    """Stop the nodes, the last ones first; with ``purge``, delete their files.

    Every node is attempted; the first error is raised afterwards.

    Args:
        nodes: The nodes, as ``start_cluster`` returned them.
        purge: Delete each node's ``base_dir`` too.

    Raises:
        NodeError: The first error met.
    """
    errors: list[NodeError] = []
    for node in reversed(nodes):
        try:
            if purge:
                node.remove()
            else:
                node.stop()
        except NodeError as error:
            errors.append(error)
    if errors:
        raise errors[0]


@contextlib.contextmanager
def running_node(spec: NodeSpec, *, timeout_s: float = 120) -> Iterator[Node]:
    """A fresh node for the ``with`` block; stopped and deleted afterwards, whatever happens.

    Args:
        spec: The node.
        timeout_s: How long the boot may take.

    Yields:
        The running node.
    """
    node = Node(spec)
    try:
        node.start(fresh=True, timeout_s=timeout_s)
        yield node
    finally:
        node.remove()


@contextlib.contextmanager
def running_cluster(
    members: Sequence[tuple[str, int]],
    *,
    version: str = "3.10",
    base_dir: Path | None = None,
    conf: dict[str, str] | None = None,
    advanced_config: str | None = None,
    root: Path | None = None,
    epmd_port: int = 0,
    timeout_s: float = 180,
) -> Iterator[list[Node]]:
    """A fresh cluster for the ``with`` block (``start_cluster``), deleted afterwards.

    Args:
        members: ``(name, port)`` of each node.
        version: See ``start_cluster``.
        base_dir: See ``start_cluster``.
        conf: See ``start_cluster``.
        advanced_config: See ``start_cluster``.
        root: See ``start_cluster``.
        epmd_port: See ``start_cluster``.
        timeout_s: See ``start_cluster``.

    Yields:
        The running nodes.
    """
    options: dict[str, Any] = {
        "version": version, "base_dir": base_dir, "conf": conf,
        "advanced_config": advanced_config, "root": root, "epmd_port": epmd_port,
    }  # fmt: skip
    try:
        yield start_cluster(members, timeout_s=timeout_s, **options)
    finally:
        stop_cluster(_cluster_nodes(members, **options), purge=True)


# --- command line ---------------------------------------------------------------------------


def _settings(pairs: Sequence[str]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--conf takes key=value, not {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def _print_node(node: Node, suffix: str = "") -> None:
    print(f"URL{suffix}={shlex.quote(node.url())}")
    print(f"RABBITMQCTL{suffix}={shlex.quote(shlex.join(node.ctl_command()))}")


def _find(name: str, version: str | None, base_dir: Path | None, root: Path | None) -> list[Node]:
    if base_dir is not None:
        return [Node.load(base_dir)]
    versions = [version] if version else list(VERSIONS)
    candidates = [default_base_dir(name, v, root) for v in versions]
    found = [Node.load(c) for c in candidates if (c / STATE_FILE).exists()]
    if not found:
        print(
            f"no node {name} in {', '.join(map(str, candidates))}: nothing to stop", file=sys.stderr
        )
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rabbitmq_nodes.py", description="RabbitMQ nodes of the tests' own (3.10, 4.0, 4.3)."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    root = commands.add_parser("root", help="build the Debian root of the 4.0 or 4.3 nodes")
    root.add_argument("--version", choices=tuple(ROOTS), default="4.0")
    root.add_argument(
        "--dir", type=Path, default=None, help="default: $ATW_RABBITMQ4_ROOT / $ATW_RABBITMQ43_ROOT"
    )

    start = commands.add_parser("start", help="start a node; prints URL=... and RABBITMQCTL=...")
    start.add_argument("--name", required=True)
    start.add_argument("--version", choices=VERSIONS, default="3.10")
    start.add_argument("--port", type=int, required=True)
    start.add_argument("--dist-port", type=int, default=0, help="default: port + 20000")
    start.add_argument("--epmd-port", type=int, default=0, help="4.0, 4.3: default 4370, 4371")
    start.add_argument("--conf", nargs="*", default=[], metavar="KEY=VALUE")
    start.add_argument("--advanced-config", default=None, metavar="ERLANG_TERMS")
    start.add_argument("--base-dir", type=Path, default=None)
    start.add_argument("--root", type=Path, default=None, help="4.0, 4.3 only")
    start.add_argument("--keep-data", action="store_true", help="reuse an earlier run's data")
    start.add_argument("--timeout", type=float, default=120)

    stop = commands.add_parser(
        "stop", help="stop a node (its data stays unless --purge); no node there is no error"
    )
    stop.add_argument("--name", required=True)
    stop.add_argument("--version", choices=VERSIONS, default=None)
    stop.add_argument("--base-dir", type=Path, default=None)
    stop.add_argument("--root", type=Path, default=None)
    stop.add_argument("--purge", action="store_true", help="delete the node's files too")

    cluster = commands.add_parser("cluster", help="a cluster of nodes atw-cPORT")
    cluster.add_argument("action", choices=("start", "stop"))
    cluster.add_argument("--version", choices=VERSIONS, default="3.10")
    cluster.add_argument("--ports", default="5701,5702,5703")
    cluster.add_argument("--epmd-port", type=int, default=0, help="4.0, 4.3: default 4370, 4371")
    cluster.add_argument("--conf", nargs="*", default=[], metavar="KEY=VALUE")
    cluster.add_argument("--base-dir", type=Path, default=None, help="parent of the nodes' dirs")
    cluster.add_argument("--root", type=Path, default=None)
    cluster.add_argument("--purge", action="store_true", help="stop: delete the files too")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0, or 1 on an error (printed to stderr).
    """
    arguments = _parser().parse_args(argv)
    started = time.monotonic()
    try:
        if arguments.command == "root":
            print(build_root(arguments.dir, version=arguments.version))
        elif arguments.command == "start":
            spec = NodeSpec(
                name=arguments.name,
                port=arguments.port,
                version=arguments.version,
                dist_port=arguments.dist_port,
                epmd_port=arguments.epmd_port,
                base_dir=arguments.base_dir,
                conf=_settings(arguments.conf),
                advanced_config=arguments.advanced_config,
                root=arguments.root,
            )
            node = Node(spec)
            node.start(fresh=not arguments.keep_data, timeout_s=arguments.timeout)
            _print_node(node)
        elif arguments.command == "stop":
            found = _find(arguments.name, arguments.version, arguments.base_dir, arguments.root)
            for node in found:
                if arguments.purge:
                    node.remove()
                else:
                    node.stop()
                print(f"stopped {node.nodename} ({node.version}, {node.base_dir})", file=sys.stderr)
        else:
            ports = [int(port) for port in arguments.ports.split(",")]
            members = [(f"atw-c{port}", port) for port in ports]
            options: dict[str, Any] = {
                "version": arguments.version,
                "base_dir": arguments.base_dir,
                "root": arguments.root,
                "epmd_port": arguments.epmd_port,
            }
            if arguments.action == "start":
                nodes = start_cluster(members, conf=_settings(arguments.conf), **options)
                _print_node(nodes[0])
                for number, node in enumerate(nodes, 1):
                    _print_node(node, f"_{number}")
            else:
                nodes = _cluster_nodes(members, conf=None, advanced_config=None, **options)
                # Each node as it was started (its epmd port, root), where its state file is.
                nodes = [Node.load(n.base_dir) if n.state_file.exists() else n for n in nodes]
                stop_cluster(nodes, purge=arguments.purge)
    except (NodeError, ValueError, argparse.ArgumentTypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"({arguments.command}: {time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
