from async_task_api_worker.sfn import run_handler
from tests.integration.sfn_consumer.cases import CaseRequest


def handle(request: CaseRequest) -> dict[str, object]:
    return {"text": "half of a pair: \ud800"}


if __name__ == "__main__":
    run_handler(CaseRequest, handle)
