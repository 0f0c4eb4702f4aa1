"""End-to-end check of stepline_worker against the worker protocol (docs/protocol.md).

Runs against the local emulator (moto server); creates its own queues and bucket:

    infra/emulator.sh start && eval "$(infra/emulator.sh env)" \
        && .venv/bin/python examples/python-worker/test_runtime.py

Crafts requests as the protocol shows them, runs Worker.poll() with a stop condition, and checks
what arrives on the reply queue (replies, heartbeats, the worker's announcements) and the request
DLQ (against docs/schemas when the jsonschema package is importable, by hand otherwise). Set
STEPLINE_TEST_VERBOSE=1 to see the worker's log.
"""

import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid

import boto3

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "..", "..", "docs", "schemas")
sys.path.insert(0, HERE)

from stepline_worker import StepError, Worker  # noqa: E402

THRESHOLD = 1024  # small claim-check threshold, so the test stays small
IDENTITY = {"pipelineId": "py-test",
            "contractVersion": "sha256:" + hashlib.sha256(b"py-test contract").hexdigest(),
            "releaseVersion": "7"}
FAILURES: list[str] = []


def check(condition: bool, what: str) -> None:
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        FAILURES.append(what)


def compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# ----------------------------------------------------------------- worker log capture

class LogTap:
    """Wraps sys.stderr to collect the worker's JSON log events."""

    def __init__(self, inner):
        self.inner, self.buffer, self.events = inner, "", []
        self.verbose = bool(os.environ.get("STEPLINE_TEST_VERBOSE"))

    def write(self, text):
        if self.verbose:
            self.inner.write(text)
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.inner.write(line + "\n")
        return len(text)

    def flush(self):
        self.inner.flush()

    def count(self, event, **fields):
        return sum(1 for e in self.events
                   if e.get("event") == event and all(e.get(k) == v for k, v in fields.items()))


# ----------------------------------------------------------------- schema checks

def validators():
    """(check_sent, check_reply, check_announcement): the test's own messages against the request
    schemas (None without jsonschema), replies against reply.schema.json and announcements against
    worker.schema.json (jsonschema), or by hand."""
    try:
        import jsonschema
        from referencing import Registry, Resource
    except ImportError:
        return None, check_reply_by_hand, check_announcement_by_hand
    resources = []
    for name in os.listdir(SCHEMAS):
        with open(os.path.join(SCHEMAS, name), encoding="utf-8") as f:
            schema = json.load(f)
        resources.append((schema["$id"], Resource.from_contents(schema)))
    registry = Registry().with_resources(resources)

    def validator(name):
        schema = registry.contents(name)
        cls = jsonschema.validators.validator_for(schema)
        return cls(schema, registry=registry, format_checker=cls.FORMAT_CHECKER)

    reply, request, cancel, announcement = (validator(n) for n in (
        "reply.schema.json", "request.schema.json", "cancel-notice.schema.json", "worker.schema.json"))

    def check_reply(message):
        errors = [e.message for e in reply.iter_errors(message)]
        return errors[0] if errors else None

    def check_announcement(message):
        errors = [e.message for e in announcement.iter_errors(message)]
        return errors[0] if errors else None

    def check_sent(message):  # what the test sends must follow the schemas too
        v = cancel if message["header"]["kind"] == "stepline.cancel.v1" else request
        errors = [e.message for e in v.iter_errors(message)]
        assert not errors, f"the test crafted an invalid message: {errors}"

    return check_sent, check_reply, check_announcement


def check_announcement_by_hand(m):
    if set(m) != {"kind", "workerId", "identity", "queue", "state"}:
        return f"fields {sorted(m)}"
    if m["kind"] != "stepline.worker.v1":
        return "wrong kind"
    if not (isinstance(m["workerId"], str) and m["workerId"] and isinstance(m["queue"], str)):
        return "bad workerId or queue"
    identity = m["identity"]
    if not (isinstance(identity, dict) and set(identity) == {"pipelineId", "contractVersion", "releaseVersion"}
            and all(isinstance(v, str) for v in identity.values())):
        return "bad identity"
    if m["state"] not in ("HEALTHY", "DRAINING"):
        return "bad state"
    return None


