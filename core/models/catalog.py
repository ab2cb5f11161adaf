"""Prices and context windows of public models, from the maintained ``genai-prices`` package.

``genai-prices`` (PyPI) ships a snapshot of the providers' published prices and context
windows; this module asks it offline -- never its update or network functions -- and only
when a price or window is needed: the package (its data is a 1.5 MB module) is imported
lazily, never by ``import loopwarden``.

A model is looked up by name, with the provider's ``base_url`` (``[model] base_url``) as a
hint when one is known: the hint is tried first and dropped when the package does not know
that URL or that model there (a local vLLM, a proxy), so a wrong guess never fails a run --
a name the package does not know at all is simply unknown (None).  A provider-prefixed name
(``openai/gpt-4.1-mini``) is also tried as model ``gpt-4.1-mini`` of provider ``openai``.
Prices are in USD per the package.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genai_prices.types import PriceCalculation

__all__ = ["CURRENCY", "PackagePrice", "package_price", "package_window"]

log = logging.getLogger("loopwarden.models.catalog")

#: the currency of every price the package gives
CURRENCY = "USD"


def _calc(
    model: str, prompt: int, completion: int, cached: int, provider: tuple[str, str] | None
) -> PriceCalculation:
    """The package's price of one usage; ``provider`` is ("id" | "url", value) or None."""
    from genai_prices import Usage, calc_price

    usage = Usage(input_tokens=prompt, output_tokens=completion, cache_read_tokens=cached)
    if provider is None:
        return calc_price(usage, model)
    kind, value = provider
    if kind == "url":
        return calc_price(usage, model, provider_api_url=value)
    return calc_price(usage, model, provider_id=value)


def _attempts(model: str, base_url: str | None) -> list[tuple[str, tuple[str, str] | None]]:
    """The lookups to try, most specific first."""
    tries: list[tuple[str, tuple[str, str] | None]] = []
    if base_url:
        tries.append((model, ("url", base_url)))
    tries.append((model, None))
    if "/" in model:
        prefix, _, rest = model.partition("/")
        if prefix and rest:
            tries.append((rest, ("id", prefix)))
    return tries


@dataclass(frozen=True, slots=True)
class PackagePrice:
    """A model as ``genai-prices`` prices it: the lookup that found it, its window."""

    model: str  #: the name given to the package
    provider: tuple[str, str] | None  #: the provider hint that found it
    provider_id: str  #: the package's provider id
    model_id: str  #: the package's model id
    context_window: int | None

    def cost(self, prompt: int, completion: int, cached: int = 0) -> Decimal:
        """The price of one call's usage, in USD (the package's prices at this moment)."""
        cached = max(0, min(cached, prompt))
        return _calc(self.model, prompt, completion, cached, self.provider).total_price

    def describe(self) -> dict[str, Any]:
        """What the run's evidence says about this price (per million tokens, now)."""
        mp = _calc(self.model, 0, 0, 0, self.provider).model_price
        out: dict[str, Any] = {
            "source": "genai-prices",
            "provider": self.provider_id,
            "model": self.model_id,
        }
        for key, attr in (
            ("input", "input_mtok"),
            ("cached_input", "cache_read_mtok"),
            ("output", "output_mtok"),
        ):
            value = getattr(mp, attr, None)
            if isinstance(value, Decimal):
                out[key] = value
        return out


@functools.lru_cache(maxsize=256)
def package_price(model: str | None, base_url: str | None = None) -> PackagePrice | None:
    """The package's price of ``model`` (None: the package does not know it, or is broken).

    Cached per (model, base_url): a deployment looks a model up once, not per call.
    """
    if not model or not model.strip():
        return None
    for name, provider in _attempts(model.strip(), base_url):
        try:
            calc = _calc(name, 0, 0, 0, provider)
        except LookupError:
            continue
        except Exception as exc:  # a package bug, a data change: unknown, never a crash
            log.debug("genai-prices failed for model %r: %r", name, exc)
            continue
        window = getattr(calc.model, "context_window", None)
        return PackagePrice(
            model=name,
            provider=provider,
            provider_id=str(calc.provider.id),
            model_id=str(calc.model.id),
            context_window=window if isinstance(window, int) and window > 0 else None,
        )
    return None


def package_window(model: str | None, base_url: str | None = None) -> int | None:
    """The package's context window of ``model`` in tokens, or None."""
    found = package_price(model, base_url)
    return found.context_window if found is not None else None
