"""Secrets in a call's arguments never leave the process through a verdict (issue 43, item 6).

A guard's message quotes the call it saw -- ``The same call ("crm_lookup({\\"api_key\\": ...})")``
-- as JSON-quoted data, where a ``"key": "value"`` pattern no longer matched: with the shipped
config a ``repeat_call`` stop wrote ``api_key`` and ``client_secret`` in clear text to the log
line and to an alert webhook's JSON, and its evidence kept them in the run record.  Verdicts are
masked where they enter the run (the engine's ``Guards.note``), and every redactor reads pairs
inside JSON-quoted text too, so an observer's own ``redact_keys`` apply to messages as well.

And conversations stay out of the logs unless asked for: ``[plugins.logging]
capture_content`` is off by default.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.observability import DATA, captured_logs, webhook_server
from support.observability import LogCapture as Capture
from support.otel import Telemetry

from loopwarden import Deployment, FakeClock, Plugin, Run, ToolCall, Verdict, hookimpl
from loopwarden.config import Config, default_config_path, load_toml, parse_config
from loopwarden.notes import Note, instruction_text, mask_note, quote_data, render_note
from loopwarden.plugins.otel import CAPTURE_ENV, OTel, OTelSettings
from loopwarden.redaction import MASK, Redactor

SECRET_REPEAT = str(DATA / "secret_repeat.toml")
SECRETS = ("plain-api-key-7f3a9c21", "cs-very-secret-9876")


@pytest.fixture
def captured() -> Iterator[Capture]:
    with captured_logs("loopwarden") as handler:  # the events and the alerts
        yield handler


def _shipped(**change: Callable[[dict[str, Any]], None]) -> Config:
    """The shipped config.toml, with each named plugin table changed in code."""
    path = default_config_path()
    tables = load_toml(path)
    for name, edit in change.items():
        edit(tables["plugins"].setdefault(name, {}))
    return parse_config(tables, path=str(path))


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


# ---------------------------------------------------------------------------------------------
# The report: the shipped config, a repeat_call stop, a log line and a webhook
# ---------------------------------------------------------------------------------------------


def test_a_repeat_stop_keeps_call_secrets_out_of_the_log_line_and_the_webhook_json(
    deployment_factory: Callable[..., Deployment], captured: Capture
) -> None:
    with webhook_server() as server:

        def add_webhook(table: dict[str, Any]) -> None:
            table["sinks"] = [*table["sinks"], {"type": "webhook", "url": server.url}]

        dep = deployment_factory(_shipped(alerting=add_webhook), clock=FakeClock())
        run = dep.run(scenario=SECRET_REPEAT)
        dep.close()  # delivers the queued alert
        bodies = list(server.bodies)
    record = run.record()
    assert record["termination"] == "repeat_call" and record["stopped_by"] == "repeat_call"

    (line,) = [
        x
        for x in captured.lines("loopwarden.events.guard")
        if "event=guard_triggered" in x and "kind=stop" in x
    ]
    assert "The same call" in line  # the message is there, quoting the call ...
    assert "crm_lookup" in line and "C-42" in line and MASK in line
    assert _leaks(line) == []  # ... without its credentials
    assert _leaks("\n".join(captured.lines())) == []  # nor any other line: alerts included

    (alert,) = [b for b in bodies if b["reason"] == "repeat_call"]
    assert "The same call" in alert["message"] and MASK in alert["message"]
    assert _leaks(json.dumps(alert, ensure_ascii=False)) == []


def test_the_run_record_spans_and_notes_mask_them_too(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CAPTURE_ENV, raising=False)
    telemetry = Telemetry()
    try:
        otel = OTel(
            OTelSettings(capture_content=True),  # content captured: messages leave as text
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        )
        cfg = make_config(plugins={"enabled": ["max_steps", "repeat_call", "otel"]})
        dep = deployment_factory(cfg, plugins={"otel": otel}, clock=FakeClock())
        run = dep.run(scenario=SECRET_REPEAT)
        record = run.record()
        events = [e for s in telemetry.spans("invoke_agent") for e in s.events]
    finally:
        telemetry.shutdown()
    assert record["termination"] == "repeat_call"
    # the record: the stop's evidence quotes the call, masked
    signature = record["evidence"]["signature"]
    assert signature.startswith("crm_lookup(") and MASK in signature and "C-42" in signature
    assert _leaks(json.dumps(record, ensure_ascii=False)) == []
    # the spans: the verdict events' captured message and evidence
    stops = [e for e in events if e.attributes.get("loopwarden.verdict.action") == "stop"]
    assert len(stops) == 1
    attrs = dict(stops[0].attributes)
    assert "The same call" in str(attrs["loopwarden.verdict.message"])
    assert _leaks(json.dumps({k: str(v) for k, v in attrs.items()})) == []
    # the model: every note of the run, the wrap-up turn's included (the model's own tool
    # calls in the conversation still carry what it sent: the notes are the runtime's)
    notes = [str(m["content"]) for m in run.messages if m.get("role") == "system"]
    assert any("The same call" in n for n in notes)
    assert [n for n in notes if _leaks(n)] == []


class EchoingGuard(Plugin):
    """A third-party guard that builds its note as a plain string from the arguments -- the
    way many plugins will -- and stops on the second call."""

    name = "echoing_guard"

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        seen: list[str] = self.state(run)
        seen.append(call.fingerprint)
        if len(seen) == 1:
            return self.warn(f"You called {call.signature()} -- think first.", args=call.arguments)
        return self.stop("echo", soft=True, message=f"Stopped at {call.raw_arguments}")

    def new_state(self) -> list[str]:
        return []


def test_a_plain_string_note_built_from_arguments_reaches_the_model_masked(
    make_config: Callable[..., Config], deployment_factory: Callable[..., Deployment]
) -> None:
    cfg = make_config(plugins={"enabled": ["max_steps", "echoing_guard"]})
    dep = deployment_factory(cfg, plugins={"echoing_guard": EchoingGuard()}, clock=FakeClock())
    run = dep.run(scenario=SECRET_REPEAT)
    record = run.record()
    assert record["termination"] == "echo"
    notes = [str(m["content"]) for m in run.messages if m.get("role") == "system"][1:]
    assert any("You called crm_lookup(" in n for n in notes)
    assert any("Stopped at" in n for n in notes)
    for note in notes:
        assert _leaks(note) == [], note
        assert "C-42" in note  # what is not secret stays readable
    assert record["warnings"][0]["message"].startswith("You called crm_lookup(")
    assert _leaks(json.dumps(record, ensure_ascii=False)) == []  # evidence["args"] too


def test_an_observers_own_redact_keys_reach_into_a_quoted_verdict_message(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
    tmp_path: Path,
) -> None:
    """``ssn`` is not a default secret key: only the logging plugin's list names it, and its
    redactor must find it in the note's JSON-quoted signature."""
    keys = ["ssn", "api_key", "secret"]
    cfg = make_config(
        plugins={
            "enabled": ["max_steps", "repeat_call", "logging"],
            "logging": {"redact_keys": keys},
        }
    )
    dep = deployment_factory(cfg, clock=FakeClock())
    scenario = (DATA / "secret_repeat.toml").read_text(encoding="utf-8")
    path = tmp_path / "ssn_repeat.toml"
    path.write_text(
        scenario.replace('customer = "C-42"', 'customer = "C-42", ssn = "078-05-1120"'),
        encoding="utf-8",
    )
    run = dep.run(scenario=str(path))
    assert run.record()["termination"] == "repeat_call"
    assert "078-05-1120" in json.dumps(run.record(), ensure_ascii=False)  # not a default key
    text = "\n".join(captured.lines("loopwarden.events"))
    assert "The same call" in text
    assert "078-05-1120" not in text and _leaks(text) == []


