"""Context windows of known models, so that context limits follow the model.

``[model] context_window`` (tokens) wins; otherwise the window comes from the maintained
``genai-prices`` package (:mod:`loopwarden.models.catalog`, offline, imported only when
needed; ``[model] base_url`` helps it pick the provider); otherwise from this table, matched
on the model name -- exactly, then by the longest known prefix (``gpt-4o-2024-08-06`` is a
``gpt-4o``), after dropping a provider prefix (``openai/gpt-4o``).  The table stays for what
the package does not carry: open-weight models as vLLM or Ollama serve them, Qwen on
DashScope, Moonshot, GLM, and the offline ``scripted`` player.  A model neither knows gets
:data:`CONSERVATIVE_WINDOW`, and the deployment logs a warning naming ``[model]
context_window`` at start-up.  Windows are the providers' published input + output context
sizes.
"""

from __future__ import annotations

__all__ = ["CONSERVATIVE_WINDOW", "KNOWN_CONTEXT_WINDOWS", "context_window", "known_window"]

#: the window assumed for a model this table does not know: one that current chat models
#: (self-hosted 7B models included) meet, so a limit derived from it never passes the real one
CONSERVATIVE_WINDOW = 32_768

#: model name (or name prefix) -> context window in tokens
KNOWN_CONTEXT_WINDOWS: dict[str, int] = {
    # OpenAI
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1-mini": 128_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    # DeepSeek, Qwen (DashScope), Moonshot, GLM
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "deepseek-v3": 128_000,
    "deepseek-r1": 128_000,
    "qwen-max": 32_768,
    "qwen-plus": 131_072,
    "qwen-turbo": 1_000_000,
    "qwen-long": 10_000_000,
    "qwen3": 131_072,
    "qwen2.5": 32_768,
    "moonshot-v1-8k": 8_192,
    "moonshot-v1-32k": 32_768,
    "moonshot-v1-128k": 131_072,
    "kimi-k2": 131_072,
    "glm-4": 128_000,
    # Anthropic and Google through OpenAI-compatible endpoints
    "claude": 200_000,
    "gemini-1.5": 1_048_576,
    "gemini-2": 1_048_576,
    # open-weight families as commonly served (vLLM, Ollama)
    "llama-3.1": 131_072,
    "llama-3.2": 131_072,
    "llama-3.3": 131_072,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "mistral-large": 131_072,
    "mistral-small": 32_768,
    # the offline scenario player stands in for gpt-4o-mini
    "scripted": 128_000,
}

_BY_LENGTH = sorted(KNOWN_CONTEXT_WINDOWS, key=len, reverse=True)


def known_window(model: str | None) -> int | None:
    """The table's window for ``model``, or None when the table does not know it."""
    if not model:
        return None
    name = model.strip().casefold()
    if "/" in name:  # "openai/gpt-4o", "Qwen/Qwen2.5-7B-Instruct"
        name = name.rsplit("/", 1)[1]
    exact = KNOWN_CONTEXT_WINDOWS.get(name)
    if exact is not None:
        return exact
    for prefix in _BY_LENGTH:
        if name.startswith(prefix) and (
            len(name) == len(prefix) or not name[len(prefix)].isalnum()
        ):
            return KNOWN_CONTEXT_WINDOWS[prefix]
    return None


def context_window(
    model: str | None, declared: int | None = None, base_url: str | None = None
) -> tuple[int, str]:
    """The context window for ``model`` and where it came from.

    ``declared`` (``[model] context_window``) wins; then the ``genai-prices`` package (source
    ``"genai-prices"``); then the table (``"known models"``); then
    :data:`CONSERVATIVE_WINDOW`, with the source ``"default"``.
    """
    if declared is not None:
        return declared, "model.context_window"
    if model:
        from loopwarden.models.catalog import package_window

        window = package_window(model, base_url)
        if window is not None:
            return window, "genai-prices"
    known = known_window(model)
    if known is not None:
        return known, "known models"
    return CONSERVATIVE_WINDOW, "default"
