"""Many model calls in flight on one counter: every live reservation counts exactly once, on a
real SQLite file and a real redis-server; on Redis, a reserve reads the sums kept beside the
reservations instead of every reservation (its work does not grow with the calls in flight)."""

from __future__ import annotations

import random

import pytest
from support.stores import make_store, split_url

from loopwarden.store import QUANTITIES, Counter, RedisStore

TOKENS = QUANTITIES.index("tokens")


def counter(tokens: int | None = None) -> Counter:
    return Counter("tenant", "acme", "day", "2026-12-01", (None, None, None, tokens, None))


def call(tokens: int) -> tuple[int, int, int, int, int]:
    return (0, 1, 0, tokens, 0)


def test_a_retried_reserve_replaces_its_reservation(store_url: str) -> None:
    store = make_store(store_url)
    c = counter(tokens=1000)
    assert store.reserve([c], call(400), token="t", ttl_s=60).ok
    # the same call asked again: the check still counts the first (400 + 700 > 1000) ...
    assert not store.reserve([c], call(700), token="t", ttl_s=60).ok
    assert store.reserve([c], call(500), token="t", ttl_s=60).ok
    assert store.rows()[0].reserved == (0, 1, 0, 500, 0)  # ... and the second replaces it
    assert store.reserve([c], call(500), token="u", ttl_s=60).ok  # 500 + 500: at the limit
    assert not store.reserve([c], call(1), token="v", ttl_s=60).ok
    store.settle([c], "t", None)
    store.settle([c], "u", None)
    assert store.rows()[0].reserved == (0, 0, 0, 0, 0)
    assert store.reserve([c], call(1000), token="w", ttl_s=60).ok
    store.close()


def test_hundreds_in_flight_settled_released_and_expired_count_exactly(store_url: str) -> None:
    """300 reservations of assorted sizes and TTLs, then settles, releases and expiries in a
    shuffled order: after each wave, the store's view equals a recount of what is live."""
    store = make_store(store_url)
    now = [2_000_000.0]
    store.now = lambda: now[0]  # type: ignore[method-assign]
    rng = random.Random(23)
    c = counter()
    live: dict[str, tuple[int, float]] = {}  # token -> (tokens, expires_at)
    size: dict[str, int] = {}
    committed = 0
    for i in range(300):
        tokens, ttl = rng.randint(1, 5000), rng.choice((10.0, 60.0, 600.0))
        assert store.reserve([c], call(tokens), token=f"t{i}", ttl_s=ttl).ok
        live[f"t{i}"] = (tokens, now[0] + ttl)
        size[f"t{i}"] = tokens
        now[0] += 0.01
    tokens_live = sorted(live)
    rng.shuffle(tokens_live)
    for wave in range(3):
        for token in tokens_live[wave * 60 : wave * 60 + 40]:  # settled with their usage
            used = size[token] // 2  # one that expired meanwhile still counts its usage
            store.settle([c], token, call(used))
            live.pop(token, None)
            committed += used
        for token in tokens_live[wave * 60 + 40 : wave * 60 + 60]:  # released: not counted
            store.settle([c], token, None)
            live.pop(token, None)
        now[0] += (10.0, 55.0, 100.0)[wave]  # some die unsettled: their TTL passes
        live = {t: v for t, v in live.items() if v[1] > now[0]}
        expected = sum(v[0] for v in live.values())
        row = store.rows()[0]
        assert row.reserved[TOKENS] == expected, wave
        assert row.committed[TOKENS] == committed
        # the limit is exact: what is live plus committed, and not one token more
        room = 10_000_000 - expected - committed
        tight = Counter(c.scope, c.key, c.window, c.bucket, (None, None, None, 10_000_000, None))
        assert not store.reserve([tight], call(room + 1), token="probe", ttl_s=1).ok
        assert store.reserve([tight], call(room), token="probe", ttl_s=1).ok
        store.settle([tight], "probe", None)
    store.close()