# ---------------------------------------------------------------------------------------------
# The redactor reads pairs inside JSON-quoted text
# ---------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_a_secret_value_inside_a_quoted_call_is_masked_whole(value: str) -> None:
    """Whatever the value holds -- quotes, backslashes, line breaks, ``}`` -- the note's quoted
    signature comes out exactly as if the value had been the mask."""
    red = Redactor()
    call = json.dumps({"api_key": value, "q": "x"}, ensure_ascii=False)
    masked = json.dumps({"api_key": MASK, "q": "x"}, ensure_ascii=False)
    assert red.text(quote_data(f"f({call})")) == quote_data(f"f({masked})")


def test_masking_a_note_keeps_what_its_instruction_withholds() -> None:
    note = render_note(
        "Call {signature} for {name}.",
        signature='f({"token": "t0k3n-abcdef"})',
        name="t0k3n-abcdef",
    )
    masked = mask_note(note, Redactor(literals=["t0k3n-abcdef"]).text)
    assert isinstance(masked, Note)
    assert "t0k3n-abcdef" not in masked and "t0k3n-abcdef" not in instruction_text(masked)
    assert "[withheld:" in instruction_text(masked)  # the data stays withheld from the model
    assert mask_note(note, lambda s: s) is note  # nothing to mask: the same note


# ---------------------------------------------------------------------------------------------
# Conversations stay out of the logs unless asked for
# ---------------------------------------------------------------------------------------------


def _logged(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
    **logging_settings: Any,
) -> list[dict[str, Any]]:
    tables: dict[str, Any] = {"enabled": ["max_steps", "logging"]}
    if logging_settings:
        tables["logging"] = logging_settings
    dep = deployment_factory(make_config(plugins=tables), clock=FakeClock())
    dep.run("my order 88231 -- can I return it? I am at 12 Elm Street", scenario="refund")
    return captured.fields


def test_logs_carry_no_user_model_or_tool_text_by_default(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    fields = _logged(make_config, deployment_factory, captured)
    started = next(f for f in fields if f["event"] == "run_started")
    assert started["user"] is None
    assert all(f["content"] is None for f in fields if f["event"] == "model_responded")
    assert all(f["result"] is None for f in fields if f["event"] == "tool_finished")
    text = "\n".join(captured.lines())
    assert "Elm Street" not in text and "扫地机" not in text  # the user's, the tool's words
    # what operators need is still there: the events, tools, tokens, the stop
    assert [f["tool"] for f in fields if f["event"] == "tool_finished"] == [
        "query_order",
        "search_knowledge",
        "get_current_time",
        "apply_refund",
    ]
    assert next(f for f in fields if f["event"] == "run_stopped")["termination"] == "final_answer"


def test_capture_content_logs_redacted_previews(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    captured: Capture,
) -> None:
    fields = _logged(make_config, deployment_factory, captured, capture_content=True)
    started = next(f for f in fields if f["event"] == "run_started")
    assert started["user"] == "my order 88231 -- can I return it? I am at 12 Elm Street"
    assert any(f["content"] for f in fields if f["event"] == "model_responded")
    assert any("扫地机" in (f["result"] or "") for f in fields if f["event"] == "tool_finished")
