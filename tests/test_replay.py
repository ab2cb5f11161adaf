"""Replay of recorded runs: step numbering, warnings and stops, tokens after the stop, bad lines.

The trajectories are written here, small and known; the shared file of real runs is never
needed.  Most tests use a probe plugin with exact rules, so they check the replay's own
bookkeeping rather than the tuning of the shipped detectors; one end-to-end test uses the
shipped config on an obvious loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Deployment, ModelRequest, Plugin, Run, ToolCall, Verdict, hookimpl
from loopwarden.commands.cli import main
from loopwarden.config import Config, parse_config
from loopwarden.traffic.replay import (
    infer_flags,
    load_tool_flags,
    recorded_tool,
    replay_config,
    replay_file,
    replay_trajectory,
    summarize,
)

# -- trajectories --------------------------------------------------------------------------


def step(
    content: str | None = None,
    calls: Sequence[tuple[str, dict[str, Any]]] = (),
    observations: Sequence[str] = (),
    usage: tuple[int, int] | None = (100, 10),
    user_reply: str | None = None,
    errors: list[bool | None] | None = None,
) -> dict[str, Any]:
    s: dict[str, Any] = {
        "content": content,
        "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
        "observations": list(observations),
        "user_reply": user_reply,
        "usage": None
        if usage is None
        else {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
    }
    if errors is not None:
        s["observation_is_error"] = errors
    return s


def lookup(key: str, obs: str | None = None, **kw: Any) -> dict[str, Any]:
    return step(None, [("get_record", {"key": key})], [obs or f"record {key}: ok"], **kw)


def traj(
    tid: str,
    steps: list[dict[str, Any]],
    *,
    success: bool | None = True,
    answer: bool = True,
    termination: str | None = None,
) -> dict[str, Any]:
    t: dict[str, Any] = {
        "source": "test",
        "id": tid,
        "success": success,
        "steps": steps,
        "final_answer_present": answer,
    }
    if termination is not None:
        t["meta"] = {"termination_reason": termination}
    return t


def write_jsonl(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


# -- a probe plugin with exact rules -------------------------------------------------------


class Probe(Plugin):
    """Warns before a call to ``warn_me``, stops (soft) before a call to ``stop_me``, stops
    (hard) after a call to ``hand_off``, and stops before model call number
    ``stop_before_call`` when set."""

    name = "probe"

    def __init__(self, stop_before_call: int | None = None) -> None:
        super().__init__()
        self.stop_before_call = stop_before_call

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        if (
            self.stop_before_call is not None
            and request.step == self.stop_before_call
            and not request.final
        ):
            return self.stop("probe_cap", soft=True)
        return None

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        if call.name == "hand_off":
            return self.stop("probe_hand_off")
        return None

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        if call.name == "warn_me":
            return self.warn("careful")
        if call.name == "stop_me":
            return self.stop("probe_stop", soft=True)
        return None


def cfg(**plugins: Any) -> Config:
    return parse_config(
        {"plugins": {"max_steps": {"max_steps": 50, "warn_remaining": 0}, **plugins}}, path="<test>"
    )


@pytest.fixture
def probe_deployment() -> Iterator[Callable[..., Deployment]]:
    made: list[Deployment] = []

    def make(**kw: Any) -> Deployment:
        dep = Deployment(cfg(), plugins={"probe": Probe(**kw)})
        made.append(dep)
        return dep

    yield make
    for d in made:
        d.close()


# -- tests ---------------------------------------------------------------------------------


def test_a_multi_run_conversation_replays_run_by_run_without_a_stop(
    probe_deployment: Callable[..., Deployment],
) -> None:
    t = traj(
        "conv",
        [
            step("Which order?", user_reply="Order 7, please."),  # run 1: a text turn
            lookup("7"),  # run 2 ...
            step("Order 7 is fine.", user_reply="And order 8?"),
            lookup("8"),  # run 3 ...
            step("Order 8 is fine too."),
        ],
    )
    r = replay_trajectory(probe_deployment(), t)
    assert r.runs == 3 and r.steps == 5
    assert r.stop is None and r.first_warning is None
    assert r.calls_cut == 0 and r.tool_calls == 2
    assert r.recorded_tokens == 5 * 110
    # the user's replies became the next runs' user messages, and the history carried on
    assert [rec["steps"] for rec in r.records] == [1, 2, 2]
    assert all(rec["termination"] == "final_answer" for rec in r.records)


def test_steps_are_numbered_from_one_across_runs(
    probe_deployment: Callable[..., Deployment],
) -> None:
    t = traj(
        "numbering",
        [
            step("Hello, what do you need?", user_reply="Check things."),  # 1 (run 1)
            lookup("a"),  # 2 (run 2)
            step(None, [("warn_me", {})], ["fine"]),  # 3  <- warning
            lookup("b"),  # 4
            step(None, [("stop_me", {})], ["never seen"]),  # 5  <- stop
            lookup("c"),  # 6
            step("Done."),  # 7
        ],
    )
    r = replay_trajectory(probe_deployment(), t)
    assert r.first_warning == {"step": 3, "plugin": "probe"}
    assert r.stop is not None
    assert (r.stop["step"], r.stop["reason"], r.stop["plugin"]) == (5, "probe_stop", "probe")
    assert r.stop["soft"] is True and r.stop["hook"] == "before_tool"
    # steps 6 and 7 would not have happened: their recorded tokens are saved
    assert r.steps_after_stop == 2
    assert r.tokens_after_stop == 2 * 110
    # the stop cut the stop_me call itself and the lookup of step 6
    assert r.calls_cut == 2


def test_a_before_model_stop_names_the_call_it_replaced(
    probe_deployment: Callable[..., Deployment],
) -> None:
    t = traj(
        "loop",
        [lookup(str(i), usage=(100 * i, 10)) for i in range(1, 9)],
        success=False,
        answer=False,
        termination="max_steps",
    )
    r = replay_trajectory(probe_deployment(stop_before_call=4), t)
    assert r.stop is not None
    assert (r.stop["step"], r.stop["hook"]) == (4, "before_model")
    # steps 5..8 are saved; step 4 became the wrap-up turn
    assert r.tokens_after_stop == sum(100 * i + 10 for i in range(5, 9))
    assert r.steps_after_stop == 4
    assert r.calls_cut == 5  # the calls of steps 4..8 never ran


def test_without_recorded_usage_there_are_no_token_figures(
    probe_deployment: Callable[..., Deployment],
) -> None:
    t = traj(
        "nousage",
        [
            lookup("1", usage=None),
            step(None, [("stop_me", {})], ["x"], usage=None),
            lookup("2", usage=None),
        ],
    )
    r = replay_trajectory(probe_deployment(), t)
    assert r.stop is not None and r.stop["step"] == 2
    assert r.recorded_tokens is None and r.tokens_after_stop is None


def test_a_stop_that_cuts_nothing_is_not_an_early_stop(
    probe_deployment: Callable[..., Deployment],
) -> None:
    """A guard stopping after the last tool call of a successful run (e.g. at a hand-off)
    ended it where it ended anyway; a stop before recorded calls cut them off."""
    at_end = traj("end", [lookup("1"), step(None, [("hand_off", {})], ["done"]), step("Bye.")])
    early = traj("early", [step(None, [("hand_off", {})], ["done"]), lookup("1"), step("Bye.")])
    dep = probe_deployment()
    results = [replay_trajectory(dep, at_end), replay_trajectory(dep, early)]
    assert [r.stop["step"] if r.stop else None for r in results] == [2, 1]
    assert [r.calls_cut for r in results] == [0, 1]
    s = summarize(results)
    assert s["successful"] == 2
    assert s["successful_stopped_early"] == 1
    assert s["successful_stopped_at_end"] == 1
    assert s["early_stops_of_successful_by_reason"] == {"probe_hand_off": 1}


def test_summary_counts_step_cap_and_answerless_runs(
    probe_deployment: Callable[..., Deployment],
) -> None:
    dep = probe_deployment(stop_before_call=3)
    capped = traj(
        "capped",
        [lookup(str(i)) for i in range(6)],
        success=False,
        answer=False,
        termination="max_steps",
    )
    short_fail = traj(
        "short",
        [lookup("1"), step("I give up.")],
        success=False,
        answer=False,
        termination="agent_error",
    )
    ok = traj("ok", [lookup("1"), step("Fine.")])
    s = summarize([replay_trajectory(dep, t) for t in (capped, short_fail, ok)])
    assert s["step_cap_runs"] == 1 and s["step_cap_runs_stopped"] == 1
    assert s["step_cap_runs_stopped_pct"] == 100.0
    assert s["runs_without_answer"] == 2 and s["runs_without_answer_stopped"] == 1
    assert s["successful_stopped_early"] == 0
    # the stop replaced step 3 with the wrap-up turn: steps 4..6 are saved
    assert s["steps_saved"] == 3
    assert s["recorded_tokens_saved"] == 3 * 110
    assert s["stops_by_reason"] == {"probe_cap": 1}


def test_corrupt_lines_are_counted_and_skipped(
    tmp_path: Path,
    probe_deployment: Callable[..., Deployment],
) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            traj("a", [lookup("1"), step("ok")]),
            '{"id": "truncated", "steps": [',
            '"not an object"',
            '{"id": "no steps"}',
            "",
            traj("b", [lookup("2"), step("ok")]),
        ],
    )
    results, bad = replay_file(probe_deployment(), path)
    assert [r.id for r in results] == ["a", "b"]
    assert bad == 3


def test_the_shipped_guards_stop_an_obvious_loop_and_spare_a_healthy_run(
    deployment_factory: Callable[..., Deployment],
    shipped_config: Config,
) -> None:
    same = "record 42: status pending"
    loop = traj(
        "loop",
        [lookup("42", same) for _ in range(30)],
        success=False,
        answer=False,
        termination="max_steps",
    )
    healthy = traj("healthy", [lookup("1"), lookup("2"), lookup("3"), step("All fine.")])
    dep = deployment_factory(replay_config(shipped_config))
    r_loop, r_ok = replay_trajectory(dep, loop), replay_trajectory(dep, healthy)
    assert r_loop.stop is not None and r_loop.stop["step"] <= 10
    assert r_loop.first_warning is not None
    assert r_loop.first_warning["step"] <= r_loop.stop["step"]
    assert r_loop.tokens_after_stop == (30 - r_loop.stop["step"]) * 110
    assert r_ok.stop is None


def test_tool_natures_are_inferred_from_names() -> None:
    assert infer_flags("get_order_details") == {
        "read_only": True,
        "deterministic": True,
        "side_effect": False,
        "terminal": False,
    }
    assert infer_flags("check_network_status")["deterministic"] is False
    assert infer_flags("check_network_status")["read_only"] is True
    assert infer_flags("get_flight_status")["deterministic"] is False
    assert infer_flags("get_data_usage")["deterministic"] is False
    assert infer_flags("toggle_airplane_mode")["side_effect"] is False
    assert infer_flags("book_reservation")["side_effect"] is True
    assert infer_flags("transfer_to_human_agents")["terminal"] is True
    assert infer_flags("think") == infer_flags("calculate")


def test_declared_natures_override_the_inference(tmp_path: Path) -> None:
    path = tmp_path / "tools.toml"
    path.write_text(
        "[tools.get_status]\ndeterministic = true\n[tools.send_note]\n"
        "side_effect = false\nread_only = true\n",
        encoding="utf-8",
    )
    flags = load_tool_flags(path)
    t = recorded_tool("get_status", flags["get_status"])
    # only what is declared is asserted; the name still hints a lookup to the detectors
    assert t.deterministic and not t.read_only and t.declared and t.likely_read_only
    guessed = recorded_tool("get_status")
    assert not (guessed.read_only or guessed.deterministic or guessed.side_effect)
    assert not guessed.declared and guessed.likely_read_only
    assert not recorded_tool("book_reservation").likely_read_only
    assert not recorded_tool("transfer_to_human_agents").terminal  # a guess never ends a run
    n = recorded_tool("send_note", flags["send_note"])
    assert n.read_only and not n.side_effect
    path.write_text("[tools.x]\nfast = true\n", encoding="utf-8")
    from loopwarden.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"tools\.x\.fast"):
        load_tool_flags(path)


def test_replay_counts_an_unpriced_recorded_model_as_free() -> None:
    c = parse_config(
        {
            "plugins": {
                "enabled": ["max_steps", "cost_budget"],
                "cost_budget": {"unknown_model": "error"},
            }
        },
        path="<t>",
    )
    assert replay_config(c).plugins.tables()["cost_budget"]["unknown_model"] == "free"
    plain = parse_config({}, path="<t>")
    assert replay_config(plain) is plain


def test_replay_leaves_observers_out_unless_asked(shipped_config: Config) -> None:
    names = {"logging", "metrics", "alerting"} & set(shipped_config.plugins.enabled)
    assert names
    assert names <= set(replay_config(shipped_config).plugins.blocked)
    assert not names & set(replay_config(shipped_config, observers=True).plugins.blocked)


def test_the_recorded_model_names_the_runs(probe_deployment: Callable[..., Deployment]) -> None:
    t = traj("m", [lookup("1"), step("ok")])
    t["meta"] = {"model": "gpt-4o"}
    r = replay_trajectory(probe_deployment(), t)
    assert r.model == "gpt-4o" and r.records[0]["model"] == "gpt-4o"


def test_cli_replay_json_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            traj("a", [lookup("1"), step("ok")]),
            "{corrupt",
            traj(
                "b",
                [lookup("x", "same") for _ in range(20)],
                success=False,
                answer=False,
                termination="max_steps",
            ),
        ],
    )
    conf = tmp_path / "c.toml"
    conf.write_text("[plugins.max_steps]\nmax_steps = 5\nwarn_remaining = 0\n", encoding="utf-8")
    code = main(["replay", str(path), "--json", "--config", str(conf)])
    out, err = capsys.readouterr()
    assert code == 0
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["id"] for x in lines[:-1]] == ["a", "b"]
    assert lines[1]["stop"]["reason"] == "max_steps" and lines[1]["stop"]["step"] == 5
    summary = lines[-1]["summary"]
    assert summary["unreadable_lines"] == 1 and summary["step_cap_runs_stopped"] == 1
    assert "skipped 1 unreadable line" in err
    code = main(["replay", str(path), "--summary", "--config", str(conf)])
    out, _ = capsys.readouterr()
    assert code == 0 and "step cap reached             1/1 (100.0%)" in out
    assert "unreadable lines 1" in out and "steps  " not in out


def test_cli_replay_missing_file_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_carried_state_sees_a_loop_that_spans_the_runs_of_a_conversation(
    deployment_factory: Callable[..., Deployment],
) -> None:
    """The same failing write in every run of a conversation: repeat_call remembers calls that
    failed for good for the whole conversation (failures_across_turns), so it is caught; with
    that memory per run only, it is not -- unless the experiment carries per-run state too."""
    fail = step(
        None,
        [("update_booking", {"id": "B1", "seats": 2})],
        ["Error: seats mismatch"],
        errors=[True],
    )
    steps: list[dict[str, Any]] = []
    for i in range(5):
        steps += [
            fail,
            step(
                f"Sorry, that failed ({i}). Shall I try again?", user_reply="Yes, please try again."
            ),
        ]
    t = traj("conv-loop", steps, success=False, answer=True, termination="max_steps")
    config = parse_config({"plugins": {"enabled": ["max_steps", "repeat_call"]}}, path="<t>")
    caught = replay_trajectory(deployment_factory(config), t)
    assert caught.stop is not None and caught.stop["reason"] == "repeat_call"
    per_run = parse_config(
        {
            "plugins": {
                "enabled": ["max_steps", "repeat_call"],
                "repeat_call": {"failures_across_turns": False},
            }
        },
        path="<t>",
    )
    dep = deployment_factory(per_run)
    assert replay_trajectory(dep, t).stop is None
    r = replay_trajectory(dep, t, carry=["repeat_call"])
    assert r.stop is not None and r.stop["reason"] == "repeat_call"
    assert r.runs >= 2 and r.stop["step"] > 2


def test_lines_of_the_wrong_shape_are_unreadable_not_fatal(tmp_path: Path) -> None:
    from loopwarden.traffic.replay import iter_trajectories

    good = {"id": "ok", "steps": [{"content": "hi", "tool_calls": [], "observations": []}]}
    bad_shapes = [
        {
            "id": "b1",
            "steps": [
                {
                    "content": None,
                    "tool_calls": [],
                    "observations": [],
                    "observation_is_error": True,
                }
            ],
        },
        {"id": "b2", "steps": [{"content": None, "tool_calls": [], "observations": "abc"}]},
        {"id": "b3", "steps": [{"tool_calls": ["not an object"]}]},
        {"id": "b4", "steps": [{"usage": 12}]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in [good, *bad_shapes]) + "\n", encoding="utf-8")
    got = [t for _, t in iter_trajectories(path)]
    assert [t["id"] if t else None for t in got] == ["ok", None, None, None, None]


# -- realistic replay: recorded request sizes, stop kinds, warnings, runaways ---------------


class Sizes(Plugin):
    """Records the request size every ``before_model`` sees (final turns included)."""

    name = "sizes"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, bool]] = []

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        self.seen.append((request.estimated_tokens, request.final))
        return None


def test_requests_are_sized_by_the_recorded_prompt_tokens() -> None:
    sizes = Sizes()
    with Deployment(cfg(), plugins={"sizes": sizes}) as dep:
        t = traj(
            "sized",
            [
                lookup("1", usage=(5200, 10)),
                lookup("2", usage=(5600, 10)),
                lookup("3", usage=None),
                step("Done.", usage=(6100, 20)),
            ],
        )
        replay_trajectory(dep, t)
    got = [n for n, _ in sizes.seen]
    assert got[0] == 5200 and got[1] == 5600 and got[3] == 6100
    # an unrecorded request: the estimate plus the gap measured at the last recorded one,
    # so it follows the real size (between its neighbours), not the small estimate
    assert 5600 < got[2] < 6100


def test_system_prompt_tokens_stand_in_for_what_the_recording_leaves_out() -> None:
    def first_sizes(n: int | None) -> list[int]:
        sizes = Sizes()
        with Deployment(cfg(), plugins={"sizes": sizes}) as dep:
            t = traj(
                "plain",
                [lookup("1", usage=None), lookup("2", usage=None), step("Done.", usage=None)],
            )
            replay_trajectory(dep, t, system_prompt_tokens=n)
        return [s for s, _ in sizes.seen]

    plain, with_prompt = first_sizes(None), first_sizes(5000)
    assert len(plain) == len(with_prompt) == 3
    gaps = {b - a for a, b in zip(plain, with_prompt, strict=True)}
    assert len(gaps) == 1  # one constant gap on every request
    gap = gaps.pop()
    # the configured system prompt (estimated) is replaced by the 5000 tokens
    assert 4800 < gap < 5000
    # recorded usage wins over the stand-in
    sizes = Sizes()
    with Deployment(cfg(), plugins={"sizes": sizes}) as dep:
        replay_trajectory(
            dep, traj("rec", [lookup("1", usage=(3000, 5)), step("ok")]), system_prompt_tokens=5000
        )
    assert sizes.seen[0][0] == 3000


def test_unrecorded_steps_are_billed_at_the_estimates(
    deployment_factory: Callable[..., Deployment],
) -> None:
    """Without recorded usage the run's token budget still counts what the calls cost."""
    config = parse_config(
        {
            "plugins": {
                "enabled": ["max_steps", "token_budget"],
                "max_steps": {"max_steps": 50, "warn_remaining": 0},
                "token_budget": {
                    "max_context": 100000,
                    "max_total_tokens": 20000,
                    "warn_at": None,
                    "reserve_output_tokens": 100,
                },
            }
        },
        path="<t>",
    )
    dep = deployment_factory(config)
    t = traj("billed", [lookup(str(i), usage=None) for i in range(10)] + [step("ok", usage=None)])
    assert replay_trajectory(dep, t).stop is None  # small estimated requests fit
    r = replay_trajectory(dep, t, system_prompt_tokens=5000)
    assert r.stop is not None and r.stop["reason"] == "max_tokens"
    assert 3 <= r.stop["step"] <= 4  # about 5,000 tokens a call against 20,000


