"""Settings: environment variables, defaults, one-line errors, the time-budget rule."""

from __future__ import annotations

from urllib.parse import urlencode

import aiormq.connection
import pytest
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from async_task_api_worker.broker_rules import (
    consumer_timeout_s,
    delivery_budget_s,
    heartbeat_in_force_s,
    lease_expiry_s,
)
from async_task_api_worker.errors import SettingsError, TimeBudgetError
from async_task_api_worker.settings import (
    EventLoopKind,
    LogLevel,
    WorkerMode,
    WorkerSettings,
    check_time_budget,
    load_settings,
)


def test_defaults_match_the_documented_table() -> None:
    settings = load_settings(read_environment=False)
    assert settings.broker_url.get_secret_value() == "amqp://guest:guest@localhost:5672/"
    assert settings.worker_mode is WorkerMode.SERVICE
    assert settings.worker_concurrency == 1
    assert settings.worker_task_timeout_s is None
    assert settings.worker_delivery_limit == 5
    assert settings.worker_retry_backoff_s == 1.0
    assert settings.worker_retry_backoff_max_s == 30.0
    assert settings.worker_consumer_timeout_s == 1800.0
    assert settings.worker_progress_min_interval_s == 1.0
    assert settings.worker_shutdown_grace_s == 25.0
    assert settings.worker_shutdown_hooks_timeout_s == 5.0
    assert settings.worker_job_max_deliveries == 1
    assert settings.worker_job_idle_timeout_s == 30.0
    assert settings.worker_job_connect_timeout_s == 30.0
    assert settings.worker_max_message_bytes == 16 * 1024 * 1024
    assert (settings.health_check_host, settings.health_check_port) == ("0.0.0.0", 8083)
    assert settings.log_level is LogLevel.INFO
    assert settings.worker_event_loop is EventLoopKind.AUTO


def test_every_setting_is_read_from_its_upper_case_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BROKER_URL", "amqp://u:p@broker:5672/vh")
    monkeypatch.setenv("IN_QUEUE_NAME", "in-q")
    monkeypatch.setenv("OUT_QUEUE_NAME", "out-q")
    monkeypatch.setenv("WORKER_MODE", "job")
    monkeypatch.setenv("WORKER_CONCURRENCY", "4")
    monkeypatch.setenv("WORKER_TASK_TIMEOUT_S", "12.5")
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("WORKER_EVENT_LOOP", "asyncio")
    settings = load_settings()
    assert settings.broker_url.get_secret_value() == "amqp://u:p@broker:5672/vh"
    assert (settings.in_queue("svc"), settings.out_queue("svc")) == ("in-q", "out-q")
    assert settings.worker_mode is WorkerMode.JOB
    assert settings.worker_concurrency == 4
    assert settings.task_timeout_s(30) == 12.5
    assert settings.log_level is LogLevel.DEBUG
    assert settings.worker_event_loop is EventLoopKind.ASYNCIO


def test_queue_names_default_to_the_service_name() -> None:
    settings = load_settings(read_environment=False)
    assert settings.in_queue("count-words") == "count-words_queue_in"
    assert settings.out_queue("count-words") == "count-words_queue_out"
    assert settings.task_timeout_s(30) == 30


