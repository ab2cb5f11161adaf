"""What one step of the shipped stack no longer calls (issue 23: a cheaper step).

Each test pins one mechanism of the per-step path by cProfile's call counts (deterministic;
speed itself is measured in bench/overhead.py only): calls per step are the difference between
a long and a short run of the bench's workload (support/calls.py), so what a run does once
cancels out.  The behaviour each cut keeps is covered by the plugins' own tests and by
test_hot_path.py; here are the calls that must stay gone.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.calls import bench_common, calls_per_step, count_calls, play, shipped_deployment

from loopwarden import SystemClock, signals


@pytest.fixture(scope="module")
def per_step() -> dict[str, float]:
    """Calls per step of the shipped stack, cooperative tool, sync driver."""
    dep = shipped_deployment()
    try:
        return calls_per_step(dep)
    finally:
        dep.close()


def test_the_system_clock_is_read_in_one_call() -> None:
    # SystemClock.now is time.monotonic itself, not a method wrapping it
    clock = SystemClock()
    _, counts = count_calls(clock.now)
    assert sum(counts.values()) == 1
    assert counts["~:<built-in method time.monotonic>"] == 1
    assert isinstance(clock.now(), float)


def test_a_quiet_step_reads_no_resolution_property(per_step: dict[str, float]) -> None:
    # a hook whose plugins all carried on returns EMPTY: the loop checks its verdicts only
    assert per_step.get("verdicts.py:stop", 0) == 0
    assert per_step.get("verdicts.py:skip", 0) == 0


def test_hook_dispatch_reads_its_plan_inline(per_step: dict[str, float]) -> None:
    assert per_step.get("dispatch.py:_plan", 0) == 0
    assert per_step["dispatch.py:_call"] == 4  # before_model, after_response, *_tool
    assert per_step.get("dispatch.py:_direct", 0) == 0  # dispatched in _call's own frame


def test_the_per_step_metrics_build_no_label_key(per_step: dict[str, float]) -> None:
    assert per_step.get("_metrics.py:_key", 0) == 0
    assert per_step.get("_metrics.py:inc", 0) == 0
    assert per_step["_metrics.py:add"] == 2  # one per signal: model_responded, tool_finished


def test_the_metrics_counted_every_step() -> None:
    dep = shipped_deployment()
    try:
        play(dep, 7)
        metrics: Any = dep.plugins.get("metrics")
        assert metrics.value("model_calls_total") == 8
        assert metrics.value("tool_calls_total", tool="lookup", outcome="ok") == 7
        prompt = metrics.value("tokens_total", kind="prompt")
        assert prompt > 0 and isinstance(prompt, float)
        assert metrics.value("tokens_total", kind="completion") == 7 * 16 + 8
    finally:
        dep.close()


def test_time_monotonic_is_what_the_clock_reads() -> None:
    before = time.monotonic()
    assert before <= SystemClock().now() <= time.monotonic()


def test_quiet_budget_checks_build_no_verdict_material(per_step: dict[str, float]) -> None:
    # token_budget: no evidence, no checks sorted by severity when both rungs are None; the
    # spend it reads is computed with the state it already holds
    assert per_step.get("token_budget.py:<lambda>", 0) == 0
    assert per_step.get("token_budget.py:spent", 0) == 0
    # conversation_limits: the warning's threshold is checked inline; the totals are read
    # once per hook
    assert per_step.get("conversation_limits.py:_maybe_warn", 0) == 0
    assert per_step.get("conversation_limits.py:_totals", 0) == 0
    # cost_budget reads the run's spend in place
    assert per_step.get("cost_budget.py:run_cost", 0) == 0


def test_timeout_reads_the_clock_once_before_the_model(per_step: dict[str, float]) -> None:
    # before_model: one read for the time spent and the moment the model was asked
    assert per_step.get("run.py:elapsed", 0) == 2  # before_tool, after_tool
    assert per_step.get("timeout.py:<listcomp>", 0) == 0  # the tool's bound: no list


def test_a_routed_signal_skips_blinkers_receiver_lookup(per_step: dict[str, float]) -> None:
    # model_responded and tool_finished reach the deployments' router once each
    assert per_step["deployment.py:__call__"] == 2
    # while the dispatcher is a signal's only receiver, send() calls it directly; with
    # another receiver beside it, blinker finds them both (a signal of its own here: the
    # process's signals may have receivers that other tests left connected)
    from blinker import Namespace

    sig = Namespace().signal("routed")
    got: list[Any] = []

    class Dispatcher:
        def __call__(self, sender: Any, **kw: Any) -> None:
            got.append(("dispatcher", sender, kw))

    def beside(sender: Any, **kw: Any) -> None:
        got.append(("beside", sender, kw))

    dispatcher = Dispatcher()
    sig.connect(dispatcher, weak=False)
    signals.set_dispatcher(sig, dispatcher)
    _, counts = count_calls(lambda: signals.send(sig, "run", step=1))
    assert counts.get("base.py:receivers_for", 0) == 0
    assert got == [("dispatcher", "run", {"step": 1})]
    with sig.connected_to(beside):
        _, counts = count_calls(lambda: signals.send(sig, "run", step=2))
    assert counts["base.py:receivers_for"] > 0  # a generator: counted per receiver
    assert sorted(g[0] for g in got[1:]) == ["beside", "dispatcher"]


def test_a_silent_logger_is_asked_once_per_event(per_step: dict[str, float]) -> None:
    assert per_step.get("logging.py:wants", 0) == 0
    assert per_step["__init__.py:isEnabledFor"] == 2


def test_ascii_text_is_not_passed_through_clean_text(per_step: dict[str, float]) -> None:
    # clean_text leaves ASCII text unchanged: the loop asks str.isascii() inline first
    assert per_step.get("sanitize.py:clean_text", 0) == 0
    # the response check is written out, without all() over generators
    assert per_step.get("calls.py:<genexpr>", 0) == 0


def test_text_with_lone_surrogates_is_still_cleaned() -> None:
    from loopwarden.engine.calls import clean_response, parse_calls, well_formed
    from loopwarden.events import ModelResponse, ProposedCall, Usage
    from loopwarden.testing import make_run

    bad = ModelResponse(
        content="a \ud800",
        tool_calls=[ProposedCall("look\udfff", '{"q": "x\ud83d"}', "id\ud800")],
        usage=Usage(3, 4),
    )
    assert well_formed(bad)
    clean_response(bad)
    assert bad.content == "a \ufffd"
    pc = bad.tool_calls[0]
    assert (pc.name, pc.id, pc.arguments) == ("look\ufffd", "id\ufffd", '{"q": "x\ufffd"}')
    # arguments that did not pass through clean_response are cleaned when parsed
    raw = ModelResponse(content=None, tool_calls=[ProposedCall("q", '{"a": "\udc00"}', "c")])
    (call,) = parse_calls(make_run(), raw)
    assert call.raw_arguments == '{"a": "\ufffd"}'
    # ASCII text is left as the very same object
    text = "plain"
    ok = ModelResponse(content=text, tool_calls=[])
    clean_response(ok)
    assert ok.content is text


@pytest.mark.parametrize(
    "usage",
    [Any, "u", (1, 2)],
    ids=["type", "str", "tuple"],
)
def test_a_malformed_usage_is_still_refused(usage: Any) -> None:
    from loopwarden.engine.calls import well_formed
    from loopwarden.events import ModelResponse, ProposedCall, Usage

    assert not well_formed(ModelResponse(content="x", usage=usage))
    for fields in ((-1, 0, 0), (0, -1, 0), (0, 0, -1), (1.0, 0, 0), (0, True, 0)):
        assert not well_formed(ModelResponse(content="x", usage=Usage(*fields)))
    assert well_formed(ModelResponse(content="x", usage=Usage(1, 2, 0)))
    assert not well_formed(ModelResponse(content=3, tool_calls=[]))  # type: ignore[arg-type]
    assert not well_formed(ModelResponse(content="x", tool_calls=({},)))  # type: ignore[arg-type]
    assert not well_formed(
        ModelResponse(content="x", tool_calls=[ProposedCall("n", "{}", 7)])  # type: ignore[arg-type]
    )


def test_oscillation_renders_a_label_only_for_a_verdict(per_step: dict[str, float]) -> None:
    # a call's label (its arguments as JSON) is rendered from the remembered call when a
    # cycle is reported -- most symbols never are (test_oscillation checks the text)
    assert per_step.get("oscillation.py:_label", 0) == 0


def test_retry_policy_builds_a_retry_plan_once_per_failure_count() -> None:
    from loopwarden.plugins.retry_policy import RetryPolicy, RetryPolicySettings
    from loopwarden.testing import make_run, make_tool, make_tool_call

    plugin = RetryPolicy(RetryPolicySettings(runtime=True, max_retries=2))
    run = make_run("u", tools=[make_tool("lookup", lambda q: q, read_only=True)])
    first = make_tool_call("lookup", {"q": "a"}, run=run)
    second = make_tool_call("lookup", {"q": "b"}, run=run)
    plugin.before_tool(run=run, call=first)
    plugin.before_tool(run=run, call=second)
    assert first.retry is not None and first.retry is second.retry  # frozen: shared
    assert first.retry.attempts == 3 and first.retry.backoff_s == plugin.backoff(1)


def test_the_model_turn_checks_exact_types_without_isinstance(
    per_step: dict[str, float],
) -> None:
    # type(x) is T first: a str, a dict, a list, a Usage, a ProposedCall need no call
    isinstance_ = "~:<built-in method builtins.isinstance> <- "
    for caller in (
        "calls.py:well_formed",
        "calls.py:parse_proposals",
        "tokens.py:estimate_message",
        "fingerprint.py:_canon",  # the arguments: a JSON object of strings
    ):
        assert per_step.get(isinstance_ + caller, 0) == 0, caller


def test_arguments_of_every_shape_are_still_parsed_as_before() -> None:
    from loopwarden.engine.calls import parse_calls
    from loopwarden.events import ModelResponse, ProposedCall
    from loopwarden.testing import make_run, make_tool

    run = make_run("u", tools=[make_tool("q", lambda a=None: a)])

    def parsed(arguments: Any) -> tuple[Any, Any, Any]:
        pc = ProposedCall("q", arguments, "c1")
        (call,) = parse_calls(run, ModelResponse(content=None, tool_calls=[pc]))
        return call.arguments, call.raw_arguments, call.error

    class Text(str):
        pass

    assert parsed('{"a": 1}') == ({"a": 1}, '{"a": 1}', None)
    assert parsed(Text('{"a": 2}')) == ({"a": 2}, '{"a": 2}', None)
    assert parsed({"a": 3}) == ({"a": 3}, '{"a": 3}', None)  # an adapter's parsed arguments
    assert parsed(None) == ({}, "", None)
    assert parsed("") == ({}, "", None)
    assert parsed("[1]")[2] == "malformed_arguments"
    assert parsed(7)[1:] == ("7", "malformed_arguments")


def test_fingerprints_of_subclassed_values_are_unchanged() -> None:
    from collections import OrderedDict

    from loopwarden.fingerprint import Fingerprinter

    class Text(str):
        pass

    fp = Fingerprinter()
    plain = fp("t", {"q": " Hello  World ", "n": 2.0, "l": ["A", {"b": "C"}]})
    sub = fp("t", OrderedDict(q=Text(" Hello  World "), n=2.0, l=("A", OrderedDict(b=Text("C")))))
    assert plain == sub


def test_taking_back_a_cancel_callback_costs_no_lambda_frame() -> None:
    # await_within registers and takes back a callback per model and tool call of an
    # async run
    from loopwarden.clock import CancelToken

    token = CancelToken()
    fired: list[str] = []
    remove = token.on_cancel(lambda: fired.append("removed"))
    token.on_cancel(lambda: fired.append("kept"))
    _, counts = count_calls(remove)
    assert counts["clock.py:_remove"] == 1
    assert not any("<lambda>" in k for k in counts)
    token.cancel()
    assert fired == ["kept"]
    assert token.on_cancel(lambda: fired.append("late")) is not None and fired[-1] == "late"


def test_a_blocking_tool_is_waited_for_without_a_threading_event() -> None:
    # the plain blocking tool runs in a worker under its deadline; the waiter blocks on a
    # bare lock that the result (or the cancel token) releases
    dep = shipped_deployment(cooperative=False)
    try:
        per_step = calls_per_step(dep)
    finally:
        dep.close()
    assert per_step.get("threading.py:wait", 0) == 0
    assert per_step.get("threading.py:__init__", 0) == 0
    assert per_step["execution.py:submit"] == 1  # still handed to a worker


def test_a_blocking_tool_cancelled_mid_call_is_abandoned_at_once() -> None:
    import threading

    from loopwarden.clock import CancelToken

    release = threading.Event()
    token = CancelToken()
    seen: list[str] = []

    def lookup(key: str) -> str:
        token.cancel("user left")  # the run is cancelled while the tool blocks
        release.wait(60)  # the waiter must not wait for this
        seen.append(key)
        return "late"

    dep = shipped_deployment(lookup=lookup)
    try:
        w = bench_common()
        run = dep.run(w.USER, model=w.WorkloadModel(3), cancel=token)
        assert run.outcome is not None and run.outcome.termination == "cancelled"
        assert seen == []  # it returned while the tool still blocked
        tool_messages = [m["content"] for m in run.messages if m["role"] == "tool"]
        assert tool_messages and "late" not in tool_messages[0]
    finally:
        release.set()
        dep.close()


def test_arguments_are_parsed_by_the_json_scanner_directly(per_step: dict[str, float]) -> None:
    # sanitize.json_loads: json.loads's scanner and errors, without loads/decode/raw_decode
    # frames (test_hot_path compares it with json.loads on arbitrary text)
    assert per_step.get("decoder.py:decode", 0) == 0
    assert per_step.get("decoder.py:raw_decode", 0) == 0