def test_stops_are_classified_by_what_they_cut_from_their_own_run(
    deployment_factory: Callable[..., Deployment],
) -> None:
    # run 1 = three steps, run 2 = two; a stop before call 3 of a run replaces run 1's
    # closing text only: the user got an answer, so the conversation goes on with run 2
    conv = traj(
        "closing",
        [lookup("1"), lookup("2"), step("Fine.", user_reply="More?"), lookup("3"), step("Done.")],
    )
    work = traj("work", [lookup("1"), lookup("2"), lookup("3"), step("Done.")])
    # the same closing-text stop, then a run whose third call is cut: work was left
    later = traj(
        "later",
        [
            lookup("1"),
            lookup("2"),
            step("Fine.", user_reply="More?"),
            lookup("3"),
            lookup("4"),
            lookup("5"),
            step("Done."),
        ],
    )
    with Deployment(cfg(), plugins={"probe": Probe(stop_before_call=3)}) as dep:
        closing, cut, late = (replay_trajectory(dep, t) for t in (conv, work, later))
    assert (closing.stop_kind, closing.calls_cut_in_run, closing.calls_cut) == (
        "closing_text",
        0,
        0,
    )
    assert closing.runs == 2 and closing.closing_stops == 1
    assert closing.stop is not None and closing.stop["step"] == 3
    assert not closing.ended_early and closing.steps_after_stop == 0
    assert (cut.stop_kind, cut.calls_cut_in_run, cut.closing_stops) == ("work_left", 1, 0)
    assert cut.ended_early
    assert (late.stop_kind, late.calls_cut_in_run, late.closing_stops) == ("work_left", 1, 1)
    assert late.stop is not None and late.stop["step"] == 6
    config = parse_config(
        {
            "plugins": {
                "enabled": ["max_steps", "terminal_tool"],
                "max_steps": {"max_steps": 50, "warn_remaining": 0},
            },
            "tools": {"transfer_to_human_agents": {"terminal": True}},
        },
        path="<t>",
    )
    hand = traj(
        "hand",
        [
            step(None, [("transfer_to_human_agents", {"summary": "x"})], ["Transfer successful"]),
            lookup("late"),
            step("Bye."),
        ],
    )
    handed = replay_trajectory(deployment_factory(config), hand)
    assert handed.stop is not None and handed.stop["reason"] == "terminal_tool"
    assert handed.stop_kind == "hand_off" and handed.calls_cut_in_run == 1
    s = summarize([closing, cut, late, handed])
    assert s["successful"] == 4
    assert s["successful_stopped_with_work_left"] == 2
    assert s["successful_stopped_with_work_left_by_reason"] == {"probe_cap": 2}
    assert s["successful_stopped_closing_text_only"] == 1
    assert s["successful_stopped_at_hand_off"] == 1
    # the earlier figure counted a hand-off that cut a call as an early stop too
    assert s["successful_stopped_early"] == 3


