"""The example worker behind a Step Functions ``waitForTaskToken`` state, all on moto's server.

Run it with moto's server up in Step Functions' execute mode (docs/sfn.md, "A runnable recipe
on moto")::

    uv run python -m moto.server -p 5000 &
    curl -X POST -H 'Content-Type: application/json' \
      -d '{"stepfunctions": {"execute_state_machine": true}}' http://127.0.0.1:5000/moto-api/config
    uv run python -m examples.sfn_on_moto --endpoint-url http://127.0.0.1:5000 hello big world

It creates an SQS queue and a state machine whose one state sends the execution's input and the
task token to it, starts ``examples.count_words:worker`` on that queue
(``WORKER_TRANSPORT=sqs-sfn``), starts one execution per text given, prints each execution's
status and output, stops the worker and exits 0 when every execution succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import boto3

#: Any region and keys do on moto; the worker reads the same ones from its environment.
AWS = {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
       "AWS_SECRET_ACCESS_KEY": "testing"}  # fmt: skip
ROLE = "arn:aws:iam::123456789012:role/count-words"


def state_machine(queue_url: str) -> dict[str, Any]:
    """One state: send ``text`` and the task token to the queue, wait for the worker's answer.

    ``HeartbeatSeconds`` is needed on moto, which refuses a heartbeat for a state without it.
    """
    return {
        "StartAt": "CountWords",
        "States": {
            "CountWords": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                "HeartbeatSeconds": 60,
                "Parameters": {
                    "QueueUrl": queue_url,
                    "MessageBody": {"task_token.$": "$$.Task.Token", "text.$": "$.text"},
                },
                "End": True,
            }
        },
    }


def finished(sfn: Any, execution_arn: str, timeout_s: float) -> dict[str, Any]:
    """The execution once it is no longer RUNNING (polled: Step Functions has no push)."""
    deadline = time.monotonic() + timeout_s
    while (described := sfn.describe_execution(executionArn=execution_arn))["status"] == "RUNNING":
        if time.monotonic() > deadline:
            raise SystemExit(f"{execution_arn} still RUNNING after {timeout_s:g} s")
        time.sleep(0.2)
    return dict(described)


def main(argv: list[str] | None = None) -> int:
    """Set up, run the executions, print their outcomes; 0 when all succeeded, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint-url", default="http://127.0.0.1:5000", help="moto's server")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per execution")
    parser.add_argument("texts", nargs="+", help="one execution per text")
    args = parser.parse_args(argv)

    keys = {"endpoint_url": args.endpoint_url, "region_name": AWS["AWS_DEFAULT_REGION"],
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}  # fmt: skip
    sqs = boto3.client("sqs", **keys)
    sfn = boto3.client("stepfunctions", **keys)
    run_id = uuid.uuid4().hex[:8]  # names of this run's own: a second run never collides
    queue_url = sqs.create_queue(QueueName=f"count-words-{run_id}")["QueueUrl"]
    machine_arn = sfn.create_state_machine(
        name=f"count-words-{run_id}",
        definition=json.dumps(state_machine(queue_url)),
        roleArn=ROLE,
    )["stateMachineArn"]

    worker = subprocess.Popen(
        [sys.executable, "-m", "async_task_api_worker", "run", "examples.count_words:worker"],
        env={
            **os.environ,
            **AWS,
            "AWS_ENDPOINT_URL": args.endpoint_url,
            "WORKER_TRANSPORT": "sqs-sfn",
            "SQS_QUEUE_URL": queue_url,
            "SQS_WAIT_TIME_S": "1",  # moto answers a long poll at its end, not on arrival
            "HEALTH_CHECK_PORT": os.environ.get("HEALTH_CHECK_PORT", "0"),
        },
        stdout=subprocess.DEVNULL,  # its logs; leave them on to watch it work
    )
    status = 0
    try:
        for text in args.texts:
            # An execution's name is unique per state machine for 90 days: a start_execution
            # without a new one fails the second time (ExecutionAlreadyExists).
            execution_arn = sfn.start_execution(
                stateMachineArn=machine_arn,
                name=f"count-{uuid.uuid4().hex}",
                input=json.dumps({"text": text}),
            )["executionArn"]
            result = finished(sfn, execution_arn, args.timeout_s)
            shown = result.get("output") or result.get("error") or result.get("cause") or ""
            print(f"{result['status']} {shown}")
            status = status or (result["status"] != "SUCCEEDED")
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        sfn.delete_state_machine(stateMachineArn=machine_arn)
        sqs.delete_queue(QueueUrl=queue_url)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
