"""The Redis backend of :mod:`loopwarden.store`: Lua scripts for every check-and-change.

Split from :mod:`loopwarden.store` (which re-exports :class:`RedisStore` and opens it for a
``redis://``, ``rediss://`` or ``unix://`` URL): the store module holds the interface the
budgets and the ledger are written against; this module holds one implementation of it -- the
key layout (every key carries the hash tag ``{namespace}``, so a Redis Cluster keeps them in one
slot) and the scripts.  The ``redis`` package (the optional extra ``loopwarden[redis]``) is
imported only when a :class:`RedisStore` is created.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from loopwarden.exceptions import ConfigError, StoreError
from loopwarden.store import (
    QUANTITIES,
    Counter,
    CounterRow,
    LedgerEntry,
    LedgerState,
    Reserved,
    _amounts,
    _Backend,
    _DocUpdate,
    _entry,
    _ident,
    redact_url,
)
from loopwarden.store.admin import (
    CHANGES_KEPT,
    Change,
    LedgerRow,
    LimitOverride,
    limits_tuple,
)
from loopwarden.store.breakers import BreakerView

__all__ = ["RedisStore"]

log = logging.getLogger("loopwarden.store")


#: expired members of the counter index a write removes on its way (bounded, opportunistic)
PRUNE_BATCH = 64
#: the first and the longest pause (seconds, jittered) before a breaker's optimistic
#: transaction (WATCH / MULTI) tries again after another client changed the same breaker in
#: between -- many workers failing at once all write it; it tries until ``timeout_s``
BREAKER_RETRY_S = (0.0005, 0.02)

#: connections one store keeps to the server at most (a URL's ``?max_connections=N`` sets
#: it): a call that finds them all busy waits for one, up to ``timeout_s``
MAX_CONNECTIONS = 64

# The counter index is a sorted set scored by each counter's expiry (+inf: never), so a write
# prunes the expired members in O(log n) -- the hashes themselves expire by EXPIREAT.
#
# A counter's live reservations are one hash ("held"): each token's amounts and expiry
# ("a,b,c,d,e,expires_at"), and beside them their sums and the earliest expiry (the fields
# "~runs" ... "~cost" and "~next", written in the same script as the entries, so they always
# agree).  A reserve reads the sums, not the entries: its work does not grow with the calls in
# flight.  The entries are scanned only once "~next" has passed (a reservation expired
# unsettled: its process died, or its call outlived the TTL), and the scan sets "~next" again.
# The hash expires a second after its latest reservation would, entries and sums together.
# Reservations of older versions (one hash per counter, "r:", entries only) are still summed
# and pruned entry by entry; this version writes none.
_LUA_HELD = """
local Q = {'runs', 'model_calls', 'tool_calls', 'tokens', 'cost'}
local S = {'~runs', '~model_calls', '~tool_calls', '~tokens', '~cost'}
local function parse(v)  -- 'a,b,c,d,e,expires_at' -> its numbers
  local p = {}
  for x in string.gmatch(v, '[^,]+') do p[#p + 1] = tonumber(x) end
  return p
end
local function int(x) return string.format('%.0f', x) end
-- rewrite a held hash's sums (and drop the expired entries) from its entries: the rare path
local function recount(hk, now)
  local all = redis.call('HGETALL', hk)
  local sums = {0, 0, 0, 0, 0}
  local nxt = nil
  local live = 0
  for j = 1, #all, 2 do
    local f = all[j]
    if string.sub(f, 1, 1) ~= '~' then
      local p = parse(all[j + 1])
      if p[6] <= now then
        redis.call('HDEL', hk, f)
      else
        live = live + 1
        for q = 1, 5 do sums[q] = sums[q] + p[q] end
        if nxt == nil or p[6] < nxt then nxt = p[6] end
      end
    end
  end
  if live == 0 then
    redis.call('DEL', hk)
  else
    redis.call('HSET', hk, S[1], int(sums[1]), S[2], int(sums[2]), S[3], int(sums[3]),
               S[4], int(sums[4]), S[5], int(sums[5]), '~next', tostring(nxt))
  end
  return sums, nxt
end
-- the index lives as long as its latest counter: with every counter expired and no write
-- since, nothing of it is left (a counter without expiry keeps it)
local function index_ttl(index)
  local top = redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')
  if #top == 0 then return end
  local last = tonumber(top[2])
  if last == math.huge then
    redis.call('PERSIST', index)
  else
    redis.call('EXPIREAT', index, math.ceil(last) + 1)
  end
end
"""

# KEYS: per counter, its hash, its old-format reservations hash, its held hash and its limit
# override's hash; then the index.  ARGV: now, ttl, commit, token, the 5 amounts, then per
# counter: expires_at (-1: never), scope, key, window, bucket, the 5 limits (-1: none).
# Returns the refused counter and quantity (0, 0: none), then per counter the 5 amounts used,
# then per counter the 5 reserved of them, then per counter the 5 limits checked (-1: none).
_LUA_RESERVE = (
    _LUA_HELD
    + """
local now = tonumber(ARGV[1]); local ttl = tonumber(ARGV[2])
local commit = ARGV[3] == '1'; local token = ARGV[4]
local amount = {}
for q = 1, 5 do amount[q] = tonumber(ARGV[4 + q]) end
local n = (#KEYS - 1) / 4
local index = KEYS[#KEYS]
local out = {0, 0}
local extra = {}  -- per counter: the reserved amounts, then (after them all) the limits
local lims = {}
local refused = false
local held = {}  -- per counter: {sums, next expiry, this token's earlier amounts or nil}
for i = 1, n do
  local ck, rk, hk = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1]
  local o = 9 + (i - 1) * 10
  local vals = redis.call('HMGET', ck, 'runs', 'model_calls', 'tool_calls', 'tokens', 'cost')
  local over = redis.call('HMGET', KEYS[4 * i], 'runs', 'model_calls', 'tool_calls', 'tokens',
                          'cost')
  local used = {}
  local rsv = {0, 0, 0, 0, 0}
  for q = 1, 5 do used[q] = tonumber(vals[q] or '0') or 0 end
  local res = redis.call('HGETALL', rk)  -- an older version's reservations (none: no key)
  for j = 1, #res, 2 do
    local p = parse(res[j + 1])
    if p[6] <= now then
      redis.call('HDEL', rk, res[j])
    else
      for q = 1, 5 do used[q] = used[q] + p[q]; rsv[q] = rsv[q] + p[q] end
    end
  end
  local h = redis.call('HMGET', hk, S[1], S[2], S[3], S[4], S[5], '~next', token)
  local sums = {}
  for q = 1, 5 do sums[q] = tonumber(h[q] or '0') or 0 end
  local nxt = tonumber(h[6] or '')
  local mine = h[7]
  if nxt ~= nil and nxt <= now then
    sums, nxt = recount(hk, now)
    mine = redis.call('HGET', hk, token)
  end
  -- a retried reserve: its earlier reservation counts in the check (as a recount would),
  -- and the new one replaces it
  held[i] = {sums, nxt, mine and parse(mine) or {0, 0, 0, 0, 0}}
  for q = 1, 5 do
    used[q] = used[q] + sums[q]
    out[#out + 1] = used[q]  -- integer replies: exact to 2^53
    extra[#extra + 1] = rsv[q] + sums[q]
    local lim = tonumber(over[q] or '')  -- an operator's override, else the counter's own
    if lim == nil then lim = tonumber(ARGV[o + 5 + q]) end
    lims[#lims + 1] = lim
  end
  if not refused then
    for q = 1, 5 do
      local lim = lims[#lims - 5 + q]
      if lim >= 0 and amount[q] > 0 and used[q] + amount[q] > lim then
        refused = true; out[1] = i; out[2] = q; break
      end
    end
  end
end
for _, v in ipairs(extra) do out[#out + 1] = v end
for _, v in ipairs(lims) do out[#out + 1] = v end
if refused then return out end
local expires = now + ttl
for i = 1, n do
  local ck, hk = KEYS[4 * i - 3], KEYS[4 * i - 1]
  local o = 9 + (i - 1) * 10
  redis.call('HSET', ck, 'scope', ARGV[o + 2], 'key', ARGV[o + 3], 'window', ARGV[o + 4],
             'bucket', ARGV[o + 5])
  if commit then
    for q = 1, 5 do
      if amount[q] ~= 0 then redis.call('HINCRBY', ck, Q[q], ARGV[4 + q]) end
    end
  else
    local nxt, mine = held[i][2], held[i][3]
    redis.call('HSET', hk, token,
               table.concat({ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]}, ',') .. ','
               .. tostring(expires))
    for q = 1, 5 do  -- integer increments: exact, and no number formatting on the way
      if mine[q] ~= 0 then
        redis.call('HINCRBY', hk, S[q], int(amount[q] - mine[q]))
      elseif amount[q] ~= 0 then
        redis.call('HINCRBY', hk, S[q], ARGV[4 + q])
      end
    end
    if nxt == nil or expires < nxt then redis.call('HSET', hk, '~next', tostring(expires)) end
    local life = math.ceil(ttl) + 1  -- only ever extended: an earlier, longer one stays
    if redis.call('TTL', hk) < life then redis.call('EXPIRE', hk, life) end
  end
  local exp = tonumber(ARGV[o + 1])
  if exp > 0 then
    redis.call('EXPIREAT', ck, math.ceil(exp))
    redis.call('ZADD', index, math.ceil(exp), ck)
  else
    redis.call('ZADD', index, '+inf', ck)
  end
end
local old = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, PRUNE)
if #old > 0 then redis.call('ZREM', index, unpack(old)) end
index_ttl(index)
return out
"""
)

# KEYS: per counter, its hash, its old-format reservations hash and its held hash; then the
# index.  ARGV: token, count (1/0), the 5 amounts, then per counter: expires_at, scope, key,
# window, bucket.
_LUA_SETTLE = (
    _LUA_HELD
    + """
local token = ARGV[1]
local n = (#KEYS - 1) / 3
for i = 1, n do
  local ck, hk = KEYS[3 * i - 2], KEYS[3 * i]
  local o = 7 + (i - 1) * 5
  local entry = redis.call('HGET', hk, token)
  if entry then  -- released: its amounts leave the sums (an expired one was dropped already)
    redis.call('HDEL', hk, token)
    local q = 0
    for x in string.gmatch(entry, '[^,]+') do
      q = q + 1
      if q > 5 then break end
      if x ~= '0' then  -- its negation, as text
        local neg = string.sub(x, 1, 1) == '-' and string.sub(x, 2) or '-' .. x
        redis.call('HINCRBY', hk, S[q], neg)
      end
    end
    -- no live reservation left: the hash goes now, not when its TTL ends (a hash per run
    -- window would otherwise outlive its run by the reservation TTL)
    local kept = 0
    for _, v in ipairs(redis.call('HMGET', hk, S[1], S[2], S[3], S[4], S[5], '~next')) do
      if v then kept = kept + 1 end
    end
    if redis.call('HLEN', hk) <= kept then redis.call('DEL', hk) end
  end
  if ARGV[2] == '1' then
    redis.call('HSET', ck, 'scope', ARGV[o + 2], 'key', ARGV[o + 3], 'window', ARGV[o + 4],
               'bucket', ARGV[o + 5])
    for q = 1, 5 do
      if tonumber(ARGV[2 + q]) ~= 0 then redis.call('HINCRBY', ck, Q[q], ARGV[2 + q]) end
    end
    local exp = tonumber(ARGV[o + 1])
    if exp > 0 then
      redis.call('EXPIREAT', ck, math.ceil(exp))
      redis.call('ZADD', KEYS[#KEYS], math.ceil(exp), ck)
    else
      redis.call('ZADD', KEYS[#KEYS], '+inf', ck)
    end
  end
end
if ARGV[2] == '1' then index_ttl(KEYS[#KEYS]) end
return 1
"""
)

# KEYS: the entry.  ARGV: owner, now, ttl_ms.  Returns {} when claimed, else the entry.
_LUA_CLAIM = """
local e = redis.call('HGETALL', KEYS[1])
if #e > 0 then return e end
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1], 'started_at', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {}
"""

# KEYS: the entry.  ARGV: owner, state, result ('' for none), ttl_ms; state '' releases (a
# claim still running: a recorded outcome is never released).
_LUA_FINISH = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
  redis.call('DEL', KEYS[1]); return 1
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'result', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""


_LUA_SNAPSHOT = """
local Q = {'runs', 'model_calls', 'tool_calls', 'tokens', 'cost'}
local function snapshot(k)  -- an override's limits (false: none) and its other fields
  local v = redis.call('HMGET', k, 'runs', 'model_calls', 'tool_calls', 'tokens', 'cost',
                       'set_at', 'set_by')
  local t, any = {}, false
  for q = 1, 5 do if v[q] then t[Q[q]] = v[q]; any = true end end
  if not any then return false, v end
  return t, v
end
"""

# KEYS: the override's hash, the override index, the change log.  ARGV: now, by, action,
# scope, key, window, changes kept, then per quantity '' (keep), '-' (remove) or the limit.
# Returns the override before and after, as JSON (logged unless both are none).
_LUA_OVERRIDE = (
    _LUA_SNAPSHOT
    + """
local old, raw = snapshot(KEYS[1])
for q = 1, 5 do
  local x = ARGV[7 + q]
  if x == '-' then redis.call('HDEL', KEYS[1], Q[q])
  elseif x ~= '' then redis.call('HSET', KEYS[1], Q[q], x) end
end
local new = snapshot(KEYS[1])
if new then
  redis.call('HSET', KEYS[1], 'scope', ARGV[4], 'key', ARGV[5], 'window', ARGV[6],
             'set_at', ARGV[1], 'set_by', ARGV[2])
  redis.call('SADD', KEYS[2], KEYS[1])
else
  redis.call('DEL', KEYS[1]); redis.call('SREM', KEYS[2], KEYS[1])
end
if old or new then  -- a clear of nothing is no change
  local target = {scope = ARGV[4], key = ARGV[5], window = ARGV[6]}
  redis.call('LPUSH', KEYS[3], cjson.encode({at = ARGV[1], by = ARGV[2], action = ARGV[3],
             target = target, old = old, new = new}))
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[7]) - 1)
end
return {cjson.encode({limits = old, set_at = raw[6], set_by = raw[7]}),
        cjson.encode({limits = new})}
"""
)

# KEYS: the entry, the change log.  ARGV: forget a running entry ('1' / '0'), now, by, the
# key, changes kept.  Returns 'forgotten', 'running' (kept) or 'absent'.
_LUA_FORGET = """
local e = redis.call('HMGET', KEYS[1], 'state', 'owner', 'started_at')
if not e[1] then return 'absent' end
if e[1] == 'running' and ARGV[1] ~= '1' then return 'running' end
redis.call('DEL', KEYS[1])
redis.call('LPUSH', KEYS[2], cjson.encode({at = ARGV[2], by = ARGV[3], action = 'forget_ledger',
           target = {key = ARGV[4]}, old = {state = e[1], owner = e[2] or '',
           started_at = tonumber(e[3] or '0')}, new = false}))
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
return 'forgotten'
"""

# KEYS: a breaker's document.  The server's clock and the document, in one round trip: the
# breakers' time is the server's, whatever the clocks of the hosts that share them.
_LUA_DOC = "return {redis.call('TIME'), redis.call('GET', KEYS[1])}"


def _url_secrets(url: str) -> list[str]:
    """The passwords in a Redis URL (``user:password@``, ``?password=``), to scrub from any
    error text the client library may build from them."""
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
        found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password" and v]
    except ValueError:
        return []
    return [x for s in found for x in {s, unquote(s)} if len(x) >= 3]


class RedisStore(_Backend):
    """The store on a Redis server (Lua scripts for every check-and-change).

    Each budget or ledger call is one ``EVALSHA`` of a script the client has cached (one
    round trip; a server that lost its scripts answers NOSCRIPT, and the script is loaded and
    run again).  Connections come from a blocking pool of ``max_connections`` (``[store]
    max_connections``, default :data:`MAX_CONNECTIONS`; a URL's ``?max_connections=N``
    overrides it): a call waits for a free one up to ``timeout_s``, never "Too many
    connections".  Inside an async run's step (:mod:`loopwarden.store.bridge`) each call is
    made on the store's owner threads with this blocking client (and hiredis) and awaited on
    the loop: measured against ``redis.asyncio`` on the loop (bench/concurrency.py, 200
    concurrent runs), it took 0.6-0.8 s against 1.1-1.5 s, 2.3-2.5 against 2.9-3.2 ms of CPU
    per run, and left the loop lag's p50 at 1.2-1.4 ms against 17-20 ms.
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "loopwarden",
        timeout_s: float = 5.0,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__()
        try:
            import redis
        except ImportError:
            raise ConfigError(
                "a redis:// store needs the redis package: pip install 'loopwarden[redis]'",
                key="store.url",
            ) from None
        self.url = url
        #: this host's wall clock: reservations' expiry, the ledger's start times (tests may
        #: replace it -- then it stands in for the server's clock in the breakers, too)
        self.now = time.time
        self._host_clock = self.now
        self._timeout = timeout_s
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._secrets = _url_secrets(url)
        self._prefix = "{" + namespace + "}:"
        self._index = self._prefix + "cidx"  # sorted by expiry
        self._legacy_index = self._prefix + "counters"  # 0.3's plain set: read, then moved
        self._breaker_index = self._prefix + "bidx"  # breaker documents, scored by expiry
        self._override_index = self._prefix + "oidx"  # limit overrides' hashes
        self._change_log = self._prefix + "changes"  # newest first
        self._watch_error: type[BaseException] = redis.WatchError
        self._noscript: type[BaseException] = redis.exceptions.NoScriptError
        self._doc_sha = hashlib.sha1(_LUA_DOC.encode()).hexdigest()
        try:
            # a blocking pool: more concurrent calls than connections wait for one (up to
            # timeout_s) -- redis-py's plain pool refuses them, and runs stopped
            # store_unavailable under load that the server would have answered in time
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=timeout_s,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
            )
            self._r = redis.Redis(connection_pool=pool)
            self._lua_reserve = self._r.register_script(
                _LUA_RESERVE.replace("PRUNE", str(PRUNE_BATCH))
            )
            self._lua_settle = self._r.register_script(_LUA_SETTLE)
            self._lua_claim = self._r.register_script(_LUA_CLAIM)
            self._lua_finish = self._r.register_script(_LUA_FINISH)
            self._lua_override = self._r.register_script(_LUA_OVERRIDE)
            self._lua_forget = self._r.register_script(_LUA_FORGET)
        except (ValueError, *self._errors) as exc:
            raise StoreError(
                f"cannot use the Redis store {redact_url(url)}: {self._scrub(exc)}",
                url=redact_url(url),
            ) from exc

    def _scrub(self, exc: BaseException) -> str:
        text = str(exc)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextmanager
    def _errors_as_store_error(self) -> Iterator[None]:
        try:
            yield
        except self._errors as exc:
            raise StoreError(
                f"Redis store {redact_url(self.url)}: {self._scrub(exc)}",
                url=redact_url(self.url),
            ) from exc

    def _keys(self, c: Counter) -> tuple[str, str, str]:
        """A counter's hash, its reservations of older versions, and its held hash."""
        ident = "\x1f".join(_ident(c))
        return (
            self._prefix + "c:" + ident,
            self._prefix + "r:" + ident,
            self._prefix + "h:" + ident,
        )

    def _reserve(
        self,
        counters: Sequence[Counter],
        amount: Sequence[int],
        token: str,
        ttl_s: float,
        commit: bool,
    ) -> Reserved:
        keys: list[str] = []
        args: list[Any] = [
            repr(self.now()),
            repr(float(ttl_s)),
            "1" if commit else "0",
            token,
            *(int(a) for a in amount),
        ]
        for c in counters:
            keys.extend(self._keys(c))
            keys.append(self._override_key(c.scope, c.key, c.window))
            args.extend(
                [
                    repr(c.expires_at) if c.expires_at is not None else "-1",
                    *_ident(c),
                    *(-1 if lim is None else int(lim) for lim in c.limits),
                ]
            )
        keys.append(self._index)
        with self._errors_as_store_error():
            out = self._lua_reserve(keys=keys, args=args)
        nums = [int(x) for x in out]
        n, width = len(counters), len(QUANTITIES)

        def part(k: int, i: int) -> list[int]:  # block k (used, reserved, limits), counter i
            start = 2 + width * (k * n + i)
            return nums[start : start + width]

        used = tuple(_amounts(part(0, i)) for i in range(n))
        reserved = tuple(_amounts(part(1, i)) for i in range(n))
        limits = tuple(tuple(None if v < 0 else v for v in part(2, i)) for i in range(n))
        refused = (nums[0] - 1, nums[1] - 1) if nums[0] else None
        return Reserved(used, refused, reserved, limits)

    def _settle(
        self, counters: Sequence[Counter], token: str, actual: Sequence[int] | None
    ) -> None:
        keys: list[str] = []
        args: list[Any] = [
            token,
            "1" if actual is not None else "0",
            *(int(a) for a in (actual or (0,) * len(QUANTITIES))),
        ]
        for c in counters:
            keys.extend(self._keys(c))
            args.extend([repr(c.expires_at) if c.expires_at is not None else "-1", *_ident(c)])
        keys.append(self._index)
        with self._errors_as_store_error():
            self._lua_settle(keys=keys, args=args)

    def _migrate_legacy_index(self) -> None:
        """Move the members of 0.3's plain index set into the sorted index (scored by their
        hash's expiry), then drop the set: old counters stay listed, and are pruned too."""
        legacy: list[bytes] = [
            n if isinstance(n, bytes) else str(n).encode()
            for n in self._r.smembers(self._legacy_index)
        ]
        if not legacy:
            return
        pipe = self._r.pipeline(transaction=False)
        for name in legacy:
            pipe.ttl(name)
        ttls = pipe.execute()
        now = self.now()
        scores = {  # TTL -1: no expiry; -2: gone (pruned as any expired member)
            n: float("inf") if t == -1 else now + t for n, t in zip(legacy, ttls, strict=True)
        }
        self._r.zadd(self._index, scores, nx=True)
        self._r.srem(self._legacy_index, *legacy)

    def _rows(self) -> list[CounterRow]:
        now = self.now()
        out: list[CounterRow] = []
        with self._errors_as_store_error():
            self._migrate_legacy_index()
            names = sorted(
                n if isinstance(n, bytes) else str(n).encode()
                for n in self._r.zrange(self._index, 0, -1)
            )
            pipe = self._r.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
                pipe.hgetall(name.replace(b"}:c:", b"}:r:", 1))
                pipe.hgetall(name.replace(b"}:c:", b"}:h:", 1))
                pipe.ttl(name)
            got = pipe.execute()
            gone = []
            for n, name in enumerate(names):
                h, old, held, exp = got[4 * n : 4 * n + 4]
                if not h:
                    gone.append(name)
                    continue
                reserved = [0] * len(QUANTITIES)
                entries = [v for f, v in held.items() if not f.startswith(b"~")]
                for value in [*old.values(), *entries]:  # the live ones: the sums may lag
                    parts = value.decode().split(",")
                    if float(parts[5]) > now:
                        for q in range(len(QUANTITIES)):
                            reserved[q] += int(parts[q])
                d = {k.decode(): v.decode() for k, v in h.items()}
                expires = float(round(now + exp)) if exp > 0 else None
                out.append(
                    CounterRow(
                        d["scope"],
                        d["key"],
                        d["window"],
                        d["bucket"],
                        _amounts([d.get(q, 0) for q in QUANTITIES]),
                        _amounts(reserved),
                        expires,
                    )
                )
            if gone:
                self._r.zrem(self._index, *gone)
        out.sort(key=lambda r: (r.scope, r.key, r.window, r.bucket))
        return out

    def _reset(self, scope: str, key: str) -> int:
        n = 0
        for row in self._rows():
            if row.scope == scope and row.key == key:
                c = Counter(row.scope, row.key, row.window, row.bucket)
                ck, rk, hk = self._keys(c)
                with self._errors_as_store_error():
                    self._r.delete(ck, rk, hk)
                    self._r.zrem(self._index, ck)
                n += 1
        return n

    def _entry_key(self, key: str) -> str:
        return self._prefix + "l:" + key

    def _claim(self, key: str, owner: str, ttl_s: float) -> LedgerEntry | None:
        with self._errors_as_store_error():
            out = self._lua_claim(
                keys=[self._entry_key(key)],
                args=[owner, repr(self.now()), max(1, int(ttl_s * 1000))],
            )
        if not out:
            return None
        d = {
            out[i].decode(errors="replace"): out[i + 1].decode(errors="replace")
            for i in range(0, len(out) - 1, 2)
        }
        return _entry(
            key, d.get("state", ""), d.get("owner", ""), d.get("started_at"), d.get("result")
        )

    def _finish(
        self,
        key: str,
        owner: str,
        state: LedgerState,
        result: Mapping[str, Any] | None,
        ttl_s: float,
    ) -> None:
        text = json.dumps(result, ensure_ascii=False) if result is not None else ""
        with self._errors_as_store_error():
            self._lua_finish(
                keys=[self._entry_key(key)], args=[owner, state, text, max(1, int(ttl_s * 1000))]
            )

    def _release(self, key: str, owner: str) -> None:
        with self._errors_as_store_error():
            self._lua_finish(keys=[self._entry_key(key)], args=[owner, "", "", 1])

    # -- circuit breakers ------------------------------------------------------------------

    def _breaker_key(self, key: str) -> str:
        return self._prefix + "b:" + key

    @staticmethod
    def _parse_doc(raw: Any) -> dict[str, Any] | None:
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None  # unreadable: starts afresh (a breaker fails open)
        return doc if isinstance(doc, dict) else None

    def _update_doc(self, key: str, fn: _DocUpdate) -> BreakerView:
        # an optimistic transaction: WATCH the document, read it, decide; only a change is
        # written, in MULTI / EXEC -- which fails (and is tried again) when another client
        # wrote the document in between.  A closed breaker's admit is one read.
        name = self._breaker_key(key)
        deadline = time.monotonic() + self._timeout
        delay, tries = BREAKER_RETRY_S[0], 0
        with self._errors_as_store_error(), self._r.pipeline() as pipe:
            while True:
                tries += 1
                try:
                    pipe.watch(name)  # type: ignore[no-untyped-call]
                    now, raw = self._doc_and_time(pipe, name)
                    new, out = fn(self._parse_doc(raw), now)
                    if new is None:
                        pipe.unwatch()
                        return out
                    expires = float(new.get("expires_at") or now + 1)
                    pipe.multi()
                    # relative: the server's clock may differ from this host's
                    pipe.set(name, json.dumps(new), px=max(1, math.ceil((expires - now) * 1000)))
                    pipe.zadd(self._breaker_index, {name: expires})
                    # breakers nobody touched for keep_s: their documents expired already
                    pipe.zremrangebyscore(self._breaker_index, "-inf", now)
                    pipe.execute()
                    return out
                except self._watch_error:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    time.sleep(min(delay * (0.5 + random.random()), left))
                    delay = min(delay * 2, BREAKER_RETRY_S[1])
        raise StoreError(
            f"Redis store {redact_url(self.url)}: breaker {key!r} was changed by others "
            f"{tries} times in a row ({self._timeout:g} s)",
            url=redact_url(self.url),
        )

    def _doc_and_time(self, pipe: Any, name: str) -> tuple[float, Any]:
        """A breaker's document and the server's clock, in one round trip (a read-only
        script, on the watching connection): every host reads the same time."""
        try:
            (sec, usec), raw = pipe.evalsha(self._doc_sha, 1, name)
        except self._noscript:  # a server that lost its scripts (restarted, flushed)
            self._doc_sha = pipe.script_load(_LUA_DOC)
            (sec, usec), raw = pipe.evalsha(self._doc_sha, 1, name)
        if self.now is not self._host_clock:  # a test's clock stands in for the server's
            return self.now(), raw
        return int(sec) + int(usec) / 1e6, raw

    def _shared_now(self) -> float:
        if self.now is not self._host_clock:
            return self.now()
        with self._errors_as_store_error():
            sec, usec = self._r.time()
        return int(sec) + int(usec) / 1e6

    def _docs(self) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        with self._errors_as_store_error():
            self._r.zremrangebyscore(self._breaker_index, "-inf", self._shared_now())
            names: list[bytes] = sorted(
                n if isinstance(n, bytes) else str(n).encode()
                for n in self._r.zrange(self._breaker_index, 0, -1)
            )
            values = self._r.mget(names) if names else []
        cut = len(self._prefix + "b:")
        for name, raw in zip(names, values, strict=True):
            doc = self._parse_doc(raw)
            if doc is not None:
                out.append((name.decode()[cut:], doc))
        return out

    def _drop_doc(self, key: str) -> bool:
        name = self._breaker_key(key)
        with self._errors_as_store_error():
            self._r.zrem(self._breaker_index, name)
            return bool(self._r.delete(name))

    # -- operations --------------------------------------------------------------------------

    def _override_key(self, scope: str, key: str, window: str) -> str:
        return self._prefix + "o:" + "\x1f".join((scope, key, window))

    def _overrides(self) -> list[LimitOverride]:
        out: list[LimitOverride] = []
        with self._errors_as_store_error():
            names = sorted(self._r.smembers(self._override_index))
            pipe = self._r.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
            for h in pipe.execute():
                d = {k.decode(): v.decode() for k, v in h.items()}
                if "scope" not in d:
                    continue  # removed meanwhile
                limits = tuple(int(d[q]) if q in d else None for q in QUANTITIES)
                out.append(
                    LimitOverride(
                        d["scope"],
                        d["key"],
                        d["window"],
                        limits,
                        float(d.get("set_at") or 0),
                        d.get("set_by", ""),
                    )
                )
        return out

    def _set_override(
        self,
        target: tuple[str, str, str],
        updates: Mapping[int, int | None],
        by: str,
        action: str,
        now: float,
    ) -> tuple[LimitOverride | None, LimitOverride | None]:
        values = [
            "" if q not in updates else "-" if updates[q] is None else str(updates[q])
            for q in range(len(QUANTITIES))
        ]
        with self._errors_as_store_error():
            old_json, new_json = self._lua_override(
                keys=[self._override_key(*target), self._override_index, self._change_log],
                args=[repr(now), by, action, *target, CHANGES_KEPT, *values],
            )
        old, new = json.loads(old_json), json.loads(new_json)

        def override(limits: Any, set_at: float, set_by: str) -> LimitOverride | None:
            lt = limits_tuple(limits or None)
            return None if lt is None else LimitOverride(*target, lt, set_at, set_by)

        return (
            override(old["limits"], float(old.get("set_at") or 0), str(old.get("set_by") or "")),
            override(new["limits"], now, by),
        )

    def _log(self, change: Change) -> None:
        record = json.dumps(change.as_dict(), ensure_ascii=False)
        with self._errors_as_store_error():
            pipe = self._r.pipeline(transaction=True)
            pipe.lpush(self._change_log, record)
            pipe.ltrim(self._change_log, 0, CHANGES_KEPT - 1)
            pipe.execute()

    def _changes(self, limit: int) -> list[Change]:
        with self._errors_as_store_error():
            raw = self._r.lrange(self._change_log, 0, max(0, limit - 1))
        out = []
        for item in raw:
            try:
                d = json.loads(item)
                out.append(
                    Change(
                        float(d["at"]),
                        str(d["by"]),
                        str(d["action"]),
                        dict(d.get("target") or {}),
                        d.get("old") or None,  # cjson writes an absent value as false
                        d.get("new") or None,
                    )
                )
            except (ValueError, KeyError, TypeError):
                log.warning("Redis store: an unreadable change log entry was skipped")
        return out

    def _ledger_rows(self) -> list[LedgerRow]:
        head = self._prefix + "l:"
        pattern = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in head) + "*"
        now = self.now()
        out = []
        with self._errors_as_store_error():
            names = list(self._r.scan_iter(match=pattern, count=500))
            pipe = self._r.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(name)
                pipe.pttl(name)
            got = pipe.execute()
        for n, name in enumerate(names):
            h, ttl = got[2 * n], got[2 * n + 1]
            if not h:
                continue  # gone meanwhile
            d = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in h.items()}
            key = name.decode(errors="replace")[len(head) :]
            e = _entry(
                key, d.get("state", ""), d.get("owner", ""), d.get("started_at"), d.get("result")
            )
            expires = now + ttl / 1000 if ttl is not None and ttl >= 0 else None
            out.append(LedgerRow(key, e.state, e.owner, e.started_at, expires, e.result, e.corrupt))
        return out

    def _forget(self, key: str, by: str, running: bool, now: float) -> str:
        with self._errors_as_store_error():
            out = self._lua_forget(
                keys=[self._entry_key(key), self._change_log],
                args=["1" if running else "0", repr(now), by, key, CHANGES_KEPT],
            )
        return out.decode() if isinstance(out, bytes) else str(out)

    def close(self) -> None:
        """Drop the expired members of the counter and breaker indexes (one command each,
        however many: a store that is no longer written keeps no expired member of this
        process's making), then close."""
        try:
            shared = self._shared_now()  # the breakers' index is scored in the server's time
            pipe = self._r.pipeline(transaction=False)
            pipe.zremrangebyscore(self._index, "-inf", self.now())
            pipe.zremrangebyscore(self._breaker_index, "-inf", shared)
            pipe.execute()
        except StoreError as exc:  # down: closing goes on, the members wait
            log.warning("Redis store: pruning at close failed: %s", exc)
        except self._errors as exc:
            log.warning(
                "Redis store %s: pruning at close failed: %s",
                redact_url(self.url),
                self._scrub(exc),
            )
        self._close_owner()
        self._r.close()
