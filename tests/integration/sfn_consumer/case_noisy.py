import sys

from async_task_api_worker.sfn import run_handler
from tests.integration.sfn_consumer.cases import CaseRequest


def handle(request: CaseRequest) -> dict[str, object]:
    print("connecting to amqp://worker:S3CRET-PW-91@broker:5672/ now", file=sys.stderr)
    return {"ok": True}


if __name__ == "__main__":
    run_handler(CaseRequest, handle)
