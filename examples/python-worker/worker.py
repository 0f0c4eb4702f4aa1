"""Example Stepline worker for the `py-orders` pipeline (pipeline.yaml), using stepline_worker.

Steps, all on the request queue py-orders-requests; each passes the order along, adding fields:

    validate  the input must have a non-empty string orderId (else INVALID_ORDER, not retryable)
    reserve   fails with STOCK_BUSY (retryable) on attempt 1, succeeds from attempt 2 on;
              adds reservedOnAttempt
    pack      sleeps input["packSecs"] seconds (default 0), which may be longer than the step's
              timeoutSecs: only the runtime's heartbeats keep the attempt alive; adds packed: true

Run as a process:   RELEASE_VERSION=1 REQUEST_QUEUE_URL=... REQUEST_DLQ_URL=... python worker.py
On AWS Lambda:      handler "worker.handler" (SQS event source with ReportBatchItemFailures)
"""

import time

from stepline_worker import Request, StepError, Worker


def validate(request: Request, order):
    order_id = order.get("orderId") if isinstance(order, dict) else None
    if not isinstance(order_id, str) or not order_id:
        raise StepError("INVALID_ORDER", "the order needs a non-empty string orderId", retryable=False)
    return dict(order)


def reserve(request: Request, order):
    if request.attempt < 2:
        raise StepError("STOCK_BUSY", f"stock for {order['orderId']} is busy, try again", retryable=True)
    return {**order, "reservedOnAttempt": request.attempt}


def pack(request: Request, order):
    time.sleep(float(order.get("packSecs", 0)))
    return {**order, "orderId": order["orderId"],
            "reservedOnAttempt": order.get("reservedOnAttempt"), "packed": True}


STEPS = {"validate": validate, "reserve": reserve, "pack": pack}

_worker = None


def handler(event, context):
    """AWS Lambda entry point. The worker is created once per container, so its
    deduplication store survives warm invocations."""
    global _worker
    if _worker is None:
        _worker = Worker(STEPS)
    return _worker.lambda_handler(event, context)


if __name__ == "__main__":
    Worker(STEPS).poll()
