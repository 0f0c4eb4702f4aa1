"""moto server with the atomicity AWS guarantees and moto's threaded server does not.

moto serves each request on its own thread and its backends take no locks. Two conditional PutItems
on one item can then both pass their condition (each reads the old version before either writes), and
the second silently overwrites the first: a lost update that DynamoDB never allows. In SQS, a
DeleteMessage rebuilds the queue's message list without the lock SendMessage appends under, so a
message sent at that moment can vanish. Both were seen losing fan-out notices on a busy machine.

Its request handlers also read an item's old image (what `ReturnValues: ALL_OLD` answers) before
calling the backend, outside any lock: two updates of one item could then both answer the image from
before either, as if neither had seen the other. That lost the last child of a fan-out block, and
its parent waited for ever.

This launcher serialises DynamoDB's item operations, in the backend and in their request handlers,
behind one lock (moto runs under the GIL anyway, so nothing is lost in speed) and runs SQS deletes
under the queue's own message lock, then starts moto's server with the arguments given. Usage: python moto_server.py -H 127.0.0.1 -p 5055
"""

import functools
import threading

from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.responses import DynamoHandler
from moto.sqs.models import Queue

_dynamodb_lock = threading.RLock()

# Every operation that reads or writes items: a write's condition check and its write must be one
# step, and a read must not iterate a table while a write changes it.
_DYNAMODB_ITEM_OPERATIONS = (
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
    "transact_write_items",
    "transact_get_items",
    "batch_get_item",
    "batch_write_item",
    "execute_statement",
    "execute_transaction",
    "batch_execute_statement",
)


def _serialised(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with _dynamodb_lock:
            return method(*args, **kwargs)

    return wrapper


for _name in _DYNAMODB_ITEM_OPERATIONS:
    # The handler reads the old image and the backend writes: both under the lock (it is reentrant).
    for _class in (DynamoDBBackend, DynamoHandler):
        if hasattr(_class, _name):
            setattr(_class, _name, _serialised(getattr(_class, _name)))

_queue_delete = Queue.delete_message


@functools.wraps(_queue_delete)
def _locked_delete(self, receipt_handle):
    with self._messages_lock:
        return _queue_delete(self, receipt_handle)


Queue.delete_message = _locked_delete

if __name__ == "__main__":
    from moto.server import main

    main()
