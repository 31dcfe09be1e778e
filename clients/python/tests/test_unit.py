"""What needs no mesh: the error mapping from headers and bodies, the golden vectors of the
``messages`` crate, where connection details come from, ids, and output ordering."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import msgpack
import pytest

import sandmesh
from sandmesh._exec import _Mailbox, _Output, exec_request, refused
from sandmesh._files import decode_content, wire_content
from sandmesh._transport import Codec, connect_info, new_id
from sandmesh.errors import error_from_body, error_from_reply

TESTDATA = Path(__file__).resolve().parents[3] / "crates" / "messages" / "testdata"

CODES = [
    (400, "bad_request", sandmesh.BadRequest),
    (401, "unauthorized", sandmesh.Unauthorized),
    (403, "denied", sandmesh.Denied),
    (404, "not_found", sandmesh.NotFound),
    (409, "conflict", sandmesh.Conflict),
    (413, "too_large", sandmesh.TooLarge),
    (429, "overloaded", sandmesh.Overloaded),
    (500, "internal", sandmesh.Internal),
    (501, "not_implemented", sandmesh.NotSupported),
    (503, "unavailable", sandmesh.Unavailable),
    (504, "timeout", sandmesh.Timeout),
]


@pytest.mark.parametrize("code,kind,cls", CODES)
def test_every_error_code_has_its_class(code: int, kind: str, cls: type) -> None:
    headers = {"Nats-Service-Error-Code": str(code), "Nats-Service-Error": "m"}
    body = {"code": code, "kind": kind, "message": "why", "details": {"field": "x"}}
    e = error_from_reply(headers, body, subject="sandbox.v1.exec")
    assert type(e) is cls
    assert (e.code, e.kind, e.message, e.details, e.subject) == (code, kind, "why", {"field": "x"}, "sandbox.v1.exec")
    assert isinstance(e, sandmesh.SandmeshError)
    # A body that did not decode still has the code and the header's text.
    bare = error_from_reply(headers, None)
    assert (type(bare), bare.code, bare.message) == (cls, code, "m")


def test_a_reply_without_error_headers_is_no_error() -> None:
    assert error_from_reply({"Content-Type": "application/json"}, {"kind": "denied"}) is None
    assert error_from_reply(None, None) is None


def test_unknown_codes_and_kinds_fall_back() -> None:
    assert type(error_from_reply({"Nats-Service-Error-Code": "418"}, None)) is sandmesh.Internal
    assert type(error_from_reply({"Nats-Service-Error-Code": "x"}, None)) is sandmesh.Internal
    # An unknown kind is decided by the code.
    e = error_from_body({"code": 404, "kind": "vanished", "message": "gone"})
    assert type(e) is sandmesh.NotFound


def test_every_kind_the_mesh_answers_is_in_the_table_above() -> None:
    # The wire's kinds and codes are the Rust enum's (`ErrorKind::code`): a kind added there
    # without a class here fails this test.
    source = (Path(__file__).resolve().parents[3] / "crates/messages/src/error.rs").read_text()
    code_fn = source[source.index("pub const fn code(self)") :]
    code_fn = code_fn[: code_fn.index("\n    }\n")]
    arms = re.findall(r"ErrorKind::(\w+) => (\d+)", code_fn)
    assert len(arms) >= 11, code_fn
    snake = lambda name: re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
    assert sorted((int(code), snake(name)) for name, code in arms) == sorted((c, k) for c, k, _ in CODES)


def test_overloaded_carries_the_retry_hint_when_there_is_one() -> None:
    headers = {"Nats-Service-Error-Code": "429"}
    hinted = error_from_reply(headers, {"kind": "overloaded", "message": "busy", "details": {"retry_after_ms": 1500}})
    assert hinted.retry_after == 1.5
    by_header = error_from_reply(dict(headers, **{"Retry-After": "2"}), {"kind": "overloaded", "message": "busy"})
    assert by_header.retry_after == 2.0
    unsaid = error_from_reply(headers, {"kind": "overloaded", "message": "busy"})
    assert unsaid.retry_after is None


def test_the_golden_error_vector_maps_to_its_class() -> None:
    body = json.loads((TESTDATA / "error.json").read_text())
    packed = msgpack.unpackb((TESTDATA / "error.msgpack").read_bytes(), raw=False)
    assert body == packed
    e = error_from_body(body)
    assert (e.code, e.kind) == (body["code"], body["kind"])


def test_a_field_the_mesh_does_not_know_is_a_bad_request_naming_it() -> None:
    # The mesh refuses a request field it does not have rather than ignore it (a misspelt
    # `allow_domains` would open a session with no network policy): the SDK raises BadRequest
    # with the field's path in its details.
    body = json.loads((TESTDATA / "error_unknown_field.json").read_text())
    assert body == msgpack.unpackb((TESTDATA / "error_unknown_field.msgpack").read_bytes(), raw=False)
    e = error_from_reply({"Nats-Service-Error-Code": "400"}, body, subject="sandbox.v1.sessions.open")
    assert type(e) is sandmesh.BadRequest
    assert "unknown field `allow` in `network`" in e.message
    assert e.details["field"] == "network.allow"
    assert "allow_domains" in e.details["expected"]


def test_the_golden_exec_result_decodes_the_same_from_json_and_msgpack() -> None:
    as_json = sandmesh.ExecResult.from_wire(json.loads((TESTDATA / "exec_result.json").read_text()))
    as_msgpack = sandmesh.ExecResult.from_wire(
        Codec.decode((TESTDATA / "exec_result.msgpack").read_bytes(), {"Content-Type": "application/msgpack"})
    )
    assert as_json == as_msgpack
    assert (as_json.status, as_json.exit_code, as_json.stdout, as_json.tier) == ("ok", 0, "hi\n", "session")
    assert as_json.risk.findings[0].rule == "py.subprocess"
    assert as_json.confirmation == sandmesh.ConfirmationOutcome("approved", "alice", None)
    assert as_json.timing.total_ms == 2063 and as_json.usage.cpu_ms == 12
    assert as_json.files_created == ["output/result.txt"] and as_json.ok
    assert (as_json.files_refused, as_json.files_omitted) == ([], 0)


def test_the_golden_result_with_files_not_saved_names_them() -> None:
    as_json = sandmesh.ExecResult.from_wire(
        json.loads((TESTDATA / "exec_result_files_refused.json").read_text())
    )
    as_msgpack = sandmesh.ExecResult.from_wire(
        Codec.decode(
            (TESTDATA / "exec_result_files_refused.msgpack").read_bytes(),
            {"Content-Type": "application/msgpack"},
        )
    )
    assert as_json == as_msgpack
    assert [f.path for f in as_json.files_refused] == ["weird\nname.txt"]
    assert as_json.files_omitted == 50001
    assert as_json.error is not None and as_json.error["details"]["max_changed_paths"] == 10000


def test_the_golden_test_report_decodes_the_same_from_json_and_msgpack() -> None:
    as_json = sandmesh.TestReport.from_wire(json.loads((TESTDATA / "test_report.json").read_text()))
    as_msgpack = sandmesh.TestReport.from_wire(
        Codec.decode((TESTDATA / "test_report.msgpack").read_bytes(), {"Content-Type": "application/msgpack"})
    )
    assert as_json == as_msgpack
    assert (as_json.status, as_json.exec_status, as_json.passed) == ("failed", "error", False)
    assert [(t.name, t.status) for t in as_json.tests] == [("test_add", "passed"), ("test_sub", "failed")]
    assert as_json.tests[1].message == "assert -1 == 1"
    assert as_json.totals == {"passed": 1, "failed": 1, "errors": 0, "skipped": 0}


def test_the_golden_kernel_vectors_decode_and_encode() -> None:
    result = sandmesh.ExecResult.from_wire(json.loads((TESTDATA / "exec_result_kernel.json").read_text()))
    png, html = result.outputs
    assert (png.kind, png.mime_type, png.encoding) == ("display", "image/png", "base64")
    assert png.data is not None and png.data.startswith(b"\x89PNG")
    assert (html.kind, html.path, html.data) == ("result", "artifacts/output-1f2e3d4c5b6a.html", None)
    assert result.cell_error == sandmesh.CellError(
        "ZeroDivisionError", "division by zero", ["Traceback (most recent call last):\n"]
    )
    assert result.state_lost
    golden = json.loads((TESTDATA / "exec_request_kernel.json").read_text())
    ours = exec_request(
        "print('hi')", "python", session_id="s1", template=None, timeout=5.0, env=None,
        files=None, stdin=None, tier="auto", limits={"memory_mb": 256, "pids": 64},
        network=None, execution_id="01JD0000000000000000000000", requested_by="agent-7",
        stream_output=True, kernel=True,
    )
    assert ours == golden


def test_the_golden_risk_assessment_decodes() -> None:
    risk = sandmesh.RiskAssessment.from_wire(json.loads((TESTDATA / "risk_assessment.json").read_text()))
    assert risk.level in ("safe", "low", "medium", "high", "critical")
    assert risk.findings and risk.findings[0].rule


def test_a_request_built_here_equals_the_golden_vector() -> None:
    golden = json.loads((TESTDATA / "exec_request.json").read_text())
    ours = exec_request(
        "print('hi')",
        "python",
        session_id="s1",
        template=None,
        timeout=5.0,
        env={"GREETING": "hello"},
        files={"data/in.txt": b"hi"},
        stdin=None,
        tier="auto",
        limits={"memory_mb": 256, "pids": 64},
        network=None,
        execution_id="01JD0000000000000000000000",
        requested_by="agent-7",
        stream_output=True,
    )
    assert ours == golden
    packed = msgpack.unpackb((TESTDATA / "exec_request.msgpack").read_bytes(), raw=False)
    assert msgpack.unpackb(Codec("msgpack").encode(ours), raw=False) == packed
    # Unset fields are left out, as the Rust side's skip_serializing_if does.
    bare = exec_request("x", "shell", session_id=None, template=None, timeout=None, env=None,
                        files=None, stdin=None, tier=None, limits=None, network=None,
                        execution_id=None, requested_by=None, stream_output=False)
    assert bare == {"language": "shell", "code": "x"}


def test_files_travel_as_text_or_base64() -> None:
    assert wire_content(b"hello\n") == {"content": "hello\n", "encoding": "utf8"}
    binary = wire_content(bytes(range(256)))
    assert binary["encoding"] == "base64"
    assert decode_content(binary) == bytes(range(256))
    spec = exec_request(
        "x", "python", session_id=None, template=None, timeout=1.5, env=None,
        files={"a.txt": "t", "b.bin": b"\x00\x01"}, stdin=None, tier=None, limits=None,
        network=None, execution_id=None, requested_by=None, stream_output=False,
    )
    assert spec["timeout_ms"] == 1500
    assert spec["files"] == [
        {"path": "a.txt", "content": "t", "encoding": "utf8"},
        {"path": "b.bin", "content": "AAE=", "encoding": "base64"},
    ]


def test_a_template_is_passed_through_for_the_mesh_to_resolve() -> None:
    req = exec_request("x", "python", session_id=None, template="python-data", timeout=None,
                       env=None, files=None, stdin=None, tier=None, limits=None, network=None,
                       execution_id=None, requested_by=None, stream_output=False)
    assert req["template"] == "python-data"


def test_refused_results_raise_their_kind_and_ran_results_do_not() -> None:
    denied = sandmesh.ExecResult.from_wire(
        {"execution_id": "e", "status": "denied", "tier": "session",
         "error": {"code": 403, "kind": "denied", "message": "no"}}
    )
    e = refused(denied)
    assert type(e) is sandmesh.Denied and e.result is denied
    lost = refused(sandmesh.ExecResult.from_wire({"execution_id": "e", "status": "executor_lost", "tier": "session"}))
    assert type(lost) is sandmesh.Unavailable
    assert refused(sandmesh.ExecResult.from_wire({"execution_id": "e", "status": "error", "exit_code": 3, "tier": "ephemeral"})) is None


def test_output_is_delivered_in_seq_order_whatever_the_arrival_order() -> None:
    seen = []

    async def scenario() -> None:
        out = _Output(lambda s: seen.append(("out", s)), lambda s: seen.append(("err", s)))
        for seq, stream, data, eof in [(2, "stdout", "c", False), (0, "stdout", "a", False),
                                       (1, "stderr", "b", False), (1, "stderr", "b", False),
                                       (3, "stdout", "", True)]:
            await out.add(sandmesh.OutputChunk(seq, stream, data, eof))
        assert out.eof

    asyncio.run(scenario())
    assert seen == [("out", "a"), ("err", "b"), ("out", "c")]


def test_ids_are_ulids() -> None:
    ids = [new_id() for _ in range(50)]
    assert all(re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", i) for i in ids)
    assert len(set(ids)) == 50


def test_connection_details_come_from_the_places_the_cli_reads(tmp_path: Path) -> None:
    creds = tmp_path / "creds" / "agent.json"
    creds.parent.mkdir()
    creds.write_text(json.dumps({"url": "nats://127.0.0.1:4999", "user": "default-agent", "password": "pw", "role": "agent"}))
    by_file = connect_info(creds=str(creds), env={})
    assert (by_file.servers, by_file.user, by_file.password) == (["nats://127.0.0.1:4999"], "default-agent", "pw")
    by_url = connect_info(env={"SANDMESH_NATS_URL": "nats://a:b@10.0.0.1:4222", "SANDMESH_PREFIX": "acme"})
    assert (by_url.servers, by_url.user, by_url.password, by_url.prefix) == (["nats://10.0.0.1:4222"], "a", "b", "acme")
    by_data_dir = connect_info(env={"SANDMESH_DATA_DIR": str(tmp_path)})
    assert (by_data_dir.servers, by_data_dir.user) == (["nats://127.0.0.1:4999"], "default-agent")
    with pytest.raises(sandmesh.BadRequest, match="credentials"):
        connect_info(creds=str(tmp_path / "nope.json"), env={})


def test_a_mailbox_hands_messages_over_in_order_and_times_out() -> None:
    async def scenario() -> None:
        box = _Mailbox()
        box.put("held")  # before anyone waits
        assert await box.get(1.0) == "held"
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, box.put, "first")
        loop.call_later(0.01, box.put, "second")
        assert [await box.get(5.0), await box.get(5.0)] == ["first", "second"]
        with pytest.raises(asyncio.TimeoutError):
            await box.get(0.05)
        with pytest.raises(asyncio.TimeoutError):
            await box.get(0)
        box.put("after a timeout")  # a late message still arrives for the next get
        assert await box.get(1.0) == "after a timeout"

    asyncio.run(scenario())


def test_a_record_with_exposed_ports_decodes_from_msgpack() -> None:
    """The mesh's MessagePack keys a session's exposed ports by their numbers (in JSON they are
    strings, as JSON keys are)."""
    raw = json.loads((TESTDATA / "session_record.json").read_text())
    raw["ports"] = {8000: {"token_sha256": "00" * 32, "expires_at": 1_764_003_600_000}}
    decoded = Codec.decode(msgpack.packb(raw, use_bin_type=True), {"Content-Type": "application/msgpack"})
    assert decoded["ports"] == raw["ports"]
    assert sandmesh.SessionInfo.from_wire(decoded).state == "closed"


def test_a_session_opened_here_sends_the_golden_vector_and_reads_its_record() -> None:
    sm = sandmesh.AsyncSandmesh("nats://127.0.0.1:4222")
    session = sm.session(
        "s1",
        tier="session",
        template="python-data",
        env={"MODE": "fast"},
        timeout_ms=10_000,
        ttl_ms=3_600_000,
        idle_ms=600_000,
        filesystem={
            "deny_read": ["/etc/ssl/private"],
            "allow_write": ["/opt/cache"],
            "deny_write": ["/opt/cache/pinned"],
        },
    )
    body = dict(session._open_fields, session_id="s1")
    assert body == json.loads((TESTDATA / "session_open.json").read_text())
    for raw in (
        json.loads((TESTDATA / "session_record.json").read_text()),
        Codec.decode((TESTDATA / "session_record.msgpack").read_bytes(), {"Content-Type": "application/msgpack"}),
    ):
        record = sandmesh.SessionInfo.from_wire(raw)
        assert (record.state, record.close_reason, record.template) == ("closed", "ttl", "python-data")
        assert record.env == {"MODE": "fast"} and record.timeout_ms == 10_000
        assert record.expires_at == 1_764_003_600_000 and record.closed_at == 1_764_003_600_500
