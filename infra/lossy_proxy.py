"""A mitmproxy addon that makes the network to the AWS emulator lossy (started by infra/lossy.sh).

Each request is told apart by service (DynamoDB, SQS and EventBridge by their X-Amz-Target header,
S3 by the SigV4 credential scope, or its Host) and operation, and one random draw decides its fault:

  STEPLINE_LOSSY_ERROR     fraction of requests (reads and writes) answered without forwarding, with
                           a retryable error in the service's protocol (throttling or 5xx)   [0.05]
  STEPLINE_LOSSY_KILL      fraction of the applied writes (2xx from the emulator) whose response is
                           dropped: the connection is closed after the emulator applied it   [0.1]
  STEPLINE_LOSSY_DELAY     fraction of requests delayed before they are forwarded            [0.1]
  STEPLINE_LOSSY_DELAY_MS  the delay's range in milliseconds, uniform, "LOW-HIGH"            [0-0]
  STEPLINE_LOSSY_SEED      seeds the random generator (the draws follow the requests' arrival order)
  STEPLINE_LOSSY_ONLY      comma list of the services faulted (dynamodb,sqs,events,s3); the others
                           pass through untouched but are still logged                       [all four]
  STEPLINE_LOSSY_LOG       file that gets one JSON line per request, flushed at once:
                           {"t", "service", "op", "fault", "armed", "delay_ms", "status", "ids", "queue", "table"}:
                           "ids" every distinct UUID of the request body, lowercased, in order; "queue"
                           the last segment of an SQS QueueUrl; "table" DynamoDB's TableName (for
                           BatchWriteItem and TransactWriteItems, their table when they touch one only)

Writes: DynamoDB PutItem, UpdateItem, DeleteItem, BatchWriteItem, TransactWriteItems; SQS
SendMessage(Batch), DeleteMessage(Batch), ChangeMessageVisibility(Batch); EventBridge PutEvents;
S3 PUT and DELETE. Secrets Manager and any other service are never faulted nor delayed.

Faults can also be armed, on top of the random ones, by a POST to the proxy's `/__lossy/arm` with a
JSON body {"service", "op", "queue"?, "table"?, "id"?, "fault": "kill"|"error", "count"}: the next
`count` requests of that service and operation (to that queue or table, carrying that UUID in their
body) get that fault, whatever the draw says; an armed kill drops the response whatever its status (a
write's retry that meets its own first attempt's condition loses its answer too). The proxy answers
the POST itself, with 200.

A request whose upstream connection fails, or whose client hangs up first, is logged with
"status": null, "fault": null and an extra "error" key holding mitmproxy's message.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import re
import time
import uuid
from urllib.parse import urlsplit

from mitmproxy import http

FAULTABLE = ("dynamodb", "sqs", "events", "s3")

# X-Amz-Target prefixes of the JSON-protocol services.
TARGETS = {"DynamoDB_20120810": "dynamodb", "AmazonSQS": "sqs", "AWSEvents": "events"}

WRITES = {
    "dynamodb": {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"},
    "sqs": {
        "SendMessage",
        "SendMessageBatch",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
    },
    "events": {"PutEvents"},
    "s3": {"PUT", "DELETE"},
}

# Credential=AKID/20240101/us-east-1/s3/aws4_request (Authorization header, or X-Amz-Credential).
SCOPE = re.compile(r"^[^/]+/\d{8}/[^/]+/([^/]+)/aws4_request$")
AUTH_CREDENTIAL = re.compile(r"Credential=([^,\s]+)")
S3_HOST = re.compile(r"(^|\.)s3([.-]|$)")
UUID = re.compile(
    rb"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}(?![0-9A-Fa-f])"
)

log = logging.getLogger(__name__)


def _fraction(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}={raw!r} is not a fraction in [0, 1]")
    return value


def _millis(name: str, default: str) -> tuple[int, int]:
    raw = os.environ.get(name, "").strip() or default
    low, dash, high = raw.partition("-")
    bounds = (int(low), int(high) if dash else int(low))
    if bounds[0] < 0 or bounds[1] < bounds[0]:
        raise ValueError(f"{name}={raw!r} is not a range LOW-HIGH of milliseconds")
    return bounds


class Seen:
    """What the request hook learnt of a request, kept in flow.metadata["lossy"].

    (No dataclass: mitmproxy loads the script without registering its module, which dataclasses need.)
    """

    def __init__(
        self,
        service: str,
        op: str,
        write: bool,
        queue: str | None,
        table: str | None,
        ids: list[str],
        protocol: str,
    ) -> None:
        self.service = service
        self.op = op
        self.write = write
        self.queue = queue
        self.table = table
        self.ids = ids
        self.protocol = protocol  # "json", "query" (SQS's form protocol), "rest-xml" (S3), "other"
        self.fault: str | None = None  # decided: None, "error" or "kill"
        self.delay_ms = 0
        self.armed = False
        self.logged = False


def _body(request: http.Request) -> bytes:
    try:
        return request.get_content(strict=False) or b""
    except Exception:  # noqa: BLE001 - a body mitmproxy cannot decode is read as sent
        return request.raw_content or b""


def _ids(body: bytes) -> list[str]:
    seen: dict[str, None] = {}
    for match in UUID.finditer(body):
        seen.setdefault(match.group().decode().lower(), None)
    return list(seen)


def _scope(request: http.Request) -> str | None:
    """The service of the SigV4 credential scope (header, or a presigned URL's query)."""
    credential = None
    found = AUTH_CREDENTIAL.search(request.headers.get("authorization", ""))
    if found:
        credential = found.group(1)
    else:
        credential = request.query.get("X-Amz-Credential")
    if not credential:
        return None
    scope = SCOPE.match(credential)
    return scope.group(1) if scope else None


def _last_segment(queue_url: object) -> str | None:
    if not isinstance(queue_url, str) or not queue_url:
        return None
    path = urlsplit(queue_url).path.rstrip("/")
    return path.rsplit("/", 1)[-1] or None


def _table(document: dict) -> str | None:
    """TableName; for BatchWriteItem and TransactWriteItems, their table when they touch only one."""
    name = document.get("TableName")
    if isinstance(name, str):
        return name
    tables = set()
    items = document.get("RequestItems")
    if isinstance(items, dict):
        tables.update(items)
    for item in document.get("TransactItems") or []:
        if isinstance(item, dict):
            for action in item.values():
                if isinstance(action, dict) and isinstance(action.get("TableName"), str):
                    tables.add(action["TableName"])
    return tables.pop() if len(tables) == 1 else None


def classify(request: http.Request) -> Seen:
    body = _body(request)
    ids = _ids(body)
    target = request.headers.get("x-amz-target", "")
    if target:
        prefix, _, op = target.partition(".")
        service = TARGETS.get(prefix)
        if service is None:
            return Seen("other", target, False, None, None, ids, "other")
        queue = table = None
        if service in ("sqs", "dynamodb"):
            try:
                document = json.loads(body) if body else {}
            except ValueError:
                document = {}
            if isinstance(document, dict):
                if service == "sqs":
                    queue = _last_segment(document.get("QueueUrl"))
                else:
                    table = _table(document)
        return Seen(service, op, op in WRITES[service], queue, table, ids, "json")

    scope = _scope(request)
    if scope == "s3" or (scope is None and S3_HOST.search(request.pretty_host or "")):
        method = request.method.upper()
        return Seen("s3", method, method in WRITES["s3"], None, None, ids, "rest-xml")
    if scope == "sqs":
        # The query (form) protocol, which older SDKs use for SQS.
        form = request.urlencoded_form
        op = form.get("Action") or request.query.get("Action") or request.method
        queue = _last_segment(form.get("QueueUrl") or request.path.split("?", 1)[0])
        return Seen("sqs", op, op in WRITES["sqs"], queue, None, ids, "query")
    return Seen("other", request.method, False, None, None, ids, "other")


def _json_error(status: int, content_type: str, kind: str, extra: dict[str, str] | None = None) -> http.Response:
    headers = {"Content-Type": content_type, "x-amzn-RequestId": str(uuid.uuid4())}
    headers.update(extra or {})
    body = json.dumps({"__type": kind, "message": "injected"}, separators=(",", ":"))
    return http.Response.make(status, body, headers)


def _xml_error(status: int, body: str, extra: dict[str, str] | None = None) -> http.Response:
    headers = {"Content-Type": "application/xml"}
    headers.update(extra or {})
    return http.Response.make(status, body, headers)


def injected_error(seen: Seen, turn: int) -> http.Response:
    """A retryable error in the service's protocol; `turn` alternates between throttling and 5xx."""
    throttle = turn % 2 == 0
    if seen.service == "dynamodb":
        if throttle:
            return _json_error(
                400,
                "application/x-amz-json-1.0",
                "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
            )
        return _json_error(500, "application/x-amz-json-1.0", "com.amazonaws.dynamodb.v20120810#InternalServerError")
    if seen.service == "sqs" and seen.protocol == "json":
        if throttle:
            return _json_error(
                400,
                "application/x-amz-json-1.0",
                "com.amazonaws.sqs#RequestThrottled",
                {"x-amzn-query-error": "RequestThrottled;Sender"},
            )
        return _json_error(500, "application/x-amz-json-1.0", "com.amazonaws.sqs#InternalError")
    if seen.service == "sqs":
        code, kind, status = ("RequestThrottled", "Sender", 400) if throttle else ("InternalError", "Receiver", 500)
        return _xml_error(
            status,
            '<?xml version="1.0"?><ErrorResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/">'
            f"<Error><Type>{kind}</Type><Code>{code}</Code><Message>injected</Message><Detail/></Error>"
            f"<RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>",
        )
    if seen.service == "events":
        return _json_error(500, "application/x-amz-json-1.1", "InternalException")
    # S3
    return _xml_error(
        503,
        '<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>injected</Message></Error>',
        {"x-amz-request-id": uuid.uuid4().hex[:16].upper()},
    )


class Lossy:
    def __init__(self) -> None:
        self.error_rate = _fraction("STEPLINE_LOSSY_ERROR", 0.05)
        self.kill_rate = _fraction("STEPLINE_LOSSY_KILL", 0.1)
        self.delay_rate = _fraction("STEPLINE_LOSSY_DELAY", 0.1)
        self.delay_ms = _millis("STEPLINE_LOSSY_DELAY_MS", "0-0")
        seed = os.environ.get("STEPLINE_LOSSY_SEED", "").strip()
        self.rng = random.Random(int(seed)) if seed else random.Random()
        only = os.environ.get("STEPLINE_LOSSY_ONLY", "").strip()
        self.only = {s.strip() for s in only.split(",") if s.strip()} if only else set(FAULTABLE)
        unknown = self.only - set(FAULTABLE)
        if unknown:
            raise ValueError(f"STEPLINE_LOSSY_ONLY names unknown services: {sorted(unknown)}")
        path = os.environ.get("STEPLINE_LOSSY_LOG", "").strip()
        self.out = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - open for the proxy's life
        self.turns = {service: itertools.count() for service in FAULTABLE}
        self.armed: list[dict] = []
        log.info(
            "lossy: error %s, kill %s of applied writes, delay %s of requests by %s ms, faulting %s",
            self.error_rate,
            self.kill_rate,
            self.delay_rate,
            self.delay_ms,
            sorted(self.only),
        )

    def arm(self, flow: http.HTTPFlow) -> None:
        try:
            rule = json.loads(flow.request.get_text() or "{}")
            assert rule.get("fault") in ("kill", "error"), "fault must be kill or error"
            assert int(rule.get("count", 0)) > 0, "count must be positive"
            assert rule.get("service") in FAULTABLE and rule.get("op"), "service and op are needed"
        except (ValueError, AssertionError) as e:
            flow.response = http.Response.make(400, str(e).encode(), {"Content-Type": "text/plain"})
            return
        rule["count"] = int(rule["count"])
        self.armed.append(rule)
        log.info("lossy: armed %s", rule)
        flow.response = http.Response.make(200, b"armed", {"Content-Type": "text/plain"})

    def armed_fault(self, seen: Seen) -> str | None:
        for rule in self.armed:
            if (
                rule["count"] > 0
                and rule["service"] == seen.service
                and rule["op"] == seen.op
                and rule.get("queue") in (None, seen.queue)
                and rule.get("table") in (None, seen.table)
                and (rule.get("id") is None or rule["id"].lower() in seen.ids)
            ):
                rule["count"] -= 1
                return rule["fault"]
        return None

    def decide(self, seen: Seen) -> None:
        # One draw decides the fault: [0, error) answers an error; the rest, rescaled to [0, 1),
        # kills a write's response below `kill`, so that `kill` is the fraction of applied writes.
        draw = self.rng.random()
        delayed = self.rng.random() < self.delay_rate
        if seen.service not in self.only:
            return
        if draw < self.error_rate:
            seen.fault = "error"
        elif seen.write and self.kill_rate > 0 and (draw - self.error_rate) / (1.0 - self.error_rate) < self.kill_rate:
            seen.fault = "kill"
        if delayed and self.delay_ms[1] > 0:
            seen.delay_ms = self.rng.randint(*self.delay_ms)
        armed = self.armed_fault(seen)
        if armed is not None:
            seen.fault = armed
            seen.armed = True

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.path.startswith("/__lossy/arm"):
            self.arm(flow)
            return
        seen = classify(flow.request)
        self.decide(seen)
        flow.metadata["lossy"] = seen
        if seen.delay_ms:
            await asyncio.sleep(seen.delay_ms / 1000.0)
        if seen.fault == "error":
            flow.response = injected_error(seen, next(self.turns[seen.service]))

    def response(self, flow: http.HTTPFlow) -> None:
        seen: Seen | None = flow.metadata.get("lossy")
        if seen is None or flow.response is None:
            return
        status: int | None = flow.response.status_code
        fault = seen.fault
        if fault == "kill":
            if 200 <= flow.response.status_code < 300 or seen.armed:
                flow.kill()
                status = None
            else:
                fault = None  # not applied: its answer passes
        self.write(seen, fault, status)

    def error(self, flow: http.HTTPFlow) -> None:
        seen: Seen | None = flow.metadata.get("lossy")
        if seen is None:
            return
        self.write(seen, None, None, flow.error.msg if flow.error else "error")

    def write(self, seen: Seen, fault: str | None, status: int | None, error: str | None = None) -> None:
        if seen.logged or self.out is None:
            return
        seen.logged = True
        line = {
            "t": time.time(),
            "service": seen.service,
            "op": seen.op,
            "fault": fault,
            "armed": seen.armed,
            "delay_ms": seen.delay_ms,
            "status": status,
            "ids": seen.ids,
            "queue": seen.queue,
            "table": seen.table,
        }
        if error is not None:
            line["error"] = error
        self.out.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.out.flush()

    def done(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None


addons = [Lossy()]
