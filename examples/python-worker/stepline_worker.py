"""Stepline worker runtime for Python (worker protocol version 1).

Runs the steps of one pipeline release as an SQS request/reply worker, as described in
docs/protocol.md. The only dependency is boto3; copy this file next to your step code.

    from stepline_worker import StepError, Worker

    def validate(request, order):
        if not order.get("orderId"):
            raise StepError("INVALID_ORDER", "orderId is required", retryable=False)
        return order

    worker = Worker({"validate": validate})
    handler = worker.lambda_handler      # on AWS Lambda (SQS event source with ReportBatchItemFailures)
    if __name__ == "__main__":
        worker.poll()                    # as a long-running process

A step is a function ``step(request: Request, input) -> output``: ``input`` is the step's input
with every payload reference already resolved, the return value (any JSON value) is the output.
Raise ``StepError`` to fail the attempt with your own code. Side effects MUST be idempotent on
``request.launch_id``: a request can be delivered (and, across processes, run) more than once.
The messages of a batch are handled in parallel threads, so step functions must be thread-safe.

What the runtime does for each message of the request queue:

  * checks the header and the worker's identity before looking at the payload; a message that is
    not a request or cancel notice goes to the request DLQ (reason UNDECODABLE), a request for
    another identity too (IDENTITY_MISMATCH, after a non-retryable FAILED reply);
  * runs each launch id once per process: a redelivered request that was answered gets the stored
    reply again, byte for byte; one that is still running, or was cancelled, is acknowledged;
  * resolves payload references in the input, runs the step, offloads a large output to the
    payload bucket, cuts a long error message, and replies to header.replyTo;
  * while the step runs, sends RUNNING heartbeats and extends the message's visibility;
  * deletes (acknowledges) the message once replied or dead-lettered, leaves it otherwise.

And for the worker as a whole (protocol section 18): it announces itself (identity, request queue,
state HEALTHY) on the coordinator's reply queue when it starts taking requests and then every 5
minutes, and DRAINING when poll() stops on SIGTERM or SIGINT. Best effort: a failed announcement is
logged and sent again at the next batch.

Configuration (environment variables):

    RELEASE_VERSION          release this worker is deployed as (required unless release_version=...)
    STEPLINE_CONTRACT_FILE   contract JSON with pipelineId and contractVersion
                             (default: pipeline-contract.json in the current directory)
    REQUEST_QUEUE_URL        request queue for poll(); on Lambda, used to extend message visibility
                             (otherwise derived from the record's eventSourceARN)
    REQUEST_DLQ_URL          the request queue's dead-letter queue, for messages the worker cannot handle
    REPLY_QUEUE_URL          the coordinator's reply queue, where the worker announces itself; poll()
                             then announces at its start (without it: at the first request, on the
                             queue its header.replyTo names)
    PAYLOAD_BUCKET           payload bucket for claim checks (optional)
    PAYLOAD_THRESHOLD_BYTES  outputs and error messages larger than this are offloaded (default 32768)

Error codes this runtime reports itself (besides those of the protocol: PAYLOAD_UNRESOLVABLE,
PAYLOAD_UNAVAILABLE, PAYLOAD_TOO_LARGE, IDENTITY_MISMATCH):

    WORKER_EXCEPTION  retryable      step code raised an exception other than StepError
    UNKNOWN_STEP      not retryable  header.stepId names no step of this worker
    INVALID_OUTPUT    not retryable  the step returned a value that is not JSON-serializable

Logging: one JSON object per line on stderr, with an "event" field: "step.ran", "replied",
"duplicate", "heartbeat", "dead-lettered", "cancel", "announced", ... Reply tokens are never logged.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import boto3
from botocore.exceptions import BotoCoreError, ClientError

__all__ = ["StepError", "Request", "Worker"]

REQUEST_KIND = "stepline.request.v1"
CANCEL_KIND = "stepline.cancel.v1"
REPLY_KIND = "stepline.reply.v1"
WORKER_KIND = "stepline.worker.v1"

# Worker states an announcement carries (section 18).
HEALTHY = "HEALTHY"
DRAINING = "DRAINING"
ANNOUNCE_EVERY_SECONDS = 300  # a running worker announces itself at most this often

SQS_MAX_BYTES = 262_144  # largest SQS message (protocol section 2)
INLINE_MAX_BYTES = 204_800  # largest inline output / error message without a payload bucket (section 11)
CUT_MESSAGE_BYTES = 1_024  # what is kept of an offloaded error message (section 12)
DETAIL_MAX_BYTES = 1_024  # stepline.detail dead-letter attribute (section 8)
DEFAULT_THRESHOLD_BYTES = 32_768
U32_MAX = 2**32 - 1

# Error codes of this runtime (see the module docstring).
WORKER_EXCEPTION = "WORKER_EXCEPTION"
UNKNOWN_STEP = "UNKNOWN_STEP"
INVALID_OUTPUT = "INVALID_OUTPUT"

# The only S3 error codes that make a reference unresolvable (section 11); any other S3 error,
# AccessDenied included, is PAYLOAD_UNAVAILABLE (retryable).
_MISSING_S3_CODES = {"NoSuchKey", "NoSuchBucket"}

_log_lock = threading.Lock()


def log(event: str, **fields: Any) -> None:
    """Write one JSON line to stderr."""
    line = json.dumps({"event": event, "at": _now_ms(), **fields}, default=str, ensure_ascii=False)
    with _log_lock:
        print(line, file=sys.stderr, flush=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _compact(value: Any) -> bytes:
    """The compact JSON text of a value, UTF-8: what sizes and digests are computed on."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _text(value: Any) -> str:
    """str(value), with characters UTF-8 cannot encode (lone surrogates) replaced."""
    return str(value).encode("utf-8", "replace").decode("utf-8")