def test_the_broker_password_never_shows_in_the_settings_repr() -> None:
    settings = load_settings({"broker_url": "amqp://u:hunter2@h/"}, read_environment=False)
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("WORKER_DELIVERY_LIMIT", "0", "invalid setting WORKER_DELIVERY_LIMIT: "),
        ("WORKER_CONCURRENCY", "many", "invalid setting WORKER_CONCURRENCY (--concurrency): "),
        ("WORKER_MODE", "batch", "invalid setting WORKER_MODE: "),
        ("WORKER_TASK_TIMEOUT_S", "-1", "invalid setting WORKER_TASK_TIMEOUT_S: "),
        ("WORKER_SHUTDOWN_GRACE_S", "nan", "invalid setting WORKER_SHUTDOWN_GRACE_S: "),
        ("HEALTH_CHECK_PORT", "70000", "invalid setting HEALTH_CHECK_PORT (--health-port): "),
        ("LOG_LEVEL", "LOUD", "invalid setting LOG_LEVEL (--log-level): "),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable_not_the_value(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as error:
        load_settings()
    message = str(error.value)
    assert message.startswith(expected)
    assert "\n" not in message
    assert value not in message.removeprefix(expected).split(":")[0]


def test_several_bad_settings_are_counted_on_the_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_DELIVERY_LIMIT", "0")
    monkeypatch.setenv("WORKER_CONCURRENCY", "0")
    with pytest.raises(SettingsError, match=r"\(and 1 more\)$"):
        load_settings()


def test_an_unknown_override_is_refused() -> None:
    with pytest.raises(SettingsError, match="invalid setting WORKER_DELIVERY_LIMT"):
        load_settings({"worker_delivery_limt": 3}, read_environment=False)


def test_values_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_DELIVERY_LIMIT", "9")
    assert load_settings({"worker_delivery_limit": 3}).worker_delivery_limit == 3
    assert load_settings().worker_delivery_limit == 9
    assert WorkerSettings().worker_delivery_limit == 9


def test_the_settings_are_frozen() -> None:
    settings = load_settings(read_environment=False)
    with pytest.raises(ValueError, match="frozen"):
        settings.worker_delivery_limit = 3  # type: ignore[misc]


def test_the_budget_rule_holds_with_the_defaults_and_a_29_minute_task() -> None:
    settings = load_settings(read_environment=False)
    assert check_time_budget(settings, 1706.0) == 1706.0  # 1706 + 30 + 1 + 2 + 60 = 1799


@pytest.mark.parametrize(
    ("values", "declared_s"),
    [
        ({}, 1707.0),  # 1707 + 30 + 1 + 2 + 60 = 1800, not under 1800
        ({"worker_task_timeout_s": 5000}, 10.0),  # the override is what counts
        ({"worker_consumer_timeout_s": 100, "worker_retry_backoff_max_s": 30}, 10.0),
    ],
)
def test_the_budget_rule_fails_with_the_numbers(
    values: dict[str, float], declared_s: float
) -> None:
    settings = load_settings(values, read_environment=False)
    with pytest.raises(TimeBudgetError) as error:
        check_time_budget(settings, declared_s)
    message = str(error.value)
    assert "must be under WORKER_CONSUMER_TIMEOUT_S" in message
    assert "\n" not in message
    assert isinstance(error.value, SettingsError)


def test_the_budget_uses_the_override_when_it_fits() -> None:
    settings = load_settings({"worker_task_timeout_s": 10}, read_environment=False)
    assert check_time_budget(settings, 5000.0) == 10.0


@pytest.mark.parametrize("url", ["http://u:pw@h/", "localhost:5672"])
def test_the_broker_url_must_be_amqp(url: str) -> None:
    # The flag that may have set it is named with the variable (settings.SETTING_FLAGS).
    named = r"invalid setting BROKER_URL \(--broker-url\): .*amqp://"
    with pytest.raises(SettingsError, match=named) as error:
        load_settings({"broker_url": url}, read_environment=False)
    assert "pw" not in str(error.value)


def test_an_amqps_url_is_accepted() -> None:
    url = "amqps://u:p@h:5671/v"
    assert (
        load_settings({"broker_url": url}, read_environment=False).broker_url.get_secret_value()
        == url
    )


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("amqp://u:pw@h:99999/", "port out of 1..65535"),
        ("amqp://u:pw@h:0/", "port out of 1..65535"),
        ("amqp://u:pw@:5672/", "names no host"),
        ("amqp:///vhost", "names no host"),
        ("http://u:pw@h/", "amqp:// or amqps://"),
        ("amqp://u:pw@a:5672/ amqp://u:pw@b:5672/", "white space"),
        ("amqp://u:pw@a:5672/,", "URL 2 of 2 is empty"),
        ("", "the URL is empty"),
        ("amqp://u:pw@a:5672/,amqp://u:pw@b:70000/", "URL 2 of 2 has a port out of"),
    ],
)
def test_an_invalid_broker_url_is_a_one_line_settings_error(url: str, rule: str) -> None:
    with pytest.raises(SettingsError, match=r"invalid setting BROKER_URL") as error:
        load_settings({"broker_url": url}, read_environment=False)
    message = str(error.value)
    assert rule in message
    assert "Value error" not in message  # pydantic's wording stays out
    assert "pw" not in message and "\n" not in message


