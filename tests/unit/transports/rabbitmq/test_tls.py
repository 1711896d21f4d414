"""TLS: the one context (``tls.tls_context``) and the words for each failure (``failures``).

Every TLS failure here is a real one: a client and a server shake hands in memory (two
``ssl.MemoryBIO`` pairs, no socket), with certificates made by trustme, and the client's error
is wrapped as aiormq wraps it (``AMQPConnectionError(*error.args) from error``).
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import threading
from pathlib import Path

import aiormq
import pytest
import trustme

from async_task_api_worker.errors import SettingsError
from async_task_api_worker.settings import split_broker_urls
from async_task_api_worker.transports.rabbitmq.failures import (
    closed_by_broker,
    connect_failure,
    tls_refusal,
)
from async_task_api_worker.transports.rabbitmq.tls import tls_context, tls_failure

HOST = "broker.test"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The CA, a client certificate it signed, and one another CA signed, as PEM files."""
    folder = tmp_path_factory.mktemp("tls")
    paths = {name: folder / f"{name}.pem" for name in ("ca", "client", "stranger", "other_ca")}
    ca.cert_pem.write_to_path(paths["ca"])
    ca.issue_cert("client.test").private_key_and_cert_chain_pem.write_to_path(paths["client"])
    other = trustme.CA()
    other.cert_pem.write_to_path(paths["other_ca"])
    other.issue_cert("client.test").private_key_and_cert_chain_pem.write_to_path(paths["stranger"])
    return paths


def _server(ca: trustme.CA, *, client_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HOST).configure_cert(context)
    if client_certificate:  # RabbitMQ's verify_peer + fail_if_no_peer_cert
        ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, name: str = HOST) -> None:
    """Shake hands in memory, then read as the AMQP client does first; raise the client's error.

    The server's own failure (a client certificate it refuses) reaches the client as the alert
    it sends, which is what the client raises on its next read.
    """
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    from_client, from_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    near = client.wrap_bio(to_client, to_server, server_hostname=name)
    far = server.wrap_bio(from_client, from_server, server_side=True)
    near_done = far_done = False
    for _ in range(20):
        if not near_done:
            try:
                near.do_handshake()
                near_done = True
            except ssl.SSLWantReadError:
                pass
        from_client.write(to_server.read())
        if not far_done:
            try:
                far.do_handshake()
                far_done = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                far_done = True  # refused: its alert is on its way to the client
        to_client.write(from_server.read())
        if near_done and far_done:
            break
    try:
        near.read(1)
    except ssl.SSLWantReadError:
        return  # accepted: the server waits for the AMQP header


def _as_aiormq_raises(
    client: ssl.SSLContext, server: ssl.SSLContext, name: str = HOST
) -> Exception:
    try:
        _handshake(client, server, name)
    except ssl.SSLError as error:
        wrapped = aiormq.exceptions.AMQPConnectionError(*error.args)
        wrapped.__cause__ = error
        return wrapped
    raise AssertionError("the handshake succeeded")


def test_an_untrusted_broker_certificate_is_named_with_its_fix(
    ca: trustme.CA, files: dict[str, Path]
) -> None:
    client = tls_context(f"amqps://{HOST}/?cafile={files['other_ca']}")
    assert client is not None
    error = _as_aiormq_raises(client, _server(ca, client_certificate=False))
    why = tls_refusal(error)
    assert why is not None
    assert why.startswith("the broker's certificate is not trusted (")
    assert why.endswith("give the CA that signed it with ?cafile=")
    assert connect_failure(error) == f"TLS: {why}"


def test_a_certificate_for_another_name_is_a_name_mismatch(
    ca: trustme.CA, files: dict[str, Path]
) -> None:
    client = tls_context(f"amqps://other.test/?cafile={files['ca']}")
    assert client is not None
    error = _as_aiormq_raises(client, _server(ca, client_certificate=False), "other.test")
    why = tls_refusal(error)
    assert why is not None
    assert why.startswith("the broker's certificate does not match the host name (")
    assert "other.test" in why and "?server_name_indication=" in why


