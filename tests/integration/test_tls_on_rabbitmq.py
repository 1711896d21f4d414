"""TLS end to end: worker processes and the client on a RabbitMQ node's TLS listener.

One node for the module (the machine's 3.10 binaries, ``scripts/rabbitmq_nodes.py``), its
certificates made here by trustme: a TLS listener that verifies a client certificate when one is
given (``verify_peer``) and takes a connection without one (``fail_if_no_peer_cert = false``),
so that server-verified TLS and mutual TLS run on the same listener. The server certificate
names ``localhost`` only: ``127.0.0.1`` is a name mismatch.

A worker that cannot succeed exits 2 with one line, at its first attempt (no retry warning),
within one attempt's timeout and the client-certificate probe's wait (``link.ATTEMPT_TIMEOUT_S
+ tls.TLS_PROBE_WAIT_S``) of its last line before it connects.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import trustme

from async_task_api_worker.client import TaskClient
from async_task_api_worker.transports.rabbitmq.link import ATTEMPT_TIMEOUT_S
from async_task_api_worker.transports.rabbitmq.tls import TLS_PROBE_WAIT_S
from scripts.rabbitmq_nodes import HOST_BIN, NodeSpec, running_node
from tests.integration.conftest import Queues
from tests.ports import free_port, node_name, node_port

TARGET = "examples.count_words:worker"
SERVICE = "count-words"


def _needed(ready: bool, message: str) -> None:
    if not ready:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: integration tests must run)")
        pytest.skip(message)


class TLSNode:
    """The node's TLS port and the PEM files of the module's certificates."""

    def __init__(self, port: int, files: dict[str, Path]) -> None:
        self.port = port
        self.files = files

    def url(self, host: str = "localhost", **options: str) -> str:
        query = "&".join(f"{name}={value}" for name, value in options.items())
        return f"amqps://guest:guest@{host}:{self.port}/" + (f"?{query}" if query else "")


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSNode]:
    _needed(os.geteuid() == 0, "starting RabbitMQ nodes needs root")
    _needed((HOST_BIN / "rabbitmq-server").exists(), f"no {HOST_BIN / 'rabbitmq-server'}")
    folder = tmp_path_factory.mktemp("tls-node")
    ca, stranger = trustme.CA(), trustme.CA()
    files = {name: folder / f"{name}.pem" for name in ("ca", "server", "key", "client", "other")}
    ca.cert_pem.write_to_path(files["ca"])
    server = ca.issue_cert("localhost")
    server.cert_chain_pems[0].write_to_path(files["server"])
    server.private_key_pem.write_to_path(files["key"])
    ca.issue_cert("client.test").private_key_and_cert_chain_pem.write_to_path(files["client"])
    stranger.issue_cert("client.test").private_key_and_cert_chain_pem.write_to_path(files["other"])
    files["other_ca"] = folder / "other_ca.pem"
    stranger.cert_pem.write_to_path(files["other_ca"])
    tls_port = free_port()
    spec = NodeSpec(
        name=node_name("atw-t-tls"),
        port=node_port(),
        base_dir=folder / "node",
        conf={
            "listeners.ssl.default": f"127.0.0.1:{tls_port}",
            "ssl_options.cacertfile": str(files["ca"]),
            "ssl_options.certfile": str(files["server"]),
            "ssl_options.keyfile": str(files["key"]),
            "ssl_options.verify": "verify_peer",
            "ssl_options.fail_if_no_peer_cert": "false",
        },
    )
    with running_node(spec):
        yield TLSNode(tls_port, files)


def _env(url: str) -> dict[str, str]:
    queues = Queues("unused", name=SERVICE)
    return queues.env(BROKER_URL=url, IN_QUEUE_NAME="tls_in", OUT_QUEUE_NAME="tls_out")


async def _served(url: str) -> list[str]:
    """Submit one task over ``url`` and return its reports' types."""
    client = TaskClient(url=url, service=SERVICE, in_queue="tls_in", out_queue="tls_out")
    async with client:
        task_id = await client.submit({"text": "hello big world"})
        types = []
        async for report in client.reports(task_id):
            types.append(report.type)
        return types


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"cafile": "ca"}, id="server-verified"),
        pytest.param({"cafile": "ca", "certfile": "client"}, id="mutual-tls"),
    ],
)
@pytest.mark.timeout(120)
def test_a_worker_serves_over_tls(
    tls_node: TLSNode, start_worker: Any, options: dict[str, str]
) -> None:
    query = {name: str(tls_node.files[file]) for name, file in options.items()}
    # 127.0.0.1 with the certificate's name given: server_name_indication in use (uvloop's too).
    url = tls_node.url("127.0.0.1", server_name_indication="localhost", **query)
    worker = start_worker(TARGET, _env(url))
    reports = asyncio.run(_served(tls_node.url(**query)))  # the client over TLS too
    assert (reports[0], reports[-1]) == ("started", "success")
    worker.stop()
    assert "Cannot reach the broker" not in worker.log()


@pytest.mark.parametrize(
    ("host", "options", "said"),
    [
        pytest.param("localhost", {}, "the broker's certificate is not trusted (", id="system-cas"),
        pytest.param(
            "localhost",
            {"cafile": "other_ca"},
            "the broker's certificate is not trusted (",
            id="another-ca",
        ),
        pytest.param(
            "127.0.0.1",
            {"cafile": "ca"},
            "the broker's certificate does not match the host name (",
            id="name-mismatch",
        ),
        pytest.param(
            "localhost",
            {"cafile": "ca", "certfile": "other"},
            "the broker refused the client certificate (",
            id="refused-client-certificate",
        ),
    ],
)
@pytest.mark.timeout(120)
def test_a_tls_failure_exits_2_at_once_saying_which(
    tls_node: TLSNode, start_worker: Any, host: str, options: dict[str, str], said: str
) -> None:
    query = {name: str(tls_node.files[file]) for name, file in options.items()}
    worker = start_worker(TARGET, _env(tls_node.url(host, **query)), wait_connected=False)
    assert worker.wait(timeout_s=60) == 2
    ended = time.time()
    error = worker.stderr_path.read_text().splitlines()
    assert len(error) == 1, error
    assert error[0].startswith(f"async-task-api-worker: TLS with amqps://guest:***@{host}:")
    assert said in error[0]
    assert "Cannot reach the broker" not in worker.stdout()  # not retried
    last = json.loads(worker.stdout().splitlines()[-1])  # its last line before it connects
    began = datetime.fromisoformat(last["ts"].replace("Z", "+00:00")).timestamp()
    assert ended - began <= ATTEMPT_TIMEOUT_S + TLS_PROBE_WAIT_S


@pytest.mark.timeout(120)
def test_a_node_whose_certificate_fails_hands_over_to_the_next_url(
    tls_node: TLSNode, start_worker: Any
) -> None:
    # A rotation across a cluster: one node's certificate is not trusted (yet), another's is.
    # The failure is that URL's: the worker names it, takes the next one and serves.
    bad = tls_node.url(cafile=str(tls_node.files["other_ca"]))
    good = tls_node.url(cafile=str(tls_node.files["ca"]))
    worker = start_worker(TARGET, _env(f"{bad},{good}"))
    reports = asyncio.run(_served(good))
    assert (reports[0], reports[-1]) == ("started", "success")
    worker.stop()
    assert worker.process.returncode == 0
    assert "the broker's certificate is not trusted" in worker.log()
