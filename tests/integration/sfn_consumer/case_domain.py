from async_task_api_worker.sfn import run_handler
from tests.integration.sfn_consumer.cases import AssetRejected, CaseRequest


def handle(request: CaseRequest) -> dict[str, object]:
    raise AssetRejected("the asset is not valid")


if __name__ == "__main__":
    run_handler(CaseRequest, handle)
