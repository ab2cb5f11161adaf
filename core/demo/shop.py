"""The demo shop: customer-service tools on an embedded SQLite database.

The database is created and seeded on first use at a path from config (``[shop] db_path``),
by default in the user's data directory -- never inside the installed package.  A refund is a
real row that exists at most once per order: asking again -- with the same reason or a
reworded one ("七天无理由退货" / "7天无理由退货") -- returns the existing refund and never writes
a second row.

Tools (names and arguments are a contract: scenario files rely on them)::

    query_order(order_id)          read-only, deterministic
    query_logistics(tracking_no)   read-only, deterministic
    search_knowledge(query)        read-only, deterministic
    get_current_time()             read-only, NOT deterministic
    apply_refund(order_id, reason) side effect: one refund per order, whatever the reason
    transfer_to_human(reason)      terminal: a successful hand-off ends the run
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopwarden.exceptions import ToolError
from loopwarden.paths import data_dir, ensure_private_dir
from loopwarden.tools import Tool, ToolRegistry, tool

if TYPE_CHECKING:
    from loopwarden.config import Config

__all__ = [
    "SYSTEM_PROMPT",
    "Shop",
    "ShopConfig",
    "default_data_dir",
    "shop_config",
    "shop_tools",
    "with_shop_prompt",
]

#: the system prompt of a run against the demo shop when the deployment keeps the default one
SYSTEM_PROMPT = (
    "You are a customer-service agent for an online shop. Use the tools to look things "
    "up before answering, and answer in the user's language."
)


class ShopConfig(BaseModel):
    """``[shop]``: the demo shop's database (default: the user's data directory).

    The core configuration keeps the table as it is written; the demo validates it here, when
    it builds a shop (:func:`shop_config`), and ``loopwarden config check`` does too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    db_path: str | None = None


def with_shop_prompt(config: Config) -> Config:
    """``config`` with the shop's :data:`SYSTEM_PROMPT`, unless it sets ``[run]
    system_prompt`` itself (a run against the shop then tells the model what it is)."""
    if "system_prompt" in config.run.model_fields_set:
        return config
    run = config.run.model_copy(update={"system_prompt": SYSTEM_PROMPT})
    return config.model_copy(update={"run": run})


