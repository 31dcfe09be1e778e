# The pytest plugin of sandmesh test runs (services/scheduler/src/testrun/sandmesh_records.py):
# sends each collected test, each test's outcome once it has finished (setup, call and
# teardown), and a closing record (how many tests, pytest's exit status) to the runner's parent
# process over the pipe named by $SANDMESH_TEST_RECORDS, one JSON object a line. The parent
# checks them and writes the report; nothing here is trusted beyond that.
import json
import os

_PIPE = int(os.environ.pop("SANDMESH_TEST_RECORDS"))
_MESSAGE_BYTES = 4096
_outcomes = {}
_collected = []


def _send(**record):
    data = (json.dumps(record) + "\n").encode()
    while data:
        data = data[os.write(_PIPE, data):]


def _announce(test):
    _collected.append(test)
    _send(kind="collected", id=test)


def _names(nodeid):
    """JUnit's classname and name, as pytest's own JUnit report makes them."""
    parts = nodeid.split("::")
    module = os.path.splitext(parts[0])[0].replace("/", ".")
    return ".".join([module] + parts[1:-1]), parts[-1]


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):
        text = report.longrepr[2]
    else:
        text = str(report.longrepr or "")
    return text[:_MESSAGE_BYTES]


def pytest_collectreport(report):
    # A module that does not import is reported as an error of its own, as pytest's JUnit
    # report has it.
    if report.failed:
        _announce(report.nodeid)
        classname, name = _names(report.nodeid)
        _send(kind="test", id=report.nodeid, name=name, classname=classname, status="error",
              message=_message(report), duration_ms=0)


def pytest_collection_finish(session):
    for item in session.items:
        _announce(item.nodeid)


def pytest_runtest_logreport(report):
    outcome = _outcomes.setdefault(report.nodeid, {"status": "passed", "duration_ms": 0})
    outcome["duration_ms"] += int(report.duration * 1000)
    # The first verdict stands (a teardown error after the test's own failure: it failed).
    if outcome["status"] != "passed":
        return
    if report.skipped:
        outcome["status"] = "skipped"
        outcome["message"] = _message(report)
    elif report.failed:
        outcome["status"] = "failed" if report.when == "call" else "error"
        outcome["message"] = _message(report)


def pytest_runtest_logfinish(nodeid, location):
    outcome = _outcomes.pop(nodeid, {"status": "error", "message": "no outcome"})
    classname, name = _names(nodeid)
    _send(kind="test", id=nodeid, name=name, classname=classname, **outcome)


def pytest_sessionfinish(session, exitstatus):
    _send(kind="closing", collected=len(_collected), exit=int(exitstatus))
