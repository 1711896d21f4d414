"""WORKER_EVENT_LOOP: asyncio's loop, uvloop, or uvloop when installed (runtime/loops.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from async_task_api_worker.errors import SettingsError
from async_task_api_worker.runtime.loops import loop_factory, run_on
from async_task_api_worker.settings import EventLoopKind, load_settings


def _hide_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes every import of the name raise ImportError.
    monkeypatch.setitem(sys.modules, "uvloop", None)


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_the_setting_defaults_to_auto_and_refuses_other_names() -> None:
    assert load_settings({}).worker_event_loop is EventLoopKind.AUTO
    with pytest.raises(SettingsError, match="WORKER_EVENT_LOOP"):
        load_settings({"worker_event_loop": "trio"})


def test_asyncio_runs_on_the_standard_loop() -> None:
    assert loop_factory(EventLoopKind.ASYNCIO) is None
    assert run_on(EventLoopKind.ASYNCIO, _loop_module()).startswith("asyncio")


def test_uvloop_runs_on_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert run_on(EventLoopKind.UVLOOP, _loop_module()).startswith("uvloop")
    assert run_on(EventLoopKind.AUTO, _loop_module()).startswith("uvloop")


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_uvloop(monkeypatch)
    assert loop_factory(EventLoopKind.AUTO) is None
    assert run_on(EventLoopKind.AUTO, _loop_module()).startswith("asyncio")


def test_uvloop_asked_for_but_missing_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hide_uvloop(monkeypatch)
    main = _loop_module()
    with pytest.raises(SettingsError, match=r"uvloop is not installed.*`uvloop` extra"):
        run_on(EventLoopKind.UVLOOP, main)
    assert main.cr_frame is None  # closed: no "never awaited" warning