def shop_config(config: Config) -> ShopConfig:
    """The deployment's ``[shop]`` table, validated (errors name the file and the key)."""
    from loopwarden.config import validation_error

    try:
        return ShopConfig.model_validate(config.shop)
    except ValidationError as exc:
        raise validation_error(exc, path=config.path, prefix="shop") from None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY, product TEXT NOT NULL, amount_yuan INTEGER NOT NULL,
    status TEXT NOT NULL, ordered_at TEXT NOT NULL, signed_at TEXT, tracking_no TEXT
);
CREATE TABLE IF NOT EXISTS logistics (
    tracking_no TEXT NOT NULL, seq INTEGER NOT NULL, at TEXT NOT NULL, event TEXT NOT NULL,
    PRIMARY KEY (tracking_no, seq)
);
CREATE TABLE IF NOT EXISTS knowledge (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, reason TEXT NOT NULL,
    amount_yuan INTEGER NOT NULL, created_at TEXT NOT NULL, UNIQUE (order_id)
);
CREATE TABLE IF NOT EXISTS handoffs (
    ticket_id TEXT PRIMARY KEY, reason TEXT NOT NULL UNIQUE, created_at TEXT NOT NULL
);
"""

_ORDERS = [
    (
        "88231",
        "比特 S10 Pro 扫地机",
        1999,
        "已签收",
        "2026-06-18 09:12",
        "2026-06-22 14:05",
        "SF1234567890",
    ),
    ("88232", "比特 A3 无线吸尘器", 899, "运输中", "2026-06-20 20:31", None, "SF2234567891"),
    ("88233", "比特 H1 空气净化器", 1299, "待发货", "2026-06-23 11:47", None, None),
    (
        "88234",
        "比特 S10 Pro 滤网套装",
        129,
        "已签收",
        "2026-05-30 16:20",
        "2026-06-02 10:11",
        "YT3234567892",
    ),
]
_LOGISTICS = [
    ("SF1234567890", 1, "2026-06-19 08:30", "顺丰已揽收，深圳宝安集散中心"),
    ("SF1234567890", 2, "2026-06-20 22:14", "运输中，到达上海浦东转运中心"),
    ("SF1234567890", 3, "2026-06-22 09:02", "派送中，快递员 王师傅 138****1234"),
    ("SF1234567890", 4, "2026-06-22 14:05", "已签收，签收人：本人"),
    ("SF2234567891", 1, "2026-06-21 10:05", "顺丰已揽收，深圳宝安集散中心"),
    ("SF2234567891", 2, "2026-06-22 18:40", "运输中，到达杭州转运中心"),
    ("YT3234567892", 1, "2026-05-31 09:00", "圆通已揽收"),
    ("YT3234567892", 2, "2026-06-02 10:11", "已签收，签收人：前台"),
]
_KNOWLEDGE = [
    (
        "七天无理由退货政策",
        "自签收之日起 7 天内（含第 7 天），商品完好、配件齐全、不影响二次销售的，"
        "支持七天无理由退货退款。退款原路退回，1-3 个工作日到账。",
    ),
    ("退款到账时间", "退款审核通过后原路退回：支付宝/微信 1-3 个工作日，银行卡 3-7 个工作日。"),
    ("质量问题换货", "签收后 15 天内出现非人为质量问题，可申请换货，运费由商家承担。"),
    ("扫地机保修政策", "扫地机整机保修 1 年，电池保修 6 个月，需提供订单号。"),
    ("发货时间", "现货商品下单后 48 小时内发货，预售商品以页面说明为准。"),
    (
        "Return policy (English)",
        "Items may be returned within 7 days of delivery for a full refund, no reason needed, "
        "if they are complete and undamaged.",
    ),
]


def default_data_dir() -> Path:
    """The user's data directory for loopwarden (:func:`loopwarden.paths.data_dir`)."""
    return data_dir()


_TOKEN = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]", re.IGNORECASE)


def _terms(text: str) -> set[str]:
    """Latin words and CJK character bigrams (single characters too), for a tiny search."""
    toks = _TOKEN.findall(text.lower())
    terms = {t for t in toks if len(t) > 1 or not t.isascii()}
    cjk = [t for t in toks if not t.isascii()]
    terms.update(a + b for a, b in itertools.pairwise(cjk))
    return terms


