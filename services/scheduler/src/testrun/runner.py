# The sandmesh test runner (services/scheduler/src/testrun/runner.py), for pytest and for
# `node --test`: the parent process of the test tool, which holds what the code under test must
# not reach. It takes the run's key from its stdin, starts the tool as a child without it,
# receives each test's outcome over a pipe as it finishes (from a plugin or reporter inside the
# tool), checks the records, and writes the JUnit report sealed with an HMAC of the key. The
# code under test can rewrite files and choose its exit code; it cannot make a report the
# scheduler accepts. It stops the tests before the execution's own deadline (SIGINT, then
# SIGKILL), so the tests that finished are reported even when one never ends.
import ctypes
import hashlib
import hmac
import json
import os
import select
import signal
import subprocess
import sys
import time

CONFIG = json.loads(__CONFIG__)
PR_SET_DUMPABLE = 4
# A hostile child may flood the pipe: one record, and all of them, are bounded.
MAX_RECORD_BYTES = 64 * 1024
MAX_RECORDS = 2 * CONFIG["max_cases"] + 2
STATUSES = ("passed", "failed", "error", "skipped")


def take_key():
    """The run's key, read after this process became non-dumpable: from then on a process of
    the same user can neither ptrace it nor open its memory, environment or descriptors."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("sandmesh: cannot keep the test run's key from the tests (prctl: %s)"
                 % os.strerror(ctypes.get_errno()))
    # The child gets none of it: its stdin is /dev/null and no other descriptor is passed.
    return bytes.fromhex(sys.stdin.read().strip())


def outcome(test, record):
    """A test's outcome with only the fields the report shows, each of its type."""
    def text(name):
        value = record.get(name)
        return value if isinstance(value, str) else ""
    duration = record.get("duration_ms")
    if not isinstance(duration, (int, float)) or not 0 <= duration < 1e12:
        duration = 0
    return {"status": record["status"], "name": text("name") or test,
            "classname": text("classname"), "message": text("message"), "duration_ms": duration}


class Ledger:
    """The records of one run, checked as they arrive: a test is collected once and reported
    once, and a report for a test never collected, or anything after the closing record, is
    refused. The first reason to refuse the run stands."""

    def __init__(self):
        self.collected = {}
        self.outcomes = {}
        self.closing = None
        self.refused = None
        self.pending = b""
        self.count = 0

    def refuse(self, reason):
        if self.refused is None:
            self.refused = reason

    def feed(self, chunk):
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self.take(line)
        if len(self.pending) > MAX_RECORD_BYTES:
            self.refuse("a record longer than %d bytes" % MAX_RECORD_BYTES)
            self.pending = b""

    def take(self, line):
        self.count += 1
        if self.refused is not None:
            return
        if self.count > MAX_RECORDS:
            return self.refuse("more records than tests (at most %d)" % CONFIG["max_cases"])
        try:
            record = json.loads(line)
            kind = record["kind"]
        except (ValueError, TypeError, KeyError):
            return self.refuse("a record that is not the runner's: %r" % line[:80])
        if self.closing is not None:
            return self.refuse("a record after the closing record")
        if kind == "collected":
            test = record.get("id")
            if not isinstance(test, str):
                return self.refuse("a collected record without a test id")
            if test in self.collected:
                return self.refuse("test %r collected twice" % test)
            self.collected[test] = True
        elif kind == "test":
            test = record.get("id")
            if not isinstance(test, str) or test not in self.collected:
                return self.refuse("an outcome for test %r, which was never collected" % (test,))
            if test in self.outcomes:
                return self.refuse("test %r reported twice" % test)
            if record.get("status") not in STATUSES:
                return self.refuse("test %r has no known status" % test)
            self.outcomes[test] = outcome(test, record)
        elif kind == "closing":
            collected, code = record.get("collected"), record.get("exit")
            if not isinstance(collected, int) or not isinstance(code, int):
                return self.refuse("a closing record without its counts")
            self.closing = (collected, code)
        else:
            self.refuse("a record of unknown kind %r" % (kind,))

    def end(self, exit_code, timed_out):
        """How the run ended: `complete`, `timeout` or `refused`, and the reason refused."""
        if self.pending:
            self.refuse("a record cut off at the end")
        if self.refused is not None:
            return "refused", self.refused
        if timed_out:
            return "timeout", None
        if self.closing is None:
            return "refused", ("the test tool ended (exit %d) without its closing record: it "
                               "stopped before the tests finished" % exit_code)
        collected, code = self.closing
        if collected != len(self.collected):
            return "refused", ("the test tool counted %d tests, but %d were collected"
                               % (collected, len(self.collected)))
        missing = [t for t in self.collected if t not in self.outcomes]
        if missing:
            return "refused", ("%d collected tests were never reported (%r first)"
                               % (len(missing), missing[0]))
        if code != exit_code:
            return "refused", ("the test tool exited with %d, but its closing record says %d"
                               % (exit_code, code))
        return "complete", None


