"""The RabbitMQ transport (aio-pika): the production broker of the AsyncTaskAPI platform."""

from async_task_api_worker.transports.rabbitmq.transport import RabbitMQTransport

__all__ = ["RabbitMQTransport"]
