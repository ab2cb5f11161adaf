"""Synthetic demo traffic: seeded customer conversations with the demo shop, played unguarded.

``loopwarden demo --trajectories FILE`` writes them (after the built-in scenarios' unguarded
runs) so that ``loopwarden replay`` and ``loopwarden calibrate`` can be tried on a file a fresh
clone produces.  Twelve scenarios are too few for a p99 (calibrate needs 100 successful
conversations), and one scenario copied a hundred times would fake a statistic -- so this
module *generates* conversations: a :class:`random.Random` seeded with ``seed`` picks, for
each one, a customer intent and the shape of the agent's work, and builds a scripted model
for it; the real shop tools answer (a fresh shop per conversation, its clock at
:data:`~loopwarden.demo.DEMO_NOW`).

* **Healthy intents** (labelled ``success = true``): order status, parcel tracking (by order
  or by waybill), a refund inside the 7-day window (asked and confirmed over two turns, or
  done at once), a refund outside it (a follow-up on exchanges, or a hand-off to a person),
  a pending shipment, two orders at once (parallel calls), knowledge questions (a rephrased
  search when the first finds nothing), a mistyped order number corrected in the next turn,
  a greeting before the question.  One to three user turns, zero to five lookups per turn,
  and in some conversations one redundant re-lookup -- what real agents do and guards must
  tolerate.
* **Runaways** (:data:`RUNAWAY_SHARE` of the conversations, labelled ``success = false``):
  repeating a lookup that finds nothing, re-polling a parcel in transit, oscillating between
  an order and its parcel, and never finishing -- cycling through lookups long after the
  answer is known.  Unguarded, each runs until the demo's cap of model calls
  (``meta.termination_reason = "max_steps"``).

It is synthetic demo traffic, not a statistic of real agents: the shares and shapes are the
generator's, chosen to exercise replay and calibrate.  The same ``seed`` and ``conversations``
give the same trajectories, byte for byte (no clock, no random run id reaches the file).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopwarden.clock import FakeClock
from loopwarden.config import Config
from loopwarden.demo.runner import (
    NATURAL_ENDS,
    SYNTHETIC_NOTE,
    UNGUARDED_CAP,
    TickingNow,
    _db_dir,
    fresh_store,
    unguarded_deployment,
)
from loopwarden.demo.shop import Shop, with_shop_prompt
from loopwarden.demo.trajectories import UsageTape, run_steps, usage_tape
from loopwarden.deployment import Deployment
from loopwarden.engine.drivers import drive
from loopwarden.models.scenario import Scenario
from loopwarden.run import Conversation
from loopwarden.tools import ToolRegistry

__all__ = [
    "DEFAULT_CONVERSATIONS",
    "DEFAULT_SEED",
    "RUNAWAY_SHARE",
    "SOURCE",
    "Plan",
    "plan_traffic",
    "play_traffic",
]

#: conversations ``loopwarden demo --trajectories`` generates by default: with
#: :data:`RUNAWAY_SHARE` runaways, enough successful ones for calibrate's minimum of 100
DEFAULT_CONVERSATIONS = 150
#: the generator's default seed
DEFAULT_SEED = 21
#: the share of conversations that run away (rounded to a whole number)
RUNAWAY_SHARE = 0.12
#: the ``source`` of the generated trajectories
SOURCE = "loopwarden-demo/synthetic"

#: the shop's seed orders: product, what the agent says of its state, tracking number
_ORDERS: dict[str, tuple[str, str, str | None]] = {
    "88231": ("比特 S10 Pro 扫地机", "已于 2026-06-22 14:05 签收", "SF1234567890"),
    "88232": ("比特 A3 无线吸尘器", "正在运输中，最新到达杭州转运中心", "SF2234567891"),
    "88233": ("比特 H1 空气净化器", "还在待发货，现货 48 小时内发出", None),
    "88234": ("比特 S10 Pro 滤网套装", "已于 2026-06-02 10:11 签收", "YT3234567892"),
}
_TRACKED = [o for o, (_, _, t) in _ORDERS.items() if t]
_LOOKING = [
    "我先查一下订单。",
    "好的，我帮您查询。",
    "稍等，我看一下。",
    "Let me check that order.",
]
_TOPICS = [  # (a question, the search the agent makes, its answer)
    ("扫地机保修多久？", "扫地机保修政策", "扫地机整机保修 1 年，电池保修 6 个月，需提供订单号。"),
    (
        "退款多久能到账？",
        "退款到账时间",
        "审核通过后原路退回：支付宝/微信 1-3 个工作日，银行卡 3-7 个工作日。",
    ),
    ("下单后多久发货？", "发货时间", "现货商品下单后 48 小时内发货，预售商品以页面说明为准。"),
    (
        "质量问题可以换货吗？",
        "质量问题换货",
        "签收后 15 天内出现非人为质量问题可以换货，运费由商家承担。",
    ),
    (
        "What is your return policy?",
        "return policy",
        "Items can be returned within 7 days of delivery, no reason needed, if complete "
        "and undamaged.",
    ),
]
_NOTHING = ["会员积分", "积分兑换规则", "发票抬头"]  # searches the knowledge base has nothing on

Call = dict[str, Any]
Step = dict[str, Any]
#: one user turn: the user's message, the agent's tool-call steps, its answer, and ``then``
UserTurn = tuple[str, list[Step], str, str]


def _call(name: str, **arguments: str) -> Call:
    return {"name": name, "arguments": arguments}


def _step(content: str | None, *calls: Call) -> Step:
    return {"content": content, "tool_calls": list(calls)}


def _turn(user: str, steps: list[Step], answer: str, then: str = "final") -> UserTurn:
    return user, steps, answer, then


def _status(oid: str) -> str:
    product, state, _ = _ORDERS[oid]
    return f"订单 {oid}（{product}）{state}。"


# -- healthy intents -------------------------------------------------------------------------


def _order_status(r: random.Random) -> list[UserTurn]:
    oid = r.choice(list(_ORDERS))
    user = r.choice(["订单 {o} 现在什么状态？", "帮我查下订单 {o}", "我的订单 {o} 发货了吗？"])
    steps = [_step(r.choice(_LOOKING), _call("query_order", order_id=oid))]
    if r.random() < 0.25:  # a redundant re-lookup of the same order
        steps.append(_step("我再确认一下订单信息。", _call("query_order", order_id=oid)))
    return [_turn(user.format(o=oid), steps, _status(oid))]


def _tracking(r: random.Random) -> list[UserTurn]:
    oid = r.choice(_TRACKED)
    tno = _ORDERS[oid][2] or ""
    if r.random() < 0.4:  # the customer gives the waybill number
        user, steps = f"运单 {tno} 到哪了？", []
    else:
        user = f"订单 {oid} 的快递到哪了？"
        steps = [_step(r.choice(_LOOKING), _call("query_order", order_id=oid))]
    steps.append(_step("查一下物流轨迹。", _call("query_logistics", tracking_no=tno)))
    if r.random() < 0.2:  # a redundant re-poll of a parcel that has not moved
        steps.append(_step("再刷新一次物流。", _call("query_logistics", tracking_no=tno)))
    turns = [_turn(user, steps, f"您的包裹：{_status(oid)}")]
    if r.random() < 0.3:
        turns.append(_turn("大概什么时候能到？", [], "一般 1-3 天送达，签收后会有短信通知。"))
    return turns


def _refund_in_window(r: random.Random) -> list[UserTurn]:
    checks = [
        _step("我先查一下订单。", _call("query_order", order_id="88231")),
        _step("确认一下退货政策。", _call("search_knowledge", query="七天无理由退货")),
    ]
    if r.random() < 0.5:
        checks.append(_step("看一下今天的日期。", _call("get_current_time")))
    refund = _step(
        "为您提交退款申请。",
        _call("apply_refund", order_id="88231", reason=r.choice(["七天无理由退货", "不想要了"])),
    )
    done = "已为订单 88231 提交退款 1999 元，1-3 个工作日原路退回。"
    if r.random() < 0.5:  # asked, then confirmed in a second turn
        return [
            _turn(
                "扫地机（订单 88231）不想要了，能退吗？",
                checks,
                "可以退：仍在 7 天无理由退货期内。要为您申请吗？",
            ),
            _turn(r.choice(["好的，帮我申请", "是的，麻烦了"]), [refund], done),
        ]
    return [_turn("订单 88231 我要退货退款", [*checks, refund], done)]


def _refund_out_of_window(r: random.Random) -> list[UserTurn]:
    checks = [
        _step("我先查一下订单。", _call("query_order", order_id="88234")),
        _step("确认一下退货政策。", _call("search_knowledge", query="七天无理由退货")),
        _step("看一下今天的日期。", _call("get_current_time")),
    ]
    turns = [
        _turn(
            "滤网（订单 88234）不想要了，可以退吗？",
            checks,
            "订单 88234 于 2026-06-02 签收，已超过 7 天无理由退货期，无法无理由退货。",
        )
    ]
    roll = r.random()
    if roll < 0.4:
        turns.append(
            _turn(
                "那有质量问题能换吗？",
                [_step("查一下换货政策。", _call("search_knowledge", query="质量问题换货"))],
                "签收后 15 天内的非人为质量问题可以换货；"
                "订单 88234 已超过 15 天，建议联系人工客服。",
            )
        )
    elif roll < 0.55:  # the customer insists: a hand-off ends the conversation
        turns.append(
            _turn(
                "我还是要退，帮我转人工",
                [
                    _step(
                        "为您转接人工客服。",
                        _call("transfer_to_human", reason="订单 88234 超期退货"),
                    )
                ],
                "已为您转接人工客服。",
            )
        )
    return turns


def _pending(r: random.Random) -> list[UserTurn]:
    steps = [_step(r.choice(_LOOKING), _call("query_order", order_id="88233"))]
    if r.random() < 0.6:
        steps.append(_step("查一下发货时效。", _call("search_knowledge", query="发货时间")))
    return [_turn("空气净化器（订单 88233）怎么还没发货？", steps, _status("88233"))]


def _two_orders(r: random.Random) -> list[UserTurn]:
    a, b = r.sample(_TRACKED, 2)
    steps = [
        _step(
            "两个订单一起查。", _call("query_order", order_id=a), _call("query_order", order_id=b)
        )
    ]
    waybills = [_call("query_logistics", tracking_no=_ORDERS[o][2] or "") for o in (a, b)]
    if r.random() < 0.6:
        steps.append(_step("再查两个运单的物流。", *waybills))
    return [_turn(f"我有两个订单 {a} 和 {b}，分别到哪了？", steps, f"{_status(a)}{_status(b)}")]


def _knowledge(r: random.Random) -> list[UserTurn]:
    turns = []
    for question, query, answer in r.sample(_TOPICS, r.choice([1, 1, 2])):
        steps = []
        if r.random() < 0.25:  # a first search that finds nothing, then a rephrase
            steps.append(
                _step("我查一下知识库。", _call("search_knowledge", query=r.choice(_NOTHING)))
            )
        steps.append(_step("查一下相关政策。", _call("search_knowledge", query=query)))
        turns.append(_turn(question, steps, answer))
    return turns


def _mistyped(r: random.Random) -> list[UserTurn]:
    oid = r.choice(list(_ORDERS))
    typo = oid[:3] + oid[4] + oid[3] if oid[3] != oid[4] else oid[:4] + "9"
    if typo in _ORDERS:
        typo = oid + "0"
    return [
        _turn(
            f"帮我查一下订单 {typo}",
            [_step(r.choice(_LOOKING), _call("query_order", order_id=typo))],
            f"没有查到订单 {typo}，请核对一下订单号？",
        ),
        _turn(
            f"不好意思，是 {oid}",
            [_step("好的，重新查询。", _call("query_order", order_id=oid))],
            _status(oid),
        ),
    ]


Intent = Callable[[random.Random], list[UserTurn]]
#: healthy intents and their weights
HEALTHY: dict[str, tuple[Intent, int]] = {
    "order_status": (_order_status, 5),
    "tracking": (_tracking, 5),
    "refund_in_window": (_refund_in_window, 3),
    "refund_out_of_window": (_refund_out_of_window, 3),
    "pending_shipment": (_pending, 2),
    "two_orders": (_two_orders, 2),
    "knowledge": (_knowledge, 4),
    "mistyped_order": (_mistyped, 2),
}


# -- runaways ----------------------------------------------------------------------------------


def _rw_not_found(r: random.Random) -> UserTurn:
    bad = str(r.randint(90000, 99999))
    step = _step("我再查一次这个订单。", _call("query_order", order_id=bad))
    return _turn(f"查询订单 {bad} 的状态", [step], f"没有查到订单 {bad}。", "repeat_last")


def _rw_polling(r: random.Random) -> UserTurn:
    step = _step("再刷新一下物流。", _call("query_logistics", tracking_no="SF2234567891"))
    return _turn("吸尘器（订单 88232）今天能到吗？", [step], _status("88232"), "repeat_last")


def _rw_oscillation(r: random.Random) -> UserTurn:
    oid = r.choice(_TRACKED)
    steps = [
        _step("查一下订单。", _call("query_order", order_id=oid)),
        _step("再看物流。", _call("query_logistics", tracking_no=_ORDERS[oid][2] or "")),
    ]
    return _turn(f"订单 {oid} 的包裹在哪？", steps, _status(oid), "cycle")


def _rw_never_finish(r: random.Random) -> UserTurn:
    pool = [
        _step("先查订单。", _call("query_order", order_id="88231")),
        _step("核对物流。", _call("query_logistics", tracking_no="SF1234567890")),
        _step("确认退货政策。", _call("search_knowledge", query="七天无理由退货")),
        _step("看看退款时效。", _call("search_knowledge", query="退款到账时间")),
        _step("为全面起见，查另一笔订单。", _call("query_order", order_id="88232")),
    ]
    steps = r.sample(pool, r.randint(3, 5))
    answer = "可以退：订单 88231 于 2026-06-22 签收，仍在 7 天无理由退货期内。"
    return _turn("扫地机（订单 88231）还能退吗？", steps, answer, "cycle")


RUNAWAYS: dict[str, Callable[[random.Random], UserTurn]] = {
    "repeat_not_found": _rw_not_found,
    "repeat_polling": _rw_polling,
    "oscillation": _rw_oscillation,
    "never_finish": _rw_never_finish,
}


# -- planning and playing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One generated conversation: its id, intent, label and one scenario per user turn."""

    id: str
    intent: str
    runaway: bool
    turns: tuple[Scenario, ...]