def command():
    records = os.path.abspath(os.path.join(CONFIG["runner_dir"], CONFIG["records"]))
    if CONFIG["language"] == "javascript":
        return [
            "node", "--test",
            "--test-reporter=spec", "--test-reporter-destination=stdout",
            "--test-reporter=" + records, "--test-reporter-destination=stderr",
            CONFIG["tests"],
        ], {}
    module = os.path.splitext(CONFIG["records"])[0]
    return [
        sys.executable, "-m", "pytest",
        "-p", "no:cacheprovider", "-p", module,
        CONFIG["tests"],
    ], {"PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(records),
                                                    os.environ.get("PYTHONPATH")]))}


def child_env(extra, records_fd):
    env = dict(os.environ)
    # What kept this interpreter's start-up to itself is not the tests' business.
    for name in ("PYTHONSAFEPATH", "PYTHONNOUSERSITE"):
        env.pop(name, None)
    env.update(CONFIG["env"])
    env.update(extra)
    env["SANDMESH_TEST_RECORDS"] = str(records_fd)
    return env


def run(ledger):
    """Runs the tool to its end or its budget; its exit code and whether it ran out of time."""
    argv, extra = command()
    records_r, records_w = os.pipe()
    # The child's end wakes the loop below (the handler only has to exist for the wake-up).
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    child = subprocess.Popen(argv, cwd=CONFIG["dir"], stdin=subprocess.DEVNULL,
                             pass_fds=(records_w,), env=child_env(extra, records_w))
    os.close(records_w)
    deadline = time.monotonic() + CONFIG["budget_ms"] / 1000
    timed_out = False
    reading = True
    while child.poll() is None:
        watched = [wake_r] + ([records_r] if reading else [])
        ready, _, _ = select.select(watched, [], [], max(0, deadline - time.monotonic()))
        if records_r in ready:
            chunk = os.read(records_r, 65536)
            ledger.feed(chunk)
            reading = bool(chunk)
        if wake_r in ready:
            os.read(wake_r, 512)
        if not ready and child.poll() is None:
            if timed_out:
                child.kill()
                child.wait()
                break
            timed_out = True
            child.send_signal(signal.SIGINT)
            deadline = time.monotonic() + CONFIG["grace_ms"] / 1000
    # What the tool wrote before it ended is read; a process it left behind holding the pipe
    # is not waited for.
    os.set_blocking(records_r, False)
    while reading:
        try:
            chunk = os.read(records_r, 65536)
        except BlockingIOError:
            break
        ledger.feed(chunk)
        reading = bool(chunk)
    os.close(records_r)
    return child.returncode, timed_out


def attr(value):
    text = "".join(c if c in "\t\n\r" or " " <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd"
                   or c >= "\U00010000" else "\ufffd" for c in str(value))
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;")
            .replace("\t", "&#9;"))


def junit(ledger, outcome, reason):
    cases = []
    for record in ledger.outcomes.values():
        status = record["status"]
        inner = ""
        if status != "passed":
            element = {"failed": "failure", "error": "error", "skipped": "skipped"}[status]
            inner = '<%s message="%s"/>' % (element, attr(record["message"]))
        cases.append('<testcase name="%s" classname="%s" time="%.3f">%s</testcase>'
                     % (attr(record["name"]), attr(record["classname"]),
                        record["duration_ms"] / 1000, inner))
    refused = ' sandmesh-reason="%s"' % attr(reason) if reason else ""
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            '<testsuites sandmesh-run="%s"%s><testsuite name="%s" tests="%d">%s</testsuite>'
            '</testsuites>\n' % (outcome, refused, CONFIG["language"], len(cases),
                                 "".join(cases))).encode()


def write_sealed(path, body, key):
    """The report, then the HMAC-SHA256 of its bytes; a name the tests left in the way (a
    file, a symlink) is replaced, never followed."""
    tag = hmac.new(key, body, hashlib.sha256).hexdigest()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".partial"
    try:
        os.unlink(partial)
    except FileNotFoundError:
        pass
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(body + CONFIG["seal_prefix"].encode() + tag.encode() + b" -->\n")
    os.replace(partial, path)


def main():
    key = take_key()
    ledger = Ledger()
    exit_code, timed_out = run(ledger)
    outcome, reason = ledger.end(exit_code, timed_out)
    write_sealed(os.path.abspath(CONFIG["report"]), junit(ledger, outcome, reason), key)
    if outcome == "timeout":
        print("sandmesh: the tests ran out of time", file=sys.stderr, flush=True)
        return CONFIG["timeout_exit"]
    if outcome == "refused":
        print("sandmesh: the test run's records are refused: " + reason, file=sys.stderr,
              flush=True)
        return 1
    return exit_code


sys.exit(main())