class TurnCap(Plugin):
    """Stops every run after the second of a conversation, as a conversation-scope limit."""

    name = "turn_cap"

    @hookimpl
    def before_model(self, run: Run, request: ModelRequest) -> Verdict | None:
        if run.conversation.runs >= 2 and not request.final:
            return self.stop("max_turns", soft=False, scope="conversation")
        return None


def test_a_conversation_scope_stop_ends_the_conversation(
    deployment_factory: Callable[..., Deployment],
) -> None:
    """A per-run stop of a closing text lets the conversation go on; a stop of the
    conversation itself ends it, even in a turn without tool calls."""
    chat = traj(
        "chat",
        [step(f"Reply {i}.", user_reply="And?") for i in range(5)] + [step("Bye.")],
        success=False,
        termination="max_steps",
    )
    dep = deployment_factory(cfg(), plugins={"turn_cap": TurnCap()})
    r = replay_trajectory(dep, chat)
    assert r.stop is not None and r.stop["reason"] == "max_turns" and r.stop["step"] == 3
    assert r.runs == 3 and r.closing_stops == 0
    assert (r.stop_kind, r.steps_after_stop) == ("closing_text", 3)
    assert r.ended_early
    assert summarize([r])["runaway_runs_stopped"] == 1


def test_warned_runs_are_counted_by_plugin(
    probe_deployment: Callable[..., Deployment],
) -> None:
    dep = probe_deployment()
    warned = traj("w1", [step(None, [("warn_me", {})], ["x"]), step("ok")])
    warned_later = traj(
        "w2", [step("Hi", user_reply="go"), step(None, [("warn_me", {})], ["x"]), step("ok")]
    )
    quiet = traj("q", [lookup("1"), step("ok")])
    failed = traj("f", [step(None, [("warn_me", {})], ["x"]), step("ok")], success=False)
    results = [replay_trajectory(dep, t) for t in (warned, warned_later, quiet, failed)]
    assert [r.warned_by for r in results] == [["probe"], ["probe"], [], ["probe"]]
    s = summarize(results)
    assert s["successful"] == 3 and s["successful_warned"] == 2
    assert s["successful_warned_pct"] == 66.7
    assert s["successful_warned_by_plugin"] == {"probe": 2}