def _scenario(name: str, turn: UserTurn) -> Scenario:
    user, steps, answer, then = turn
    return Scenario.model_validate(
        {
            "name": name,
            "user": user,
            "model": {"turns": steps, "then": then, "on_warning": "ignore", "final_text": answer},
        }
    )


def plan_traffic(
    conversations: int = DEFAULT_CONVERSATIONS, seed: int = DEFAULT_SEED
) -> list[Plan]:
    """The conversations the generator makes for ``seed``: :data:`RUNAWAY_SHARE` of them (at
    random places) run away, the others follow a healthy intent drawn by weight."""
    r = random.Random(seed)
    n_runaway = round(conversations * RUNAWAY_SHARE)
    runaway_at = set(r.sample(range(conversations), n_runaway))
    names, weights = list(HEALTHY), [w for _, w in HEALTHY.values()]
    plans = []
    for i in range(conversations):
        cid = f"synthetic-{seed}-{i + 1:04d}"
        if i in runaway_at:
            kind = r.choice(list(RUNAWAYS))
            turns = [RUNAWAYS[kind](r)]
            if r.random() < 0.3:  # a healthy question first, the loop in the next turn
                turns = [*_order_status(r), *turns]
            intent = f"runaway:{kind}"
        else:
            intent = r.choices(names, weights)[0]
            turns = HEALTHY[intent][0](r)
            if r.random() < 0.15:
                greeting = _turn(
                    r.choice(["你好", "在吗？", "Hi"]), [], "您好，请问有什么可以帮您？"
                )
                turns = [greeting, *turns]
        scenarios = tuple(_scenario(f"{cid}-{k + 1}", t) for k, t in enumerate(turns))
        plans.append(Plan(cid, intent, i in runaway_at, scenarios))
    return plans


