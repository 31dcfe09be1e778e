"""Executions and browser actions waiting for a person: the notice reaches the callback at once,
an operator decides with the real CLI (`sandmesh confirm approve|deny`), and a caller whose time
runs out is told which confirmation it waits for."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import pytest

import sandmesh
from sandmesh import Confirmation, Sandmesh

from conftest import Mesh

#: Strict mode (the default `up` runs) asks a person for code the assessor rates high.
RISKY = "import os\nos.system('echo approved-run')"
BOUND = 90.0


class Waiting:
    """Runs a risky execution on a thread and hands its approval notice over."""

    def __init__(self, sm: Sandmesh, **run_args: Any) -> None:
        self.notices: List[Confirmation] = []
        self.noticed = threading.Event()
        self.outcome: Dict[str, Any] = {}

        def notice(c: Confirmation) -> None:
            self.notices.append(c)
            self.noticed.set()

        def work() -> None:
            try:
                self.outcome["result"] = sm.run(RISKY, on_awaiting_approval=notice, **run_args)
            except sandmesh.SandmeshError as e:
                self.outcome["error"] = e

        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()

    def confirmation(self) -> Confirmation:
        assert self.noticed.wait(BOUND), f"no approval notice within {BOUND} s: {self.outcome}"
        return self.notices[0]

    def finish(self) -> Dict[str, Any]:
        self.thread.join(BOUND)
        assert not self.thread.is_alive(), "the execution did not finish after the decision"
        return self.outcome


def decide(mesh: Mesh, verb: str, confirmation_id: str, *extra: str) -> None:
    done = mesh.cli("confirm", verb, confirmation_id, *extra)
    assert done.returncode == 0, f"sandmesh confirm {verb}: {done.stdout}{done.stderr}"


def test_the_risky_code_needs_a_person_in_strict_mode(sm: Sandmesh) -> None:
    risk = sm.assess(RISKY)
    assert risk.requires_confirmation and risk.level in ("high", "critical"), risk


def test_a_person_approves_and_the_run_finishes(sm: Sandmesh, mesh: Mesh) -> None:
    waiting = Waiting(sm)
    c = waiting.confirmation()
    assert c.confirmation_id and c.execution_id and c.expires_at > 0
    assert "result" not in waiting.outcome, "the call keeps waiting for the result"
    listed = mesh.cli("confirm", "list")
    assert c.confirmation_id in listed.stdout, listed.stdout + listed.stderr
    decide(mesh, "approve", c.confirmation_id)
    outcome = waiting.finish()
    r = outcome.get("result")
    assert r is not None, outcome
    assert (r.status, r.stdout) == ("ok", "approved-run\n"), r
    assert r.execution_id == c.execution_id
    assert r.confirmation.decision == "approved" and r.confirmation.by
    assert len(waiting.notices) == 1


def test_a_person_denies_and_the_caller_gets_denied(sm: Sandmesh, mesh: Mesh) -> None:
    waiting = Waiting(sm)
    c = waiting.confirmation()
    decide(mesh, "deny", c.confirmation_id, "--reason", "not on my watch")
    outcome = waiting.finish()
    e = outcome.get("error")
    assert isinstance(e, sandmesh.Denied), outcome
    assert (e.code, e.kind) == (403, "denied")
    assert e.result is not None and e.result.status == "denied"
    assert e.result.confirmation.decision == "denied"
    assert e.result.confirmation.reason == "not on my watch"
    assert "not on my watch" in str(e)


def test_a_caller_out_of_time_is_told_the_confirmation_id(sm: Sandmesh, mesh: Mesh) -> None:
    seen: List[Confirmation] = []
    with pytest.raises(sandmesh.Timeout) as caught:
        sm.run(RISKY, on_awaiting_approval=seen.append, request_timeout=3)
    e = caught.value
    assert seen and e.confirmation_id == seen[0].confirmation_id
    assert e.execution_id == seen[0].execution_id
    assert e.confirmation_id in str(e) and "approve" in str(e)
    # The execution stays parked; its job handle says what it waits for.
    job = sm.job(e.execution_id)
    assert job.poll() is None
    assert job.confirmation is not None and job.confirmation.confirmation_id == e.confirmation_id
    decide(mesh, "deny", e.confirmation_id, "--reason", "too late")
    late = job.result(timeout=BOUND, check=False)
    assert (late.status, late.confirmation.decision) == ("denied", "denied")


def test_an_async_job_waiting_for_a_person_times_out_naming_it(sm: Sandmesh, mesh: Mesh) -> None:
    job = sm.submit(RISKY)
    with pytest.raises(sandmesh.Timeout) as caught:
        job.result(timeout=3)
    e = caught.value
    assert e.confirmation_id, f"the timeout names no confirmation: {e}"
    assert e.confirmation_id in str(e)
    decide(mesh, "approve", e.confirmation_id)
    assert job.result(timeout=BOUND).stdout == "approved-run\n"


def test_a_password_fill_tells_the_callback_and_is_done_once_approved(sm: Sandmesh, mesh: Mesh) -> None:
    with sm.session(f"sdk-fill-approval-{int(time.time() * 1000)}") as s:
        assert s.browser.navigate(mesh.fixture_url).ok
        notices: List[Confirmation] = []
        noticed = threading.Event()
        outcome: Dict[str, Any] = {}

        def notice(c: Confirmation) -> None:
            notices.append(c)
            noticed.set()

        def work() -> None:
            try:
                outcome["result"] = s.browser.fill("#pw", "hunter2", on_awaiting_approval=notice)
            except sandmesh.SandmeshError as e:
                outcome["error"] = e

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        assert noticed.wait(BOUND), f"no approval notice within {BOUND} s: {outcome}"
        c = notices[0]
        assert c.confirmation_id and c.execution_id and c.expires_at > time.time() * 1000, c
        assert not outcome, "the fill waits for the decision"
        listed = mesh.cli("confirm", "list")
        assert c.confirmation_id in listed.stdout, listed.stdout + listed.stderr
        decide(mesh, "approve", c.confirmation_id)
        thread.join(BOUND)
        assert not thread.is_alive(), "the fill did not finish after the approval"
        r = outcome.get("result")
        assert r is not None and r.ok, outcome
        assert (r.confirmation, r.confirmation_id) == ("approved", c.confirmation_id), r
        assert len(notices) == 1


def test_a_fill_out_of_time_is_told_the_confirmation_id(sm: Sandmesh, mesh: Mesh) -> None:
    with sm.session(f"sdk-fill-late-{int(time.time() * 1000)}") as s:
        assert s.browser.navigate(mesh.fixture_url).ok
        seen: List[Confirmation] = []
        with pytest.raises(sandmesh.Timeout) as caught:
            s.browser.fill("#pw", "x", on_awaiting_approval=seen.append, request_timeout=3)
        e = caught.value
        assert seen and e.confirmation_id == seen[0].confirmation_id, (seen, e)
        assert e.confirmation_id in str(e) and "approve" in str(e) and "browser action" in str(e), str(e)
        decide(mesh, "deny", e.confirmation_id, "--reason", "too late")