class Shop:
    """One demo shop database.  Thread-safe: each operation opens its own connection."""

    def __init__(
        self,
        db_path: str | os.PathLike[str] | None = None,
        now: Callable[[], datetime] | None = None,
        *,
        durable: bool = True,
    ) -> None:
        self.db_path = Path(db_path) if db_path else default_data_dir() / "shop.sqlite3"
        self._now = now or (lambda: datetime.now(timezone(timedelta(hours=8))))
        #: False for a throwaway shop (the demo's): SQLite does not wait for the disk
        #: (``synchronous = OFF``), so creating a shop per run costs no fsyncs
        self.durable = durable
        self._init_lock = threading.Lock()
        self._ready = threading.Event()

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection to the (created and seeded if new) database."""
        self._ensure()
        conn = self._open(timeout=10)
        try:
            with conn:
                yield conn
        finally:
            conn.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds SQLite's write lock from its first statement.

        ``BEGIN IMMEDIATE`` serialises check-then-insert sequences across threads and
        processes, so two concurrent identical refunds see each other instead of both
        inserting (the UNIQUE constraint is the last line, not the mechanism).
        """
        self._ensure()
        conn = self._open(timeout=30, autocommit=True)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def _open(self, timeout: float, *, autocommit: bool = False) -> sqlite3.Connection:
        """A connection (``autocommit``: no implicit transactions, for :meth:`write`)."""
        conn = (
            sqlite3.connect(self.db_path, timeout=timeout, isolation_level=None)
            if autocommit
            else sqlite3.connect(self.db_path, timeout=timeout)
        )
        if not self.durable:
            conn.execute("PRAGMA synchronous=OFF")
        return conn

    def _ensure(self) -> None:
        if self._ready.is_set():
            return
        with self._init_lock:
            if self._ready.is_set():  # another thread created it meanwhile
                return
            ensure_private_dir(self.db_path.parent)  # often the data directory: owner-only
            conn = self._open(timeout=10)
            try:
                with conn:
                    conn.executescript(_SCHEMA)
                    conn.executemany("INSERT OR IGNORE INTO orders VALUES (?,?,?,?,?,?,?)", _ORDERS)
                    conn.executemany("INSERT OR IGNORE INTO logistics VALUES (?,?,?,?)", _LOGISTICS)
                    if conn.execute("SELECT COUNT(*) FROM knowledge").fetchone()[0] == 0:
                        conn.executemany(
                            "INSERT INTO knowledge (title, body) VALUES (?, ?)", _KNOWLEDGE
                        )
            finally:
                conn.close()
            self._ready.set()

    # -- operations (plain methods; the tools below wrap them) --------------------------

    def query_order(self, order_id: str) -> dict[str, object]:
        with self.connect() as c:
            row = c.execute(
                "SELECT * FROM orders WHERE order_id = ?", (order_id.strip(),)
            ).fetchone()
        if row is None:
            raise ToolError(f"NOT_FOUND: 订单 {order_id} 不存在")
        keys = (
            "order_id",
            "product",
            "amount_yuan",
            "status",
            "ordered_at",
            "signed_at",
            "tracking_no",
        )
        return dict(zip(keys, row, strict=True))

    def query_logistics(self, tracking_no: str) -> list[dict[str, str]]:
        with self.connect() as c:
            rows = c.execute(
                "SELECT at, event FROM logistics WHERE tracking_no = ? ORDER BY seq",
                (tracking_no.strip().upper(),),
            ).fetchall()
        if not rows:
            raise ToolError(f"NOT_FOUND: 运单 {tracking_no} 没有物流记录")
        return [{"at": at, "event": ev} for at, ev in rows]

    def search_knowledge(self, query: str, limit: int = 2) -> list[dict[str, str]]:
        q = _terms(query)
        with self.connect() as c:
            rows = c.execute("SELECT title, body FROM knowledge ORDER BY id").fetchall()
        scored = []
        for title, body in rows:
            score = len(q & _terms(title)) * 2 + len(q & _terms(body))
            if score:
                scored.append((score, title, body))
        scored.sort(key=lambda s: -s[0])
        return [{"title": t, "body": b} for _, t, b in scored[:limit]]

    def apply_refund(self, order_id: str, reason: str) -> dict[str, object]:
        order = self.query_order(order_id)
        reason = reason.strip()
        with self.write() as c:
            row = c.execute(
                "SELECT refund_id, created_at, reason FROM refunds WHERE order_id = ?",
                (order["order_id"],),
            ).fetchone()
            if row is not None:  # the order is already refunded: never a second refund
                return {
                    "refund_id": row[0],
                    "order_id": order["order_id"],
                    "status": "已受理",
                    "created_at": row[1],
                    "reason": row[2],
                    "duplicate": True,
                }
            created = self._now().strftime("%Y-%m-%d %H:%M:%S")
            n = c.execute("SELECT COUNT(*) FROM refunds").fetchone()[0] + 1
            refund_id = f"RF{order['order_id']}{n:03d}"
            c.execute(
                "INSERT INTO refunds VALUES (?,?,?,?,?)",
                (refund_id, order["order_id"], reason, order["amount_yuan"], created),
            )
        return {
            "refund_id": refund_id,
            "order_id": order["order_id"],
            "status": "已受理",
            "amount_yuan": order["amount_yuan"],
            "created_at": created,
        }

    def transfer_to_human(self, reason: str) -> dict[str, str]:
        reason = reason.strip()
        with self.write() as c:
            row = c.execute("SELECT ticket_id FROM handoffs WHERE reason = ?", (reason,)).fetchone()
            if row is None:
                n = c.execute("SELECT COUNT(*) FROM handoffs").fetchone()[0] + 1
                ticket = f"H{n:05d}"
                c.execute(
                    "INSERT INTO handoffs VALUES (?,?,?)",
                    (ticket, reason, self._now().strftime("%Y-%m-%d %H:%M:%S")),
                )
            else:
                ticket = row[0]
        return {"status": "已转接人工客服", "ticket_id": ticket}

    def reset(self) -> None:
        """Forget every refund and hand-off: the shop as seeded (the demo's generated
        conversations share one shop, each starting from the seed data)."""
        with self.write() as c:
            c.execute("DELETE FROM refunds")
            c.execute("DELETE FROM handoffs")

    def refunds(self) -> list[tuple[str, str, str]]:
        """All refund rows as (refund_id, order_id, reason) -- for tests and the demo."""
        with self.connect() as c:
            return c.execute("SELECT refund_id, order_id, reason FROM refunds").fetchall()

    def tools(self) -> ToolRegistry:
        """The six shop tools, bound to this database."""
        return shop_tools(self)