def _play(
    dep: Deployment,
    plan: Plan,
    world: tuple[Shop, TickingNow, ToolRegistry, Path],
    tape: UsageTape,
    seed: int,
) -> dict[str, Any]:
    """One planned conversation on the shop as seeded, as a recorded trajectory."""
    shop, now, tools, store = world
    conversation = Conversation(plan.id)
    steps: list[dict[str, Any]] = []
    termination, answered = None, False
    shop.reset()
    now.reset()
    with fresh_store(dep, store) as shared:
        for sc in plan.turns:
            if steps:
                steps[-1]["user_reply"] = sc.user
            run, model = dep.prepare(
                scenario=sc,
                tools=tools,
                clock=FakeClock(),
                conversation=conversation,
                run_id=sc.name,
            )
            run.shared = shared
            drive(dep.engine, run, model)
            steps += run_steps(run, tape.pop(run.run_id, []))
            rec = run.record()
            termination, answered = rec["termination"], bool(rec["final_answer_present"])
            if termination not in NATURAL_ENDS:  # a loop or a hand-off ends the conversation
                break
    return {
        "source": SOURCE,
        "id": plan.id,
        "success": not plan.runaway,
        "user": plan.turns[0].user,
        "steps": steps,
        "final_answer_present": answered,
        "meta": {
            "domain": "demo-shop",
            "intent": plan.intent,
            "seed": seed,
            "termination_reason": termination,
            "note": SYNTHETIC_NOTE,
        },
    }


def play_traffic(
    config: Config,
    conversations: int = DEFAULT_CONVERSATIONS,
    seed: int = DEFAULT_SEED,
    *,
    cap: int = UNGUARDED_CAP,
    db_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Generate ``conversations`` conversations (:func:`plan_traffic`) and play each one
    unguarded -- only the essential step cap of ``cap`` model calls, as the demo's unguarded
    side -- on the shop as seeded (refunds and hand-offs are forgotten between conversations,
    each gets a ledger of its own); returns them as recorded trajectories (docs/contracts.md)."""
    plans = plan_traffic(conversations, seed)
    with (
        unguarded_deployment(with_shop_prompt(config), cap) as dep,
        _db_dir(db_dir) as dbs,
        usage_tape() as tape,
    ):
        now = TickingNow()
        shop = Shop(dbs / "synthetic-shop.sqlite3", now=now, durable=False)
        world = (shop, now, shop.tools(), dbs / "synthetic.store")
        return [_play(dep, plan, world, tape, seed) for plan in plans]


def counts(trajectories: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """(successful, unsuccessful) trajectories."""
    ts = list(trajectories)
    ok = sum(1 for t in ts if t.get("success") is True)
    return ok, len(ts) - ok