def _cut(text: str, limit: int) -> str:
    """Cut text to at most `limit` UTF-8 bytes on a character boundary, ending with '...'."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


class StepError(Exception):
    """Raise from a step to fail the attempt with a reply FAILED {code, message, retryable}.

    The coordinator retries only if `retryable` is true, the code is not in the step's
    `nonRetryable` list and attempts remain.
    """

    def __init__(self, code: str, message: str, retryable: bool = True):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable

    def to_error(self) -> dict:
        return {"code": _text(self.code), "message": _text(self.message), "retryable": bool(self.retryable)}


class Request:
    """What a step receives besides its input: the request header, decoded.

    `header` is the raw header dict; it holds the reply token, which must never be logged,
    stored or forwarded.
    """

    def __init__(self, header: dict):
        self.header = header
        self.execution_id: str = header["executionId"]
        self.step_id: str = header["stepId"]
        self.step_index: int = header["stepIndex"]
        self.attempt: int = header["attempt"]  # 1-based, counts every attempt of this step
        self.launch_id: str = header["launchId"]  # the idempotency key of this attempt
        # The step's key for side effects: the same for every attempt and re-drive of this step.
        self.step_key: str = header.get("stepKey", "")
        self.tenant: str = header["tenant"]
        self.deadline_ms: int = header["deadline"]  # epoch ms; heartbeats keep a longer step alive
        self.identity: dict = header["identity"]

    def __repr__(self) -> str:  # without the reply token
        return (f"Request(step_id={self.step_id!r}, execution_id={self.execution_id!r}, "
                f"launch_id={self.launch_id!r}, attempt={self.attempt})")


def _s3_error(what: str, error: Exception) -> StepError:
    """A failed S3 call as a step error (section 11): PAYLOAD_UNRESOLVABLE, not retryable, for
    NoSuchKey and NoSuchBucket only; PAYLOAD_UNAVAILABLE, retryable, for anything else."""
    code = error.response.get("Error", {}).get("Code", "") if isinstance(error, ClientError) else ""
    if code in _MISSING_S3_CODES:
        return StepError("PAYLOAD_UNRESOLVABLE", f"{what}: {error}", False)
    return StepError("PAYLOAD_UNAVAILABLE", f"{what}: {error}", True)


def _queue_name(url_or_arn: str | None) -> str:
    """A queue's name from its URL (last path segment) or ARN (last ':' part); '' when unknown."""
    if not url_or_arn:
        return ""
    if url_or_arn.startswith("arn:"):
        return url_or_arn.rsplit(":", 1)[-1]
    return url_or_arn.rstrip("/").rsplit("/", 1)[-1]