def test_several_broker_urls_are_tried_in_the_order_given() -> None:
    settings = load_settings(
        {"broker_url": "amqp://a:1@n1:5701/v, amqps://b:2@n2/v"}, read_environment=False
    )
    assert settings.broker_urls() == ("amqp://a:1@n1:5701/v", "amqps://b:2@n2/v")


def test_the_budget_margin_is_the_consumer_timeout_check_interval() -> None:
    settings = load_settings(
        {
            "worker_consumer_timeout_s": 20,
            "worker_consumer_timeout_check_interval_s": 2,
            "worker_retry_backoff_max_s": 1,
        },
        read_environment=False,
    )
    # the cancel grace (1 s) and the report's confirm (2 s) are in it: 13.9 + 1 + 1 + 2 + 2 < 20
    assert check_time_budget(settings, 13.9) == 13.9
    assert settings.delivery_hold_s(13.9) == 18.0
    with pytest.raises(TimeBudgetError) as error:
        check_time_budget(settings, 14.0)
    message = str(error.value)
    assert "WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S 2 s = 20 s" in message
    assert "raise the broker's consumer_timeout" in message
    assert "lower the task timeout or WORKER_RETRY_BACKOFF_MAX_S" in message


def test_the_consumer_timeout_is_the_setting_while_the_budget_fits_under_it() -> None:
    settings = load_settings(read_environment=False)
    assert consumer_timeout_s(settings, 1706.0) == 1800.0
    assert settings.delivery_hold_s(1706.0) == 1740.0


def test_a_longer_task_gets_a_consumer_timeout_of_its_own_budget() -> None:
    settings = load_settings(read_environment=False)
    # 5000 + 30 + 1 + 2 + 60 = 5093 s, rounded up, + 1 s: what RabbitMQ 4.3+ is asked for
    assert consumer_timeout_s(settings, 5000.0) == 5094.0
    assert settings.delivery_hold_s(5000.0) == 5034.0  # the hold follows it
    assert consumer_timeout_s(settings, 5000.0) > delivery_budget_s(settings, 5000.0) + 60


def test_the_hand_out_limit_is_at_least_the_delivery_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(read_environment=False).worker_acquired_limit == 25
    monkeypatch.setenv("WORKER_DELIVERY_LIMIT", "30")  # above the default hand-out limit
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert str(error.value) == (
        "invalid setting WORKER_ACQUIRED_LIMIT: must be at least WORKER_DELIVERY_LIMIT (every "
        "attempt is a hand-out too; raise WORKER_ACQUIRED_LIMIT)"
    )
    monkeypatch.setenv("WORKER_ACQUIRED_LIMIT", "30")
    assert load_settings().worker_acquired_limit == 30


def test_a_task_processs_lease_expires_after_two_heartbeats_in_force() -> None:
    def expiry(**values: object) -> float | None:
        return lease_expiry_s(load_settings(values, read_environment=False))

    assert expiry() == 30.0  # BROKER_HEARTBEAT_S 15
    assert expiry(broker_heartbeat_s=2) == 4.0
    assert expiry(broker_url="amqp://h/?heartbeat=5", broker_heartbeat_s=2) == 10.0
    assert expiry(broker_url="amqp://a/?heartbeat=0,amqp://b/?heartbeat=3") == 6.0  # the longest
    assert expiry(broker_url="amqp://h/?heartbeat=0") is None  # no heartbeat, no lease
    sqs = {"worker_transport": "sqs-sfn", "sqs_queue_url": "https://sqs.example/1/q"}
    assert expiry(**sqs, sfn_heartbeat_interval_s=0.5) == 1.0


@given(st.text())
def test_a_urls_own_heartbeat_is_read_as_the_amqp_client_reads_it(value: str) -> None:
    url = "amqp://broker/vhost?" + urlencode({"heartbeat": value})
    in_force = aiormq.connection.parse_heartbeat(URL(url).query["heartbeat"])
    assert heartbeat_in_force_s(url, 15) == in_force
    assert heartbeat_in_force_s("amqp://broker/vhost", 15) == 15