def check_reply_by_hand(m):
    for field in ("kind", "identity", "executionId", "stepIndex", "attempt", "launchId", "outcome"):
        if field not in m:
            return f"{field} missing"
    if m["kind"] != "stepline.reply.v1":
        return "wrong kind"
    outcome = m["outcome"]
    status = outcome.get("status")
    if status == "SUCCEEDED" and "output" not in outcome:
        return "output missing"
    if status == "FAILED":
        error = outcome.get("error", {})
        if not (isinstance(error.get("code"), str) and isinstance(error.get("message"), str)
                and isinstance(error.get("retryable"), bool)):
            return "bad error"
    if status not in ("SUCCEEDED", "FAILED", "RUNNING"):
        return "bad status"
    return None


# ----------------------------------------------------------------- the test

def main() -> int:
    if not os.environ.get("AWS_ENDPOINT_URL"):
        print('AWS_ENDPOINT_URL is not set: run infra/emulator.sh start && eval "$(infra/emulator.sh env)"')
        return 2
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
    sqs = boto3.client("sqs", region_name=region)
    s3 = boto3.client("s3", region_name=region)
    check_sent, check_reply, check_announcement = validators()
    print("schemas: " + ("jsonschema" if check_sent else "checked by hand (jsonschema not importable)"))

    # Resources, uniquely named.
    prefix = f"pyw-{uuid.uuid4().hex[:10]}"
    request_url = sqs.create_queue(QueueName=f"{prefix}-requests")["QueueUrl"]
    dlq_url = sqs.create_queue(QueueName=f"{prefix}-requests-dlq")["QueueUrl"]
    reply_url = sqs.create_queue(QueueName=f"{prefix}-replies")["QueueUrl"]
    bucket = prefix
    if region == "us-east-1":
        s3.create_bucket(Bucket=bucket)
    else:
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    contract_dir = tempfile.mkdtemp()
    contract_file = os.path.join(contract_dir, "pipeline-contract.json")
    with open(contract_file, "w", encoding="utf-8") as f:
        json.dump({"pipelineId": IDENTITY["pipelineId"], "contractVersion": IDENTITY["contractVersion"],
                   "steps": []}, f)

    # Step code of the test pipeline.
    runs: dict[str, int] = {}
    runs_lock = threading.Lock()

    def echo(request, value):
        return {"seen": value, "attempt": request.attempt, "tenant": request.tenant}

    def flaky(request, value):
        raise StepError("PRICING_DOWN", "pricing service answered 503")

    def counted(request, value):
        with runs_lock:
            runs[request.launch_id] = runs.get(request.launch_id, 0) + 1
        return {"runs": runs[request.launch_id]}

    def slow(request, value):
        time.sleep(2.6)
        return {"slow": True}

    def total(request, value):
        return {"total": sum(value["data"]["numbers"]), "note": value["note"]}

    def big(request, value):
        return {"blob": "x" * 5000}

    def loud(request, value):
        raise StepError("TOO_LOUD", "é" * 3000, retryable=False)

    def crash(request, value):
        raise RuntimeError("boom")

    steps = {"echo": echo, "flaky": flaky, "counted": counted, "slow": slow, "total": total,
             "big": big, "loud": loud, "crash": crash}

    os.environ.update(REQUEST_DLQ_URL=dlq_url, PAYLOAD_BUCKET=bucket, PAYLOAD_THRESHOLD_BYTES=str(THRESHOLD))
    worker = Worker(steps, contract_file=contract_file, release_version=IDENTITY["releaseVersion"],
                    sqs=sqs, s3=s3)
    worker.wait_seconds = 1
    tap = LogTap(sys.stderr)
    sys.stderr = tap

    # Crafting messages (section 4 and 13).
    sent: dict[str, dict] = {}  # launchId -> request

    def request(step, payload, *, identity=IDENTITY, deadline_in=30.0, token=True, kind="stepline.request.v1",
                launch=None):
        header = {
            "kind": kind,
            "identity": dict(identity),
            "tenant": "acme",
            "executionId": str(uuid.uuid4()),
            "stepId": step,
            "stepIndex": 1,
            "attempt": 2,
            "launchId": launch or str(uuid.uuid4()),
            "replyTo": reply_url,
            "deadline": int(time.time() * 1000 + deadline_in * 1000),
        }
        if token:
            header["replyToken"] = uuid.uuid4().hex
        message = {"header": header, "payload": payload}
        if check_sent:
            check_sent(message)
        if kind == "stepline.request.v1":
            sent[header["launchId"]] = message
        return message

    def send(body) -> str:
        text = body if isinstance(body, str) else json.dumps(body)
        return sqs.send_message(QueueUrl=request_url, MessageBody=text)["MessageId"]

    def put_payload(execution_id, value) -> dict:
        data = compact(value)
        digest = hashlib.sha256(data).hexdigest()
        key = f"payloads/{execution_id}/{digest}"
        s3.put_object(Bucket=bucket, Key=key, Body=data)
        return {"$stepline": "payload-ref", "bucket": bucket, "key": key, "size": len(data), "sha256": digest}

    # Collected from the reply queue (replies and heartbeats apart from announcements) and the DLQ.
    replies: list[tuple[str, dict]] = []  # (body text, parsed)
    announcements: list[dict] = []
    dead: list[dict] = []

    def drain():
        for url, into in ((reply_url, replies), (dlq_url, dead)):
            while True:
                got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                          MessageAttributeNames=["All"]).get("Messages", [])
                if not got:
                    break
                for m in got:
                    if into is dead:
                        dead.append(m)
                    else:
                        parsed = json.loads(m["Body"])
                        if parsed.get("kind") == "stepline.worker.v1":
                            announcements.append(parsed)
                        else:
                            replies.append((m["Body"], parsed))
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])

    def announced_by(w, state=None):
        return [a for a in announcements if a["workerId"] == w.worker_id and state in (None, a["state"])]

    def finals(launch):
        return [(t, r) for t, r in replies if r.get("launchId") == launch and r["outcome"]["status"] != "RUNNING"]

    def queue_empty():
        a = sqs.get_queue_attributes(QueueUrl=request_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        return a["ApproximateNumberOfMessages"] == "0" and a["ApproximateNumberOfMessagesNotVisible"] == "0"

    def run_until(done, timeout=60.0):
        give_up = time.time() + timeout

        def stop():
            drain()
            return done() or time.time() > give_up

        worker.poll(request_url, stop=stop)
        drain()
        check(done(), "the worker handled everything before the timeout")

    # ---- phase 1: one of each case
    ok = request("echo", {"orderId": "order-1"})
    no_token = request("echo", {"orderId": "order-2"}, token=False)
    failing = request("flaky", {"orderId": "order-3"})
    dup = request("counted", {"orderId": "order-4"})
    slow_req = request("slow", {}, deadline_in=1.5)  # interval max(1 s, 1.5 s / 3) = 1 s
    exec_id = str(uuid.uuid4())
    numbers = list(range(100))
    claim = request("total", {"note": "n", "data": put_payload(exec_id, {"numbers": numbers})})
    claim["header"]["executionId"] = exec_id
    bad_ref = dict(put_payload(exec_id, {"numbers": [1]}), size=999)
    bad_claim = request("total", {"note": "n", "data": bad_ref})
    oversized = request("big", None)
    long_error = request("loud", None)
    crashing = request("crash", None)
    unknown = request("nope", None)
    mismatch = request("echo", {"orderId": "x"}, identity={**IDENTITY, "releaseVersion": "8"})
    cancelled_launch = str(uuid.uuid4())
    cancel = request("echo", None, kind="stepline.cancel.v1", launch=cancelled_launch)

    send(cancel)  # before its request, which comes in phase 2
    time.sleep(0.2)
    for message in (ok, no_token, failing, dup, slow_req, claim, bad_claim, oversized, long_error, crashing,
                    unknown):
        send(message)
    mismatch_body = json.dumps(mismatch)
    mismatch_id = send(mismatch_body)
    undecodable_id = send("this is not JSON")

    phase1 = [m["header"]["launchId"] for m in (ok, no_token, failing, dup, slow_req, claim, bad_claim,
                                                   oversized, long_error, crashing, unknown, mismatch)]
    run_until(lambda: all(finals(l) for l in phase1) and len(dead) >= 2 and queue_empty())

    # Every reply follows the schema and copies the request header.
    for text, reply in replies:
        problem = check_reply(reply)
        check(problem is None, f"reply {reply['launchId'][:8]} {reply['outcome']['status'].lower()} is valid"
                               + (f": {problem}" if problem else ""))
        header = sent[reply["launchId"]]["header"]
        same = all(reply[k] == header[k] for k in ("identity", "executionId", "stepIndex", "attempt", "launchId"))
        check(same and reply.get("replyToken") == header.get("replyToken"),
              f"reply {reply['launchId'][:8]} copies the header and reply token")
    for launch in phase1:
        check(len(finals(launch)) == 1, f"exactly one final reply for {launch[:8]}")

    def outcome(message):
        return finals(message["header"]["launchId"])[0][1]["outcome"]

    check(outcome(ok) == {"status": "SUCCEEDED",
                          "output": {"seen": {"orderId": "order-1"}, "attempt": 2, "tenant": "acme"}},
          "success carries the output")
    check("replyToken" not in finals(no_token["header"]["launchId"])[0][1],
          "no replyToken in the reply when the request had none")
    check(outcome(failing) == {"status": "FAILED", "error": {
        "code": "PRICING_DOWN", "message": "pricing service answered 503", "retryable": True}},
          "StepError becomes a retryable failure reply")
    check(outcome(crashing)["error"]["code"] == "WORKER_EXCEPTION" and outcome(crashing)["error"]["retryable"],
          "an exception becomes a retryable WORKER_EXCEPTION")
    check(outcome(unknown)["error"]["code"] == "UNKNOWN_STEP" and not outcome(unknown)["error"]["retryable"],
          "an unknown step id is a non-retryable failure")

    # Heartbeats.
    slow_launch = slow_req["header"]["launchId"]
    beats = [r for _, r in replies if r["launchId"] == slow_launch and r["outcome"]["status"] == "RUNNING"]
    check(len(beats) >= 1, f"heartbeats (RUNNING) sent during the slow step: {len(beats)}")
    check(tap.count("heartbeat", launchId=slow_launch) == len(beats), "one heartbeat log line per heartbeat")
    check(tap.count("visibility.failed") == 0, "each heartbeat extended the request's visibility")
    check(outcome(slow_req) == {"status": "SUCCEEDED", "output": {"slow": True}}, "the slow step succeeded")
    slow_texts = [t for t, r in replies if r["launchId"] == slow_launch]
    check(slow_texts[-1] == finals(slow_launch)[0][0], "no heartbeat after the final reply")

    # Claim checks.
    check(outcome(claim) == {"status": "SUCCEEDED", "output": {"total": sum(numbers), "note": "n"}},
          "a claim-checked input is resolved before the step runs")
    error = outcome(bad_claim).get("error", {})
    check(error.get("code") == "PAYLOAD_UNRESOLVABLE" and error.get("retryable") is False,
          "a reference whose size does not match fails PAYLOAD_UNRESOLVABLE")
    out = outcome(oversized).get("output", {})
    expected = compact({"blob": "x" * 5000})
    digest = hashlib.sha256(expected).hexdigest()
    check(out == {"$stepline": "payload-ref", "bucket": bucket,
                  "key": f"payloads/{oversized['header']['executionId']}/{digest}",
                  "size": len(expected), "sha256": digest}, "an oversized output is offloaded as a reference")
    stored = s3.get_object(Bucket=bucket, Key=out.get("key", "-"))["Body"].read() if out.get("key") else b""
    check(stored == expected, "the offloaded object holds the output's compact JSON")
    error = outcome(long_error)["error"]
    message_bytes = error["message"].encode("utf-8")
    check(len(message_bytes) <= 1024 and error["message"].endswith("...") and error["code"] == "TOO_LOUD",
          f"a long error message is cut to {len(message_bytes)} <= 1024 bytes, ending with ...")
    detail = error.get("detail") or {}
    whole = s3.get_object(Bucket=bucket, Key=detail["key"])["Body"].read() if detail.get("key") else b""
    check(whole == compact("é" * 3000) and detail.get("size") == len(whole),
          "the whole message is stored as a JSON string behind detail")

    # Identity mismatch and undecodable message: in the DLQ with their attributes.
    by_source = {m["MessageAttributes"]["stepline.source"]["StringValue"]: m
                 for m in dead if "stepline.source" in m.get("MessageAttributes", {})}
    m = by_source.get(mismatch_id)
    attrs = {k: v["StringValue"] for k, v in (m or {}).get("MessageAttributes", {}).items()}
    check(m is not None and m["Body"] == mismatch_body, "the misaddressed request is in the DLQ, body unchanged")
    check(attrs.get("stepline.reason") == "IDENTITY_MISMATCH" and 0 < len(attrs.get("stepline.detail", "")) <= 1024
          and all(v["DataType"] == "String" for v in m["MessageAttributes"].values()),
          f"with stepline.reason/detail/source: {attrs}")
    error = outcome(mismatch).get("error", {})
    check(error.get("code") == "IDENTITY_MISMATCH" and error.get("retryable") is False
          and finals(mismatch["header"]["launchId"])[0][1]["identity"]["releaseVersion"] == "8",
          "and a non-retryable IDENTITY_MISMATCH reply, identity as received")
    m = by_source.get(undecodable_id)
    check(m is not None and m["Body"] == "this is not JSON"
          and m["MessageAttributes"]["stepline.reason"]["StringValue"] == "UNDECODABLE",
          "a message that is not JSON is dead-lettered UNDECODABLE")
    check(tap.count("step.ran", launchId=mismatch["header"]["launchId"]) == 0, "the misaddressed step did not run")

    # Announcements: one HEALTHY at the first batch, on the reply queue its requests name.
    request_queue = f"{prefix}-requests"
    mine = announced_by(worker)
    check(len(mine) == 1 and mine[0]["state"] == "HEALTHY",
          f"the worker announced itself once, HEALTHY, on the reply queue: {[a['state'] for a in mine]}")
    if mine:
        problem = check_announcement(mine[0])
        check(problem is None, "the announcement is valid" + (f": {problem}" if problem else ""))
        check(mine[0]["identity"] == IDENTITY and mine[0]["queue"] == request_queue
              and mine[0]["workerId"] == worker.worker_id,
              f"with the worker's identity, id and request queue name: {mine[0]}")
    names = [e.get("event") for e in tap.events]
    check("announced" in names and "replied" in names and names.index("announced") < names.index("replied"),
          "announced at the first batch, before its replies")
    check(tap.count("announced", state="HEALTHY", workerId=worker.worker_id) == 1, "an announced log line")

    # ---- phase 2: redelivery of an answered request, the cancelled launch, a foreign cancel notice
    dup_launch = dup["header"]["launchId"]
    first_text = finals(dup_launch)[0][0]
    send(dup)
    send(request("echo", {"orderId": "cancelled"}, launch=cancelled_launch))
    send(request("echo", None, kind="stepline.cancel.v1", identity={**IDENTITY, "pipelineId": "other"}))
    dead_before = len(dead)
    run_until(lambda: len(finals(dup_launch)) >= 2 and queue_empty())
    time.sleep(0.5)
    drain()

    texts = [t for t, _ in finals(dup_launch)]
    check(len(texts) == 2 and texts[1] == first_text, "a redelivered request is answered with the same bytes")
    check(runs.get(dup_launch) == 1 and tap.count("step.ran", launchId=dup_launch) == 1,
          "without running the step again")
    check(tap.count("duplicate", launchId=dup_launch) == 1, "a duplicate log line")
    check(not finals(cancelled_launch) and tap.count("step.ran", launchId=cancelled_launch) == 0,
          "a request for a cancelled launch is acknowledged without running or replying")
    check(len(dead) == dead_before, "a cancel notice for another identity is not dead-lettered")

    # Log lines the end-to-end tests count.
    check(tap.count("dead-lettered", reason="IDENTITY_MISMATCH") == 1
          and tap.count("dead-lettered", reason="UNDECODABLE") == 1, "dead-lettered log lines")
    check(tap.count("replied", launchId=ok["header"]["launchId"], status="SUCCEEDED") == 1, "replied log lines")

    # ---- Lambda handler: a batch with one good record and one whose reply cannot be sent
    good = request("echo", {"orderId": "lambda"})
    lost = request("echo", {"orderId": "lost"})
    lost["header"]["replyTo"] = reply_url + "-does-not-exist"
    arn = sqs.get_queue_attributes(QueueUrl=request_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    event = {"Records": [{"messageId": f"m{i}", "receiptHandle": "unused", "body": json.dumps(m),
                          "eventSource": "aws:sqs", "eventSourceARN": arn} for i, m in enumerate((good, lost))]}
    result = worker.lambda_handler(event, None)
    drain()
    check(result == {"batchItemFailures": [{"itemIdentifier": "m1"}]},
          f"lambda_handler reports only the unsent reply for retry: {result}")
    check(len(finals(good["header"]["launchId"])) == 1, "lambda_handler replied to the good record")

    # ---- announcements with REPLY_QUEUE_URL: a failed one is sent again at the next batch (Lambda),
    # and poll() announces at its start, before any request
    check(len(announced_by(worker)) == 1, "no second announcement within 5 minutes")
    os.environ["REPLY_QUEUE_URL"] = reply_url + "-does-not-exist"
    lam = Worker(steps, contract_file=contract_file, release_version=IDENTITY["releaseVersion"], sqs=sqs, s3=s3)

    def lambda_event(*messages):
        return {"Records": [{"messageId": f"a{i}", "receiptHandle": "unused", "body": json.dumps(m),
                             "eventSource": "aws:sqs", "eventSourceARN": arn} for i, m in enumerate(messages)]}

    lam.lambda_handler(lambda_event(request("echo", {"orderId": "a1"})), None)
    drain()
    check(tap.count("announce.failed", workerId=lam.worker_id, state="HEALTHY") == 1 and not announced_by(lam),
          "an announcement that cannot be sent is logged, not fatal")
    lam.reply_queue_url = reply_url
    lam.lambda_handler(lambda_event(request("echo", {"orderId": "a2"})), None)
    drain()
    again = announced_by(lam)
    check(len(again) == 1 and again[0]["state"] == "HEALTHY" and again[0]["queue"] == request_queue
          and check_announcement(again[0]) is None,
          f"and sent at the next batch, the queue named after the eventSourceARN: {again}")
    os.environ["REPLY_QUEUE_URL"] = reply_url
    starter = Worker(steps, contract_file=contract_file, release_version=IDENTITY["releaseVersion"],
                     sqs=sqs, s3=s3)
    del os.environ["REPLY_QUEUE_URL"]
    starter.poll(request_url, stop=lambda: True)
    drain()
    at_start = announced_by(starter)
    check(len(at_start) == 1 and at_start[0]["state"] == "HEALTHY" and at_start[0]["queue"] == request_queue
          and at_start[0]["identity"] == IDENTITY,
          "with REPLY_QUEUE_URL, poll() announces at its start, before any request")
    check(check_announcement(at_start[0]) is None if at_start else False, "that announcement is valid")

    # ---- S3 errors while resolving a reference (section 11): only a missing key or bucket is
    # PAYLOAD_UNRESOLVABLE; AccessDenied and any other error are PAYLOAD_UNAVAILABLE (retryable)
    from botocore.exceptions import ClientError

    class DenyingS3:
        def __init__(self, code, status):
            self.code, self.status = code, status

        def get_object(self, **_):
            raise ClientError({"Error": {"Code": self.code, "Message": self.code},
                               "ResponseMetadata": {"HTTPStatusCode": self.status}}, "GetObject")

    missing_ref = dict(put_payload(exec_id, {"numbers": [2]}), key=f"payloads/{exec_id}/{'0' * 64}")
    cases = [(worker, "NoSuchKey (the emulator's answer)", "PAYLOAD_UNRESOLVABLE", False)]
    for code, status, expected, retryable in (("NoSuchBucket", 404, "PAYLOAD_UNRESOLVABLE", False),
                                              ("AccessDenied", 403, "PAYLOAD_UNAVAILABLE", True),
                                              ("InvalidObjectState", 403, "PAYLOAD_UNAVAILABLE", True),
                                              ("InternalError", 500, "PAYLOAD_UNAVAILABLE", True)):
        denying = Worker(steps, contract_file=contract_file, release_version=IDENTITY["releaseVersion"],
                         sqs=sqs, s3=DenyingS3(code, status))
        cases.append((denying, code, expected, retryable))
    for w, what, expected, retryable in cases:
        message = request("total", {"note": "n", "data": missing_ref})
        w.handle_message(json.dumps(message), "s3-" + what)
        drain()
        got = finals(message["header"]["launchId"])
        error = got[0][1]["outcome"].get("error", {}) if got else {}
        check((error.get("code"), error.get("retryable")) == (expected, retryable),
              f"S3 {what} resolving a reference: {expected}, retryable {retryable}: {error.get('code')}")

    # ---- SIGTERM: poll() finishes its batch, announces DRAINING and returns
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    started = time.time()
    worker.poll(request_url)
    check(time.time() - started < 10 and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
          "poll() returns on SIGTERM and restores the signal handler")
    drain()
    draining = announced_by(worker, "DRAINING")
    check(len(draining) == 1 and draining[0]["identity"] == IDENTITY and draining[0]["queue"] == request_queue
          and check_announcement(draining[0]) is None,
          f"and announces DRAINING before it returns: {[a['state'] for a in announced_by(worker)]}")
    check(tap.count("announced", state="DRAINING", workerId=worker.worker_id) == 1, "an announced DRAINING log line")

    # ---- the example pipeline's steps (worker.py)
    import worker as example
    from stepline_worker import Request

    def as_request(attempt):
        return Request(dict(request("validate", None)["header"], attempt=attempt))

    try:
        example.validate(as_request(1), {"orderId": ""})
        check(False, "validate rejects an empty orderId")
    except StepError as e:
        check(e.code == "INVALID_ORDER" and not e.retryable, "validate rejects an empty orderId")
    try:
        example.reserve(as_request(1), {"orderId": "o"})
        check(False, "reserve fails on attempt 1")
    except StepError as e:
        check(e.code == "STOCK_BUSY" and e.retryable, "reserve fails on attempt 1 with STOCK_BUSY")
    reserved = example.reserve(as_request(2), {"orderId": "o"})
    check(example.pack(as_request(1), reserved) == {"orderId": "o", "reservedOnAttempt": 2, "packed": True},
          "reserve then pack pass the order along")

    # Clean up.
    sys.stderr = tap.inner
    for url in (request_url, dlq_url, reply_url):
        sqs.delete_queue(QueueUrl=url)
    for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=obj["Key"])
    s3.delete_bucket(Bucket=bucket)

    print(f"\n{'FAILED: ' + str(len(FAILURES)) + ' check(s)' if FAILURES else 'all checks passed'}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