def test_repeat_streak_counts_one_call_in_a_row() -> None:
    from loopwarden.traffic.replay import repeat_streak

    same = ("get_record", {"key": "7"})
    # text turns between the calls do not break a streak; a different call does
    steps = [
        step(None, [same]),
        step("Still checking.", user_reply="ok"),
        step(None, [same, same]),
        step(None, [same]),
    ]
    assert repeat_streak(steps) == 4
    assert (
        repeat_streak([*steps, step(None, [("get_record", {"key": "8"})]), step(None, [same])]) == 4
    )
    # argument order and JSON-text arguments do not matter
    a = {"name": "f", "arguments": {"x": 1, "y": 2}}
    b = {"name": "f", "arguments": '{"y": 2, "x": 1}'}
    assert repeat_streak([{"tool_calls": [a, b]}]) == 2


def test_runaways_are_step_cap_runs_and_runs_repeating_one_call(
    probe_deployment: Callable[..., Deployment],
) -> None:
    dep = probe_deployment(stop_before_call=4)
    capped = traj(
        "capped",
        [lookup(str(i)) for i in range(6)],
        success=False,
        answer=False,
        termination="max_steps",
    )
    errors = traj(
        "errors",
        [lookup(str(i)) for i in range(2)] + [step("x")],
        success=False,
        termination="too_many_errors",
    )  # stopped by nothing: too short
    # the same lookup once per user turn, five turns: only conversation scope sees it
    repeated = traj(
        "repeated",
        [
            s
            for i in range(5)
            for s in (lookup("7"), step(f"Still pending ({i}).", user_reply="Check again?"))
        ],
        success=False,
        termination="user_stop",
    )
    looping = traj(
        "looping",
        [lookup("7") for _ in range(6)] + [step("ok")],
        success=False,
        termination="user_stop",
    )
    healthy = traj("healthy", [lookup("1"), lookup("2"), step("ok")])
    s = summarize([replay_trajectory(dep, t) for t in (capped, errors, repeated, looping, healthy)])
    assert s["runaway_runs"] == 4
    assert (s["step_cap_runs"], s["step_cap_runs_stopped"]) == (2, 1)
    assert (s["repeat_runs"], s["repeat_runs_stopped"]) == (2, 1)
    # "repeated" asks the user between its lookups: not one run repeating itself
    assert (s["identical_repeat_runs"], s["identical_repeat_runs_stopped"]) == (1, 1)
    assert s["runaway_runs_stopped"] == 2 and s["runaway_runs_stopped_pct"] == 50.0
    assert s["runaway_runs_missed"] == ["errors", "repeated"]
    assert s["runaway_stops_by_reason"] == {"probe_cap": 2}
    assert s["runaway_runs_successful"] == 0


