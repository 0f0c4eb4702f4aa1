"""The {{name}} pipeline's steps.

Run as a process (polls REQUEST_QUEUE_URL):  python worker.py
Run on Lambda (SQS event source):            handler = worker.handler
Environment: RELEASE_VERSION (the release it serves), REQUEST_DLQ_URL, PAYLOAD_BUCKET.
"""

from stepline_worker import Request, StepError, Worker


def check(request: Request, order):
    """Refuses what cannot be processed; a non-retryable code ends the execution FAILED."""
    if not isinstance(order, dict) or not order.get("id"):
        raise StepError("INVALID_INPUT", "the input needs an id", retryable=False)
    return {"id": order["id"], "checked": True}


def process(request: Request, checked):
    """Runs once per launch: redeliveries of the same launch are answered from memory."""
    return {**checked, "processed": True, "attempt": request.attempt}


STEPS = {"check": check, "process": process}

worker = Worker(STEPS)
handler = worker.lambda_handler

if __name__ == "__main__":
    worker.poll()