def test_server_name_indication_checks_that_name_instead_of_the_host(
    ca: trustme.CA, files: dict[str, Path]
) -> None:
    client = tls_context(f"amqps://127.0.0.1/?cafile={files['ca']}&server_name_indication={HOST}")
    assert client is not None
    _handshake(client, _server(ca, client_certificate=False), "127.0.0.1")  # no error


def test_a_client_certificate_the_broker_does_not_trust_is_refused(
    ca: trustme.CA, files: dict[str, Path]
) -> None:
    url = f"amqps://{HOST}/?cafile={files['ca']}&certfile={files['stranger']}"
    client = tls_context(url)
    assert client is not None
    why = tls_refusal(_as_aiormq_raises(client, _server(ca, client_certificate=True)))
    assert why is not None
    assert why.startswith("the broker refused the client certificate (tlsv1 alert unknown ca)")


def test_no_client_certificate_where_the_broker_requires_one_is_refused(
    ca: trustme.CA, files: dict[str, Path]
) -> None:
    client = tls_context(f"amqps://{HOST}/?cafile={files['ca']}")
    assert client is not None
    why = tls_refusal(_as_aiormq_raises(client, _server(ca, client_certificate=True)))
    assert why is not None
    assert why.startswith("the broker refused the connection without a client certificate")


def test_a_client_certificate_the_broker_trusts_is_accepted(
    ca: trustme.CA, files: dict[str, Path]
) -> None:
    client = tls_context(f"amqps://{HOST}/?cafile={files['ca']}&certfile={files['client']}")
    assert client is not None
    _handshake(client, _server(ca, client_certificate=True))


def test_cadata_is_the_ca_in_base64_der(ca: trustme.CA) -> None:
    der = ssl.PEM_cert_to_DER_cert(ca.cert_pem.bytes().decode())
    cadata = base64.b64encode(der).decode().replace("+", "%2B").replace("/", "%2F")
    client = tls_context(f"amqps://{HOST}/?cadata={cadata}")
    assert client is not None
    _handshake(client, _server(ca, client_certificate=False))


def test_no_verify_ssl_turns_every_check_off(ca: trustme.CA) -> None:
    client = tls_context("amqps://elsewhere.test/?no_verify_ssl=1")
    assert client is not None
    assert client.verify_mode == ssl.CERT_NONE
    _handshake(client, _server(ca, client_certificate=False), "elsewhere.test")


def test_amqp_urls_have_no_tls_context() -> None:
    assert tls_context("amqp://guest:guest@localhost:5672/") is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("cafile=/no/such.pem", "its cafile cannot be read (No such file or directory)"),
        ("certfile=/no/such.pem", "its certfile/keyfile cannot be read (No such file or"),
        ("keyfile=/k.pem", "keyfile without certfile"),
        ("cadata=%25%25", "its cadata is not base64"),
    ],
)
def test_unusable_tls_options_are_a_one_line_settings_error(query: str, message: str) -> None:
    with pytest.raises(SettingsError) as error:
        tls_context(f"amqps://u:secret@{HOST}/?{query}")
    assert message in str(error.value)
    assert "secret" not in str(error.value) and "\n" not in str(error.value)