def test_cli_replay_summary_json_and_system_prompt_tokens(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            traj("a", [lookup("1", usage=None), lookup("2", usage=None), step("ok", usage=None)]),
        ],
    )
    conf = tmp_path / "c.toml"
    conf.write_text(
        '[plugins]\nenabled = ["max_steps", "token_budget"]\n'
        "[plugins.token_budget]\nmax_context = 4000\nwarn_at = 0.99\n",
        encoding="utf-8",
    )
    args = ["replay", str(path), "--summary", "--json", "--config", str(conf)]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)  # one object: the summary alone
    assert plain["successful_stopped_with_work_left"] == 0
    assert plain["system_prompt_tokens"] is None
    assert main([*args, "--system-prompt-tokens", "5000"]) == 0
    big = json.loads(capsys.readouterr().out)
    assert big["system_prompt_tokens"] == 5000
    assert big["successful_stopped_with_work_left"] == 1
    assert big["successful_stopped_with_work_left_by_reason"] == {"max_context": 1}
    assert main([*args, "--system-prompt-tokens", "-1"]) == 2
    assert "--system-prompt-tokens" in capsys.readouterr().err


def test_identical_repeats_need_the_same_call_and_the_same_result() -> None:
    """``repeat_runs`` counts one call made 5+ times in a row whatever it returned;
    ``identical_repeat_runs`` only when each time it also returned the same observation."""
    from loopwarden.traffic.replay import identical_repeat_streak, repeat_streak

    states = ["queued", "started", "copying", "indexing", "verifying", "done"]
    polling = [lookup("7", f"status: {s}") for s in states]
    stuck = [lookup("7", "status: pending") for _ in range(6)]
    assert (repeat_streak(polling), identical_repeat_streak(polling)) == (6, 1)
    # digits are masked (issue 31): an answer that moves only in its numbers is the same
    counting = [lookup("7", f"status: pending, line {i}0") for i in range(6)]
    assert identical_repeat_streak(counting) == 6
    assert (repeat_streak(stuck), identical_repeat_streak(stuck)) == (6, 6)
    # a different call between breaks it; so does a user's message (unlike repeat_streak):
    # the user may have changed something before the agent looks again
    broken = [*stuck[:3], lookup("8"), *stuck[:3]]
    assert identical_repeat_streak(broken) == 3
    across_turns = [*stuck[:3], step("Still pending.", user_reply="Again?"), *stuck[:2]]
    assert (repeat_streak(across_turns), identical_repeat_streak(across_turns)) == (5, 3)
    # parallel calls: each call is matched with its own observation
    pair = step(None, [("get_record", {"key": "7"})] * 2, ["status: pending", "status: done"])
    assert identical_repeat_streak([pair]) == 1


