from async_task_api_worker.sfn import run_handler
from tests.integration.sfn_consumer.cases import CaseRequest


class NotInTheRegistry(Exception):
    pass


def handle(request: CaseRequest) -> dict[str, object]:
    raise NotInTheRegistry("nobody knows me")


if __name__ == "__main__":
    run_handler(CaseRequest, handle)