def _dump(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def shop_tools(shop: Shop | str | os.PathLike[str] | None = None) -> ToolRegistry:
    """The demo shop's six tools, bound to ``shop`` -- a :class:`Shop`, or the directory
    for a new shop's database (``shop.sqlite3`` there; default: the user's data directory).

    The database is created and seeded only when a tool first runs, so declaring the tools
    touches no file.
    """
    if isinstance(shop, Shop):
        return _declare(shop)
    return _declare(Shop(Path(shop) / "shop.sqlite3" if shop is not None else None))


def _declare(shop: Shop) -> ToolRegistry:

    @tool(read_only=True, deterministic=True)
    def query_order(order_id: Annotated[str, Field(description="订单号，例如 88231")]) -> str:
        """查询订单详情：商品、金额、状态、签收时间、运单号。"""
        return _dump(shop.query_order(order_id))

    @tool(read_only=True, deterministic=True)
    def query_logistics(tracking_no: Annotated[str, Field(description="运单号")]) -> str:
        """查询运单的物流轨迹。"""
        return _dump(shop.query_logistics(tracking_no))

    @tool(read_only=True, deterministic=True)
    def search_knowledge(query: Annotated[str, Field(description="检索关键词")]) -> str:
        """检索售后知识库（退货、退款、保修、发货政策）。"""
        hits = shop.search_knowledge(query)
        return _dump(hits) if hits else "NO_RESULTS: 知识库中没有匹配的条目"

    @tool(read_only=True, deterministic=False)
    def get_current_time() -> str:
        """获取当前时间（北京时间）。"""
        return shop._now().strftime("%Y-%m-%d %H:%M:%S")

    @tool(side_effect=True, idempotency_keys=("order_id",))
    def apply_refund(
        order_id: Annotated[str, Field(description="订单号")],
        reason: Annotated[str, Field(description="退款原因")],
    ) -> str:
        """为订单提交退款申请（每个订单只会受理一次退款）。"""
        return _dump(shop.apply_refund(order_id, reason))

    @tool(terminal=True, side_effect=True, idempotency_keys=("reason",))
    def transfer_to_human(reason: Annotated[str, Field(description="转人工的原因")]) -> str:
        """转接人工客服；转接成功后本次对话由人工接手。"""
        return _dump(shop.transfer_to_human(reason))

    tools: list[Tool] = [
        query_order,
        query_logistics,
        search_knowledge,
        get_current_time,
        apply_refund,
        transfer_to_human,
    ]
    return ToolRegistry(tools)