def _multi_source_corpus() -> list[dict[str, Any]]:
    """Two sources: "shop/a" with two healthy runs (one warned) and a stopped runaway;
    "shop/b" with one healthy run cut with work left and a step-cap run nobody stopped."""
    runs = [
        traj("a1", [lookup("1"), step("ok")]),
        traj("a2", [step(None, [("warn_me", {})], ["ok"]), step("ok")]),
        traj(
            "a3",
            [lookup("7", "NOT_FOUND") for _ in range(6)] + [step("sorry")],
            success=False,
            termination="max_steps",
        ),
        traj("b1", [lookup("1"), lookup("2"), lookup("3"), lookup("4"), step("ok")]),
        traj("b2", [lookup("1"), lookup("2"), step("x")], success=False, termination="max_steps"),
    ]
    for r in runs:
        r["source"] = "shop/a" if r["id"].startswith("a") else "shop/b"
    return runs


def test_summary_per_source(probe_deployment: Callable[..., Deployment]) -> None:
    from loopwarden.traffic.replay import summarize_by_source

    dep = probe_deployment(stop_before_call=4)
    results = [replay_trajectory(dep, t) for t in _multi_source_corpus()]
    assert [r.source for r in results] == ["shop/a"] * 3 + ["shop/b"] * 2
    by = summarize_by_source(results)
    assert list(by) == ["shop/a", "shop/b"]
    a, b = by["shop/a"], by["shop/b"]
    assert (a["trajectories"], a["successful"]) == (3, 2)
    assert (a["successful_stopped_with_work_left"], a["successful_warned"]) == (0, 1)
    assert a["successful_warned_pct"] == 50.0
    assert (a["identical_repeat_runs"], a["identical_repeat_runs_stopped"]) == (1, 1)
    assert (a["step_cap_runs"], a["step_cap_runs_stopped"]) == (1, 1)
    assert (b["trajectories"], b["successful"]) == (2, 1)
    assert b["successful_stopped_with_work_left_pct"] == 100.0
    assert (b["step_cap_runs"], b["step_cap_runs_stopped"]) == (1, 0)
    assert b["identical_repeat_runs"] == 0
    # the per-source figures add up to the overall ones
    overall = summarize(results)
    for key in ("trajectories", "successful", "step_cap_runs", "identical_repeat_runs"):
        assert a[key] + b[key] == overall[key]