def _failed(code: str, message: str, retryable: bool) -> dict:
    return {"status": "FAILED", "error": {"code": code, "message": message, "retryable": retryable}}


def _is_ref(value: Any) -> bool:
    """True for a payload reference: the marker plus bucket, key, size and sha256 of the right types."""
    return (isinstance(value, dict) and value.get("$stepline") == "payload-ref"
            and isinstance(value.get("bucket"), str) and isinstance(value.get("key"), str)
            and isinstance(value.get("size"), int) and not isinstance(value.get("size"), bool)
            and isinstance(value.get("sha256"), str))


def _header_problem(header: dict) -> str | None:
    """Why a request or cancel header is invalid, or None when it is valid (section 4)."""
    for field in ("kind", "tenant", "executionId", "stepId", "launchId", "replyTo"):
        if not isinstance(header.get(field), str):
            return f"header.{field} is missing or not a string"
    for field in ("stepIndex", "attempt", "deadline"):
        value = header.get(field)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"header.{field} is missing or not an integer"
        if field != "deadline" and not 0 <= value <= U32_MAX:
            return f"header.{field} is out of range"
    identity = header.get("identity")
    if not isinstance(identity, dict):
        return "header.identity is missing or not an object"
    for field in ("pipelineId", "contractVersion", "releaseVersion"):
        if not isinstance(identity.get(field), str):
            return f"header.identity.{field} is missing or not a string"
    if header.get("replyToken") is not None and not isinstance(header["replyToken"], str):
        return "header.replyToken is not a string"
    return None


def _reply_text(header: dict, outcome: dict) -> str:
    """A reply (section 5): the request header's fields, copied, plus the outcome."""
    identity = header["identity"]
    reply = {
        "kind": REPLY_KIND,
        # The identity as received (only the fields the protocol defines), not the worker's own.
        "identity": {k: identity[k] for k in ("pipelineId", "contractVersion", "releaseVersion")},
        "executionId": header["executionId"],
        "stepIndex": header["stepIndex"],
        "attempt": header["attempt"],
        "launchId": header["launchId"],
    }
    if header.get("replyToken") is not None:
        reply["replyToken"] = header["replyToken"]  # untouched; omitted when the request had none
    reply["outcome"] = outcome
    return _compact(reply).decode("utf-8")


class _Heartbeat:
    """While a step runs: RUNNING replies and visibility extensions (protocol section 10).

    The interval is max(1 s, (deadline - now) / 3), computed at the start; the first beat comes
    one interval after the start. Each beat also sets the request message's visibility to
    ceil(2 x interval + 30 s) so the queue does not hand it to another worker.
    """

    def __init__(self, worker: Worker, header: dict, receipt: str | None, queue_url: str | None):
        self.worker, self.header, self.receipt, self.queue_url = worker, header, receipt, queue_url
        self.interval = max(1.0, (header["deadline"] - _now_ms()) / 3000)
        self.visibility = min(43_200, max(1, math.ceil(2 * self.interval + 30)))
        self.text = _reply_text(header, {"status": "RUNNING"})
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="stepline-heartbeat", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()  # no heartbeat after the final reply

    def _run(self):
        launch = self.header["launchId"]
        while not self.done.wait(self.interval):
            try:
                self.worker.sqs.send_message(QueueUrl=self.header["replyTo"], MessageBody=self.text)
                log("heartbeat", launchId=launch)
            except (ClientError, BotoCoreError) as e:  # logged and skipped
                log("heartbeat.failed", launchId=launch, error=str(e))
            if self.receipt and self.queue_url:
                try:
                    self.worker.sqs.change_message_visibility(
                        QueueUrl=self.queue_url, ReceiptHandle=self.receipt,
                        VisibilityTimeout=self.visibility)
                except (ClientError, BotoCoreError) as e:
                    log("visibility.failed", launchId=launch, error=str(e))


