# The sandmesh test runner for Python (services/scheduler/src/testrun/runner.py): runs pytest on
# the tests and leaves a JUnit report in the workspace. It stops the tests before the
# execution's own deadline, by SIGINT (KeyboardInterrupt), on which pytest still writes its
# report, so the tests that finished are reported even when one never ends.
import json
import os
import signal
import subprocess
import sys

CONFIG = json.loads(__CONFIG__)


def main():
    report = os.path.abspath(CONFIG["report"])
    os.makedirs(os.path.dirname(report), exist_ok=True)
    command = [
        sys.executable, "-m", "pytest",
        "-p", "no:cacheprovider",
        "-o", "junit_family=xunit1",
        "--junitxml=" + report,
        CONFIG["tests"],
    ]
    child = subprocess.Popen(command, cwd=CONFIG["dir"])
    try:
        return child.wait(timeout=CONFIG["budget_ms"] / 1000)
    except subprocess.TimeoutExpired:
        pass
    child.send_signal(signal.SIGINT)
    try:
        child.wait(timeout=CONFIG["grace_ms"] / 1000)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    print("sandmesh: the tests ran out of time", file=sys.stderr, flush=True)
    return CONFIG["timeout_exit"]


sys.exit(main())