def _probe_config(tmp_path: Path) -> Path:
    conf = tmp_path / "probe.toml"
    conf.write_text(
        '[plugins]\nenabled = ["max_steps", "repeat_call"]\n[plugins.max_steps]\nmax_steps = 4\n',
        encoding="utf-8",
    )
    return conf


def test_cli_replay_reads_gzip_and_several_files_and_reports_per_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    corpus = _multi_source_corpus()
    plain = write_jsonl(tmp_path / "a.jsonl", corpus[:3])
    packed = tmp_path / "b.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(t) + "\n" for t in corpus[3:])
    both = write_jsonl(tmp_path / "all.jsonl", corpus)
    conf = str(_probe_config(tmp_path))
    args = ["--summary", "--json", "--config", conf]
    assert main(["replay", str(plain), str(packed), *args]) == 0
    split = json.loads(capsys.readouterr().out)
    assert main(["replay", str(both), *args]) == 0
    whole = json.loads(capsys.readouterr().out)
    for s in (split, whole):
        s.pop("seconds")
    assert split == whole  # a gzip file reads as the same lines
    assert split["trajectories"] == 5 and set(split["by_source"]) == {"shop/a", "shop/b"}
    assert split["by_source"]["shop/b"]["step_cap_runs"] == 1
    # a gzip file recognised by its magic bytes, whatever its name
    renamed = tmp_path / "b-packed.jsonl"
    renamed.write_bytes(packed.read_bytes())
    assert main(["replay", str(renamed), *args]) == 0
    assert json.loads(capsys.readouterr().out)["trajectories"] == 2
    # text: the overall lines, then a table per source -- only with several sources
    assert main(["replay", str(both), "--summary", "--config", conf]) == 0
    out = capsys.readouterr().out
    assert "\nsource  " in out and "identical repeats 5+ stopped" in out
    assert "\nshop/b " in out and '"by_source"' not in out
    assert main(["replay", str(plain), "--summary", "--config", conf]) == 0
    out = capsys.readouterr().out
    assert "trajectories" in out and "identical repeats 5+ stopped" not in out
    assert "by_source" not in out
    # for people: labelled sections, no raw keys (the JSON keeps them)
    assert "Successful runs -- the guards should leave these alone" in out
    assert "Runaway runs -- the guards should stop these" in out
    assert "successful_stopped_with_work_left" not in out and "_pct" not in out


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not gzip"])
def test_cli_replay_a_corrupt_gzip_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    import gzip

    good = gzip.compress(
        "".join(json.dumps(t) + "\n" for t in _multi_source_corpus() * 20).encode()
    )
    path = tmp_path / "runs.jsonl.gz"
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "garbage":
        path.write_bytes(good[:10] + b"\x00" * 50 + good[60:])
    else:
        path.write_text(json.dumps(_multi_source_corpus()[0]) + "\n", encoding="utf-8")
    code = main(["replay", str(path), "--summary", "--config", str(_probe_config(tmp_path))])
    _, err = capsys.readouterr()
    assert code == 2
    assert "runs.jsonl.gz" in err and "gzip" in err and "Traceback" not in err