def test_large_reservations_held_together_stay_exact(store_url: str) -> None:
    store = make_store(store_url)
    big = 10**15 + 7  # past Lua's 14-digit number formatting; two of them: past 2^51
    c = Counter("tenant", "acme", "month", "2026-12", (None,) * 5)
    for token in ("a", "b"):
        assert store.reserve([c], (0, 0, 0, 0, big), token=token, ttl_s=60).ok
    res = store.reserve([c], (0, 0, 0, 0, 1), token="c", ttl_s=60)
    assert res.used[0][QUANTITIES.index("cost")] == 2 * big
    store.settle([c], "a", None)
    assert store.rows()[0].reserved[QUANTITIES.index("cost")] == big + 1
    store.close()


# -- Redis: how the live reservations are kept --------------------------------------------------


def _redis(store_url: str) -> tuple[RedisStore, str]:
    store = make_store(store_url)
    assert isinstance(store, RedisStore)
    return store, "{" + split_url(store_url)[1] + "}:"


@pytest.mark.parametrize("store_url", ["redis"], indirect=True)
def test_redis_keeps_the_sums_of_live_reservations_beside_them(store_url: str) -> None:
    """A reserve reads the held hash's sums (one HMGET), not each reservation: the sums are
    written in the same script as the entries, and recounted once the earliest expiry passed."""
    store, prefix = _redis(store_url)
    now = [3_000_000.0]
    store.now = lambda: now[0]  # type: ignore[method-assign]
    c = counter()
    for i in range(50):
        store.reserve([c], call(100 + i), token=f"t{i}", ttl_s=30.0 if i < 10 else 300.0)
    held = store._keys(c)[2]
    assert held.startswith(prefix + "h:")
    sums = store._r.hmget(held, ["~model_calls", "~tokens", "~next"])
    assert [int(sums[0]), int(sums[1])] == [50, sum(100 + i for i in range(50))]
    assert float(sums[2]) == pytest.approx(3_000_030.0)
    for i in range(10, 20):
        store.settle([c], f"t{i}", call(1))
    assert int(store._r.hget(held, "~tokens")) == sum(100 + i for i in range(50)) - sum(
        100 + i for i in range(10, 20)
    )
    now[0] += 31  # the ten short ones expire unsettled: the next reserve recounts
    assert store.reserve([c], call(5), token="late", ttl_s=300.0).ok
    live = sum(100 + i for i in range(20, 50)) + 5
    assert int(store._r.hget(held, "~tokens")) == live
    assert int(store._r.hget(held, "~model_calls")) == 31
    assert float(store._r.hget(held, "~next")) == pytest.approx(3_000_300.0)
    assert store._r.hlen(held) == 31 + 6  # the live entries, five sums and the next expiry
    store.close()


@pytest.mark.parametrize("store_url", ["redis"], indirect=True)
def test_redis_still_counts_reservations_an_older_version_wrote(store_url: str) -> None:
    """A process of an older version keeps its reservations in the ``r:`` hash, entries
    only: they still count and are listed while live, and expired ones are dropped."""
    store, _ = _redis(store_url)
    now = [4_000_000.0]
    store.now = lambda: now[0]  # type: ignore[method-assign]
    c = counter(tokens=1000)
    old = store._keys(c)[1]
    store._r.hset(old, mapping={"old-live": "0,1,0,600,0,4000100", "old-dead": "0,1,0,900,0,1"})
    assert store.reserve([c], call(400), token="new", ttl_s=600).ok
    assert not store.reserve([c], call(1), token="more", ttl_s=60).ok  # 600 + 400
    assert store.rows()[0].reserved == (0, 2, 0, 1000, 0)
    assert store._r.hkeys(old) == [b"old-live"]
    now[0] += 101  # the old one's expiry passed
    assert store.reserve([c], call(600), token="more", ttl_s=60).ok
    assert store.rows()[0].reserved == (0, 2, 0, 1000, 0)
    store.close()


@pytest.mark.parametrize("store_url", ["redis"], indirect=True)
def test_redis_reset_deletes_the_held_reservations_too(store_url: str) -> None:
    store, _ = _redis(store_url)
    c = counter(tokens=1000)
    store.reserve([c], (1, 0, 0, 0, 0), token="r", ttl_s=1, commit=True)
    assert store.reserve([c], call(900), token="a", ttl_s=60).ok
    assert store.reset("tenant", "acme") == 1
    assert store._r.exists(*store._keys(c)) == 0
    assert store.reserve([c], call(1000), token="b", ttl_s=60).ok  # nothing held any more
    store.close()