class Worker:
    """Serves the steps of one identity (pipeline, contract version, release).

    `steps` maps step ids to functions `step(request, input) -> output`.
    """

    completed_capacity = 1_024  # replies of recent launches kept for redeliveries
    cancelled_capacity = 10_000  # cancelled launch ids remembered
    max_concurrency = 10  # messages handled in parallel (and received at once by poll)
    wait_seconds = 20  # poll(): SQS long-poll wait

    def __init__(self, steps: dict[str, Callable[[Request, Any], Any]], *,
                 contract_file: str | None = None, release_version: str | None = None,
                 sqs=None, s3=None):
        self.steps = dict(steps)
        path = contract_file or os.environ.get("STEPLINE_CONTRACT_FILE") or "pipeline-contract.json"
        with open(path, encoding="utf-8") as f:
            contract = json.load(f)
        release = release_version or os.environ.get("RELEASE_VERSION")
        if not release:
            raise ValueError("the release version is required: pass release_version or set RELEASE_VERSION")
        for field in ("pipelineId", "contractVersion"):
            if not isinstance(contract.get(field), str):
                raise ValueError(f"{path}: {field} is missing or not a string")
        self.identity = {"pipelineId": contract["pipelineId"],
                         "contractVersion": contract["contractVersion"],
                         "releaseVersion": release}

        # boto3 reads AWS_DEFAULT_REGION (not AWS_REGION) and AWS_ENDPOINT_URL.
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or None
        self.sqs = sqs or boto3.client("sqs", region_name=region)
        self.s3 = s3 or boto3.client("s3", region_name=region)
        self.dlq_url = os.environ.get("REQUEST_DLQ_URL") or None
        self.bucket = os.environ.get("PAYLOAD_BUCKET") or None
        self.threshold = int(os.environ.get("PAYLOAD_THRESHOLD_BYTES") or DEFAULT_THRESHOLD_BYTES)

        # Announcements (protocol section 18): who this process is, where it announces itself.
        self.worker_id = str(uuid.uuid4())
        self.reply_queue_url: str | None = os.environ.get("REPLY_QUEUE_URL") or None
        self._queue_name = ""  # the request queue's name, once known
        self._announce_lock = threading.Lock()
        self._announced: tuple[str, float] | None = None  # (state, time.monotonic()) of the last one sent

        # Deduplication state, per process (protocol section 9).
        self._lock = threading.Lock()
        self._completed: OrderedDict[str, str] = OrderedDict()  # launchId -> exact reply text sent
        self._running: set[str] = set()
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._queue_urls: dict[str, str | None] = {}  # eventSourceARN -> queue URL

    # ----------------------------------------------------------------- entry points

    def lambda_handler(self, event: dict, context: Any = None) -> dict:
        """AWS Lambda handler for an SQS event source mapping with ReportBatchItemFailures.

        Messages that were not handled (reply or dead letter could not be sent) are reported
        as failures, so SQS redelivers them; the others are deleted by Lambda.
        """
        records = event.get("Records") or []
        self._announce_from([(r.get("eventSourceARN") or os.environ.get("REQUEST_QUEUE_URL"), r.get("body"))
                             for r in records])

        def handle(record: dict) -> bool:
            queue_url = self._queue_url_for(record.get("eventSourceARN"))
            return self.handle_message(record.get("body") or "", record.get("messageId", ""),
                                       record.get("receiptHandle"), queue_url)

        results = self._map(handle, records)
        return {"batchItemFailures": [{"itemIdentifier": r.get("messageId", "")}
                                      for r, ok in zip(records, results) if not ok]}

    def poll(self, queue_url: str | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Long-poll the request queue and handle messages until `stop()` is true or SIGTERM/SIGINT.

        A message is deleted once handled (replied to or dead-lettered) and left for redelivery
        otherwise. On a signal, the current batch is finished, then the worker announces that it
        drains (DRAINING) before returning.
        """
        queue_url = queue_url or os.environ.get("REQUEST_QUEUE_URL")
        if not queue_url:
            raise ValueError("no request queue: pass queue_url or set REQUEST_QUEUE_URL")
        stopping = threading.Event()

        def on_signal(signum, _frame):
            log("stopping", signal=signum)
            stopping.set()

        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, on_signal)

        def handle(message: dict) -> bool:
            ok = self.handle_message(message.get("Body") or "", message["MessageId"],
                                     message["ReceiptHandle"], queue_url)
            if ok:
                try:
                    self.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
                except (ClientError, BotoCoreError) as e:  # redelivered: answered from the dedup store
                    log("delete.failed", messageId=message["MessageId"], error=str(e))
            return ok

        log("polling", queueUrl=queue_url, identity=self.identity, steps=sorted(self.steps),
            workerId=self.worker_id)
        self._announce_from([(queue_url, None)])  # at the start when REPLY_QUEUE_URL is set
        backoff = 1.0
        try:
            while not stopping.is_set() and not (stop and stop()):
                try:
                    messages = self.sqs.receive_message(
                        QueueUrl=queue_url, MaxNumberOfMessages=max(1, min(10, self.max_concurrency)),
                        WaitTimeSeconds=self.wait_seconds).get("Messages", [])
                    backoff = 1.0
                except (ClientError, BotoCoreError) as e:
                    log("receive.failed", error=str(e))
                    stopping.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                # After every receive, idle or not, HEALTHY when due (without REPLY_QUEUE_URL, the
                # first request received names the reply queue).
                self._announce_from([(queue_url, m.get("Body")) for m in messages])
                self._map(handle, messages)
            if stopping.is_set():  # told to stop: no more requests are taken
                self._announce(DRAINING)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log("stopped")

    # ----------------------------------------------------------------- one message

    def handle_message(self, body: str, message_id: str, receipt: str | None = None,
                       queue_url: str | None = None) -> bool:
        """Handle one request queue message. True: acknowledge (delete) it; False: leave it."""
        # 1. The envelope and header only; the payload is not looked at before the identity check.
        try:
            message = json.loads(body)
        except ValueError as e:
            return self._dead_letter(body, message_id, "UNDECODABLE", f"body is not JSON: {e}")
        header = message.get("header") if isinstance(message, dict) else None
        if not isinstance(header, dict):
            return self._dead_letter(body, message_id, "UNDECODABLE", "no header object")
        kind = header.get("kind")
        if kind not in (REQUEST_KIND, CANCEL_KIND):
            return self._dead_letter(body, message_id, "UNDECODABLE", f"unknown header.kind {kind!r}")
        problem = _header_problem(header)
        if problem:
            return self._dead_letter(body, message_id, "UNDECODABLE", f"invalid header: {problem}")

        # 2. Identity check (section 7).
        launch = header["launchId"]
        if not self._same_identity(header["identity"]):
            if kind == CANCEL_KIND:  # acknowledged and ignored, never dead-lettered
                log("cancel.ignored", launchId=launch, reason="IDENTITY_MISMATCH")
                return True
            return self._reject_identity(body, message_id, header)

        # 3. Cancel notice (section 13): remember the launch, never reply.
        if kind == CANCEL_KIND:
            with self._lock:
                self._cancelled[launch] = None
                self._cancelled.move_to_end(launch)
                while len(self._cancelled) > self.cancelled_capacity:
                    self._cancelled.popitem(last=False)
            log("cancel", launchId=launch)
            return True

        if "payload" not in message:
            return self._dead_letter(body, message_id, "UNDECODABLE", "request without payload")
        return self._run(header, message["payload"], receipt, queue_url)

    def _run(self, header: dict, payload: Any, receipt: str | None, queue_url: str | None) -> bool:
        """Run a request once per launch id (section 9), then reply."""
        launch = header["launchId"]
        with self._lock:
            stored = self._completed.get(launch)
            if stored is not None:
                state = "completed"
            elif launch in self._cancelled:
                state = "cancelled"
            elif launch in self._running:
                state = "running"
            else:
                state = "new"
                self._running.add(launch)
        if state == "completed":  # re-send the first reply, byte for byte
            log("duplicate", launchId=launch)
            return self._send(header, stored, final=False)
        if state == "cancelled":
            log("cancelled.skipped", launchId=launch)
            return True
        if state == "running":  # the running one will reply
            log("duplicate.running", launchId=launch)
            return True

        try:
            with _Heartbeat(self, header, receipt, queue_url):
                outcome = self._outcome(header, payload)
                text = self._finish(header, outcome)
            with self._lock:  # stored before it is sent: a redelivery re-sends these very bytes
                self._completed[launch] = text
                while len(self._completed) > self.completed_capacity:
                    self._completed.popitem(last=False)
        finally:
            with self._lock:
                self._running.discard(launch)
        return self._send(header, text, final=True)

    def _outcome(self, header: dict, payload: Any) -> dict:
        """Resolve the input, run the step, offload the output. Returns the reply's outcome."""
        request = Request(header)
        step = self.steps.get(request.step_id)
        if step is None:
            return _failed(UNKNOWN_STEP, f"this worker has no step {request.step_id!r} "
                                         f"(it has {', '.join(sorted(self.steps))})", False)
        try:
            value = self._resolve(payload)
        except StepError as e:
            return {"status": "FAILED", "error": e.to_error()}

        log("step.ran", stepId=request.step_id, launchId=request.launch_id, attempt=request.attempt)
        try:
            output = step(request, value)
        except StepError as e:
            return {"status": "FAILED", "error": e.to_error()}
        except Exception as e:  # a crash: a retryable failure (section 12, "crash")
            log("step.exception", stepId=request.step_id, launchId=request.launch_id,
                error=repr(e), traceback=traceback.format_exc())
            return _failed(WORKER_EXCEPTION, _text(f"{type(e).__name__}: {e}"), True)

        try:
            data = _compact(output)
        except (TypeError, ValueError) as e:
            return _failed(INVALID_OUTPUT, _text(f"the step's output is not JSON: {e}"), False)
        if len(data) <= self.threshold or _is_ref(output):
            return {"status": "SUCCEEDED", "output": output}
        if self.bucket:
            try:
                return {"status": "SUCCEEDED", "output": self._store(header["executionId"], data)}
            except StepError as e:
                return {"status": "FAILED", "error": e.to_error()}
        if len(data) <= INLINE_MAX_BYTES:
            return {"status": "SUCCEEDED", "output": output}
        return _failed("PAYLOAD_TOO_LARGE", f"output of {len(data)} bytes and no payload bucket "
                                            f"(PAYLOAD_BUCKET) to offload it to", False)

    def _finish(self, header: dict, outcome: dict) -> str:
        """Cut a long error message (section 11) and return the reply text, which must fit SQS."""
        if outcome["status"] == "FAILED":
            error = outcome["error"]
            message = error["message"]
            if len(message.encode("utf-8")) > self.threshold:  # measured in UTF-8 bytes
                if self.bucket:
                    error["message"] = _cut(message, CUT_MESSAGE_BYTES)
                    try:  # the whole message, stored as a JSON string
                        error["detail"] = self._store(header["executionId"], _compact(message))
                    except StepError as e:  # keep the error's own code; only its tail is lost
                        log("detail.failed", launchId=header["launchId"], error=e.message)
                else:
                    error["message"] = _cut(message, INLINE_MAX_BYTES)
        text = _reply_text(header, outcome)
        if len(text.encode("utf-8")) > SQS_MAX_BYTES:
            text = _reply_text(header, _failed("PAYLOAD_TOO_LARGE",
                                               f"the reply would be {len(text.encode('utf-8'))} bytes, "
                                               f"more than an SQS message holds", False))
        return text

    # ----------------------------------------------------------------- claim checks

    def _resolve(self, value: Any) -> Any:
        """Replace every payload reference in a value, at any depth, by its content (section 11)."""
        if _is_ref(value):
            return self._resolve(self._fetch(value))
        if isinstance(value, dict):
            return {k: self._resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        return value

    def _fetch(self, ref: dict) -> Any:
        where = f"s3://{ref['bucket']}/{ref['key']}"
        if not self.bucket:
            raise StepError("PAYLOAD_UNRESOLVABLE", f"{where}: this worker has no payload bucket "
                                                    f"(PAYLOAD_BUCKET)", False)
        if ref["bucket"] != self.bucket:
            raise StepError("PAYLOAD_UNRESOLVABLE", f"{where}: not the payload bucket {self.bucket}", False)
        try:
            data = self.s3.get_object(Bucket=ref["bucket"], Key=ref["key"])["Body"].read()
        except (ClientError, BotoCoreError, OSError) as e:  # S3 refused, unreachable, timed out, body cut
            raise _s3_error(where, e) from e
        if len(data) != ref["size"]:
            raise StepError("PAYLOAD_UNRESOLVABLE",
                            f"{where}: {len(data)} bytes, the reference says {ref['size']}", False)
        if hashlib.sha256(data).hexdigest() != ref["sha256"]:
            raise StepError("PAYLOAD_UNRESOLVABLE", f"{where}: sha256 does not match the reference", False)
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError as e:  # includes UnicodeDecodeError
            raise StepError("PAYLOAD_UNRESOLVABLE", f"{where}: not JSON: {e}", False) from e

    def _store(self, execution_id: str, data: bytes) -> dict:
        """PutObject compact JSON bytes at payloads/<executionId>/<sha256>; return the reference."""
        digest = hashlib.sha256(data).hexdigest()
        key = f"payloads/{execution_id}/{digest}"
        try:
            # A create, never an overwrite (the bucket refuses any other PutObject); an object already
            # there holds these bytes (the key is their digest).
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json",
                               IfNoneMatch="*")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "PreconditionFailed":
                raise _s3_error(f"could not store s3://{self.bucket}/{key}", e) from e
        except (BotoCoreError, OSError) as e:  # classified as for GetObject
            raise _s3_error(f"could not store s3://{self.bucket}/{key}", e) from e
        return {"$stepline": "payload-ref", "bucket": self.bucket, "key": key,
                "size": len(data), "sha256": digest}

    # ----------------------------------------------------------------- announcements

    def _announce_from(self, sources: list[tuple[str | None, str | None]]) -> None:
        """Learn the request queue's name and (without REPLY_QUEUE_URL) the reply queue from a batch,
        given as (queue URL or eventSourceARN, body) pairs, then announce HEALTHY if one is due."""
        with self._announce_lock:
            if not self._queue_name:
                self._queue_name = next((_queue_name(where) for where, _ in sources if where), "")
            if not self.reply_queue_url:
                for _, body in sources:
                    try:
                        header = json.loads(body or "null")["header"]
                        reply_to = header["replyTo"]
                    except (ValueError, TypeError, KeyError):
                        continue
                    if isinstance(reply_to, str) and reply_to:
                        self.reply_queue_url = reply_to
                        break
        self._announce(HEALTHY)

    def _announce(self, state: str) -> None:
        """Send an announcement if one is due: the first, a change of state, or 5 minutes after the
        last. Best effort: a failed send is logged and tried again at the next batch."""
        with self._announce_lock:
            queue = self.reply_queue_url
            last = self._announced
            due = (last is None or last[0] != state
                   or time.monotonic() - last[1] >= ANNOUNCE_EVERY_SECONDS)
            if not queue or not due:
                return
            announcement = {"kind": WORKER_KIND, "workerId": self.worker_id, "identity": dict(self.identity),
                            "queue": self._queue_name, "state": state}
            try:
                self.sqs.send_message(QueueUrl=queue, MessageBody=_compact(announcement).decode("utf-8"))
            except (ClientError, BotoCoreError) as e:
                log("announce.failed", state=state, workerId=self.worker_id, error=str(e))
                return
            self._announced = (state, time.monotonic())
        log("announced", state=state, workerId=self.worker_id, queue=self._queue_name)

    # ----------------------------------------------------------------- sending

    def _send(self, header: dict, text: str, *, final: bool) -> bool:
        """Send a reply to header.replyTo. False when it could not be sent (leave the request)."""
        launch = header["launchId"]
        try:
            self.sqs.send_message(QueueUrl=header["replyTo"], MessageBody=text)
        except (ClientError, BotoCoreError) as e:
            log("reply.failed", launchId=launch, error=str(e))
            return False
        if final:
            log("replied", launchId=launch, status=json.loads(text)["outcome"]["status"])
        return True

    def _same_identity(self, identity: dict) -> bool:
        return all(identity.get(k) == v for k, v in self.identity.items())

    def _reject_identity(self, body: str, message_id: str, header: dict) -> bool:
        """Section 7: FAILED reply (so the execution fails at once), then the DLQ, then delete."""
        theirs, ours = header["identity"], self.identity
        text = (f"request for {theirs['pipelineId']} release {theirs['releaseVersion']} "
                f"({theirs['contractVersion']}) delivered to a worker of {ours['pipelineId']} "
                f"release {ours['releaseVersion']} ({ours['contractVersion']})")
        # Deterministic text: a redelivery sends the same bytes again.
        self._send(header, _reply_text(header, _failed("IDENTITY_MISMATCH", text, False)), final=True)
        return self._dead_letter(body, message_id, "IDENTITY_MISMATCH", text)

    def _dead_letter(self, body: str, message_id: str, reason: str, detail: str) -> bool:
        """Send the body unchanged to the request queue's DLQ with the section 8 attributes.

        False (leave the message for the queue's redrive policy) when there is no DLQ or the
        send fails.
        """
        if not self.dlq_url:
            log("dead-letter.skipped", reason=reason, messageId=message_id, detail=detail,
                why="REQUEST_DLQ_URL is not set")
            return False
        attributes = {
            "stepline.reason": {"DataType": "String", "StringValue": reason},
            "stepline.detail": {"DataType": "String", "StringValue": _cut(detail, DETAIL_MAX_BYTES)},
            "stepline.source": {"DataType": "String", "StringValue": message_id or "unknown"},
        }
        try:
            self.sqs.send_message(QueueUrl=self.dlq_url, MessageBody=body, MessageAttributes=attributes)
        except (ClientError, BotoCoreError) as e:
            log("dead-letter.failed", reason=reason, messageId=message_id, error=str(e))
            return False
        log("dead-lettered", reason=reason, messageId=message_id, detail=_cut(detail, DETAIL_MAX_BYTES))
        return True

    # ----------------------------------------------------------------- helpers

    def _queue_url_for(self, arn: str | None) -> str | None:
        """The request queue URL on Lambda (for visibility extension): env, or from the source ARN."""
        if os.environ.get("REQUEST_QUEUE_URL"):
            return os.environ["REQUEST_QUEUE_URL"]
        if not arn:
            return None
        if arn not in self._queue_urls:
            url = None
            parts = arn.split(":")  # arn:aws:sqs:<region>:<account>:<name>
            if len(parts) == 6:
                try:
                    url = self.sqs.get_queue_url(QueueName=parts[5],
                                                 QueueOwnerAWSAccountId=parts[4])["QueueUrl"]
                except (ClientError, BotoCoreError) as e:
                    log("queue-url.failed", arn=arn, error=str(e))
            self._queue_urls[arn] = url
        return self._queue_urls[arn]

    def _map(self, fn: Callable[[Any], bool], items: list) -> list[bool]:
        """Apply fn to every item, in parallel threads; an unexpected exception counts as False."""
        def safe(item):
            try:
                return fn(item)
            except Exception as e:  # a bug in this runtime: leave the message for redelivery
                log("internal-error", error=repr(e), traceback=traceback.format_exc())
                return False

        if len(items) <= 1:
            return [safe(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(len(items), self.max_concurrency)) as pool:
            return list(pool.map(safe, items))