def _records(tmp_path: Path, trajectory: bool) -> Path:
    """run_record's own file, written by real runs of the demo scenarios."""
    path = tmp_path / ("with.jsonl" if trajectory else "without.jsonl")
    conf = parse_config(
        {
            "plugins": {
                "enabled": ["max_steps", "run_record"],
                "run_record": {"path": str(path), "trajectory": trajectory},
            }
        },
        path="<test>",
    )
    with Deployment(conf) as dep:
        for name in ("refund", "retry-storm", "oscillation"):
            dep.run(scenario=name)
    return path


def test_replay_reads_run_records_written_with_their_trajectories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _records(tmp_path, trajectory=True)
    conf = _probe_config(tmp_path)
    assert main(["replay", str(path), "--json", "--summary", "--config", str(conf)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["trajectories"] == 3 and summary["unreadable_lines"] == 0
    assert "unreadable" not in err


def test_replay_of_run_records_without_trajectories_says_how_to_record_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _records(tmp_path, trajectory=False)
    conf = _probe_config(tmp_path)
    assert main(["replay", str(path), "--summary", "--config", str(conf)]) == 2
    out, err = capsys.readouterr()
    # not "unreadable": recognised as run records, with the setting that records what
    # replay needs
    assert "unreadable line" not in err
    assert "unreadable lines 0" in out and "run records without a trajectory 3" in out
    assert f"{path}: 3 run record(s) without their trajectory (line 1, 2, 3) skipped" in err
    assert '"run_record" to [plugins] enabled' in err
    assert "[plugins.run_record] trajectory = true" in err
    assert main(["replay", str(path), "--json", "--summary", "--config", str(conf)]) == 2
    summary = json.loads(capsys.readouterr().out)
    assert summary["unreadable_lines"] == 0 and summary["run_records_without_trajectory"] == 3


def test_a_bad_line_beside_run_records_is_still_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file mixing a broken line, records without trajectories and records with them: each
    counted as what it is, the records with trajectories replayed."""
    without = _records(tmp_path, trajectory=False).read_text(encoding="utf-8")
    with_ = _records(tmp_path, trajectory=True).read_text(encoding="utf-8")
    path = tmp_path / "mixed.jsonl"
    path.write_text("{not json\n" + without + with_, encoding="utf-8")
    conf = _probe_config(tmp_path)
    assert main(["replay", str(path), "--json", "--summary", "--config", str(conf)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["trajectories"] == 3 and summary["unreadable_lines"] == 1
    assert summary["run_records_without_trajectory"] == 3
    assert "skipped 1 unreadable line(s)" in err and "(line 2, 3, 4) skipped" in err


def test_a_run_recorded_with_its_trajectory_replays_to_the_same_stop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round trip: real runs of the demo scenarios under the shipped guards, recorded by
    run_record with ``trajectory = true``, replayed under the same config with the tools'
    natures declared (``--tools``): each stops where and why the live run stopped."""
    import sys

    from loopwarden import demo
    from loopwarden.config import default_config_path

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    records = tmp_path / "runs.jsonl"
    data = tomllib.loads(default_config_path().read_text(encoding="utf-8"))
    data["plugins"]["enabled"].append("run_record")
    data["plugins"]["run_record"] = {"path": str(records), "trajectory": True}
    conf = tmp_path / "config.toml"
    from loopwarden.traffic.calibrate import dump_toml

    conf.write_text(dump_toml(data), encoding="utf-8")
    config = parse_config(data, path=str(conf))
    scenarios = ("always-not-found", "retry-storm", "oscillation", "all-tools-fail", "refund")
    for name in scenarios:
        with Deployment(config, tools=demo.config_tools(config)) as dep:
            dep.run(scenario=name)
    natures = tmp_path / "natures.toml"
    natures.write_text(
        "".join(
            f"[tools.{t.name}]\nread_only = {str(t.read_only).lower()}\n"
            f"deterministic = {str(t.deterministic).lower()}\n"
            f"side_effect = {str(t.side_effect).lower()}\n"
            for t in demo.config_tools(config)
        ),
        encoding="utf-8",
    )
    live = [json.loads(x) for x in records.read_text(encoding="utf-8").splitlines()]
    assert [r["scenario"] for r in live] == list(scenarios)
    assert sum(1 for r in live if r["stopped_by"]) >= 3  # guards acted in the live runs
    args = ["replay", str(records), "--json", "--tools", str(natures), "--config", str(conf)]
    assert main(args) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    replayed = lines[:-1]
    assert lines[-1]["summary"]["unreadable_lines"] == 0
    assert [r["id"] for r in replayed] == [r["run_id"] for r in live]
    for rec, got in zip(live, replayed, strict=True):
        if rec["stopped_by"] is None:
            assert got["stop"] is None, rec["scenario"]
        else:
            assert got["stop"]["reason"] == rec["termination"], rec["scenario"]
            assert got["stop"]["plugin"] == rec["stopped_by"], rec["scenario"]
            step = next(v["step"] for v in rec["verdicts"] if v["kind"] == "stop")
            assert got["stop"]["step"] == step, rec["scenario"]
