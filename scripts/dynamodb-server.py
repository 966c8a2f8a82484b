"""A DynamoDB-compatible server for the tests: moto's, on one thread.

moto's own `moto_server` serves each request on a thread of its own, and its
DynamoDB checks a ConditionExpression and then writes in two steps of Python:
two concurrent conditional writes of one key can both pass. Served on one
thread, every request runs alone, so each conditional write is atomic, as in
DynamoDB. (One thread also means HTTP/1.0 without keep-alive: a connection
per request, which clients handle.)

Usage: python3 scripts/dynamodb-server.py HOST PORT, with moto on PYTHONPATH
(scripts/services.sh installs it).
"""

import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

host, port = sys.argv[1], int(sys.argv[2])
run_simple(host, port, DomainDispatcherApplication(create_backend_app), threaded=False)