def test_a_file_that_holds_no_certificate_says_so(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(SettingsError, match="its certfile/keyfile holds no usable certificate"):
        tls_context(f"amqps://{HOST}/?certfile={junk}")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("amqp://h/?cafile=/ca.pem", "gives TLS options (cafile) but is amqp://: use amqps://"),
        ("amqps://h/?cacertfile=/ca.pem", "has ?cacertfile=, which this client reads as ?cafile="),
        ("amqps://h/?verify=verify_peer", "has ?verify=, which this client reads as"),
        (
            "amqps://h/?cafile=/ca.pem&certfle=/c.pem",
            "has ?certfle=, an option no client reads (did you mean ?certfile=?)",
        ),
        ("amqp://h/?channel_max=5", "has ?channel_max=, an option no client reads"),
    ],
)
def test_tls_options_are_checked_with_the_url(url: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        split_broker_urls(url)
    assert message in str(error.value)


def test_the_clients_own_options_are_taken() -> None:
    url = "amqps://h/?heartbeat=5&timeout=3&name=w&auth=plain&cafile=/ca.pem&certfile=/c&keyfile=/k"
    assert split_broker_urls(url) == (url,)


def _wrapped(cause: BaseException) -> aiormq.exceptions.AMQPConnectionError:
    wrapped = aiormq.exceptions.AMQPConnectionError(*cause.args)
    wrapped.__cause__ = cause
    return wrapped


def test_the_causes_of_a_failed_connect_are_named() -> None:
    with pytest.raises(socket.gaierror) as resolving:
        socket.getaddrinfo("no-such-host.invalid", 5671)
    assert connect_failure(_wrapped(resolving.value)).startswith("name not resolved: ")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        with pytest.raises(ConnectionRefusedError) as refused, socket.socket() as client:
            client.connect(("127.0.0.1", port))
    assert connect_failure(_wrapped(refused.value)) == "connection refused"
    assert connect_failure(TimeoutError()) == "timed out"  # asyncio.wait_for's
    reset = aiormq.exceptions.AMQPConnectionError("Server connection reset: ...")
    reset.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    assert connect_failure(reset) == "connection reset by the broker"
    assert closed_by_broker(reset) and not closed_by_broker(_wrapped(refused.value))
    short = aiormq.exceptions.AMQPConnectionError("Server connection unexpectedly closed")
    short.__cause__ = asyncio.IncompleteReadError(b"", 1)
    assert closed_by_broker(short)


def test_a_looping_chain_of_causes_ends() -> None:
    first, second = ConnectionError("a"), ConnectionError("b")
    first.__context__, second.__context__ = second, first  # aiormq's chains do loop
    assert connect_failure(first) == "ConnectionError"
    assert tls_refusal(first) is None


def _tls_listener(server: ssl.SSLContext, connections: int) -> tuple[int, threading.Thread]:
    """A blocking TLS server that shakes hands ``connections`` times, then sends nothing.

    OpenSSL's own server writes its alert to the socket when it refuses a client certificate,
    as RabbitMQ's does (asyncio's drops the connection without it).
    """
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            for _ in range(connections):
                raw, _address = listener.accept()
                with raw:
                    try:
                        with server.wrap_socket(raw, server_side=True) as tls:
                            tls.recv(1)  # the client sends nothing: it closes first
                    except (ssl.SSLError, OSError):
                        pass  # refused: the alert is sent

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


async def test_a_reset_after_the_handshake_is_asked_again_for_the_brokers_alert(
    ca: trustme.CA, files: dict[str, Path]
) -> None:
    """TLS 1.3: the refusal of a client certificate comes after the client's handshake."""
    port, serving = _tls_listener(_server(ca, client_certificate=True), connections=2)
    reset = aiormq.exceptions.AMQPConnectionError("Server connection reset: ...")
    reset.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    url = f"amqps://127.0.0.1:{port}/?cafile={files['ca']}&server_name_indication={HOST}"
    why = await tls_failure(reset, url, tls_context(url), None)
    assert why is not None
    assert why.startswith("the broker refused the connection without a client certificate")
    accepting = f"{url}&certfile={files['client']}"
    # Accepted: the server waits in silence, as RabbitMQ does for the AMQP header; retried.
    assert await tls_failure(reset, accepting, tls_context(accepting), 0.5) is None
    assert await tls_failure(reset, "amqp://127.0.0.1/", None, None) is None  # no TLS: no probe
    await asyncio.to_thread(serving.join)
