"""Transports: brokers behind :class:`~async_task_api_worker.ports.Transport`.

This package imports nothing on purpose: import the transport you use
(``async_task_api_worker.transports.memory``), so that no broker client is loaded for nothing.
"""
