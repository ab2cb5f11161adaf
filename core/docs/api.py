"""docs/api.md: the reference of the objects hooks receive and plugin authors use, generated
from the code -- signatures, dataclass fields (type, default, the ``#:`` comment above each
field), properties and public methods (their docstring's first paragraph).

The page is a list of sections, each a list of objects (:data:`SECTIONS`); an attribute with
no ``#:`` comment and no docstring renders with an empty description, which the test suite
refuses for the listed classes.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any

__all__ = ["Member", "members", "render_api"]

#: (section title, module, object names) in page order; every public name of ``loopwarden``,
#: ``loopwarden.plugin`` and ``loopwarden.testing`` has a section (tests/test_docs_api.py)
SECTIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Hook payloads",
        "loopwarden.events",
        (
            "ToolCall",
            "ToolResult",
            "RetryPlan",
            "ModelRequest",
            "ModelResponse",
            "ProposedCall",
            "Usage",
        ),
    ),
    (
        "The run",
        "loopwarden.run",
        ("Run", "RunOutcome", "Conversation", "Limits", "DeploymentView"),
    ),
    (
        "Verdicts",
        "loopwarden.verdicts",
        ("warn", "skip", "stop", "Warn", "Skip", "Stop", "Verdict"),
    ),
    (
        "Plugins",
        "loopwarden.plugin",
        ("Plugin", "PluginSettings", "NoSettings", "check_templates", "check_patterns"),
    ),
    ("Settings value types", "loopwarden.plugin", ("TypedTable",)),
    ("Hook markers", "loopwarden.hookspecs", ("hookimpl", "hookspec")),
    ("Tools (docs/tools.md)", "loopwarden.tools", ("tool", "Tool", "ToolRegistry", "ToolContext")),
    ("Typed per-run state", "loopwarden.stash", ("StashKey", "Stash")),
    ("Notes", "loopwarden.notes", ("render_note", "instruction_text", "runtime", "tool_name")),
    (
        "Streaming",
        "loopwarden.engine.streaming",
        (
            "TextDelta",
            "ToolCallProposed",
            "ToolCallExecuted",
            "ToolCallSkipped",
            "VerdictIssued",
            "ResponseCut",
            "RunEnd",
            "ModelDelta",
        ),
    ),
    ("The deployment", "loopwarden.deployment", ("Deployment",)),
    ("The client wrapper (docs/gateway.md)", "loopwarden.gateway.wrap", ("wrap", "run")),
    ("Configuration", "loopwarden.config", ("load_config", "Config")),
    (
        "Clocks and cancelling",
        "loopwarden.clock",
        ("Clock", "SystemClock", "FakeClock", "CancelToken"),
    ),
    (
        "Exceptions",
        "loopwarden.exceptions",
        (
            "LoopwardenError",
            "ConfigError",
            "PluginLoadError",
            "ModelError",
            "ScenarioError",
            "ToolError",
            "ToolDefinitionError",
        ),
    ),
    (
        "The testing kit",
        "loopwarden.testing",
        (
            "run_plugin",
            "PluginRun",
            "VerdictRecord",
            "call_hook",
            "make_run",
            "make_tool_call",
            "make_tool_result",
            "make_request",
            "make_response",
            "make_outcome",
            "make_tool",
            "make_deployment",
            "script",
            "tool_call",
            "turn",
            "ScriptedModel",
            "HookRecorder",
            "HookCall",
            "SignalRecorder",
            "SignalRecord",
        ),
    ),
    (
        "pytest fixtures",
        "loopwarden.testing.fixtures",
        ("lw_clock", "lw_signals", "lw_hooks", "lw_deployment"),
    ),
)

#: what the markers and aliases are, which carry no docstring of their own
NOTES: dict[str, tuple[str, str]] = {
    "hookimpl": (
        "def hookimpl(function=None, *, tryfirst=False, trylast=False, optionalhook=False, "
        "hookwrapper=False, wrapper=False, specname=None): ...",
        "Marks a plugin's method (or a module's function) as the implementation of the hook "
        'of the same name -- pluggy\'s `HookimplMarker("loopwarden")`.  A hook-named method '
        "without it, a misspelled hook, an `async def` hook, or a `tryfirst` / `trylast` "
        "that would break the configured order fails at start-up, naming the plugin.",
    ),
    "hookspec": (
        "def hookspec(function=None, *, firstresult=False, historic=False, "
        "warn_on_impl=None, warn_on_impl_args=None): ...",
        'Marks a hook specification -- pluggy\'s `HookspecMarker("loopwarden")`; the '
        "specifications are in `loopwarden.hookspecs` ([hooks.md](hooks.md)).  Plugins do not "
        "need it.",
    ),
    "Verdict": (
        "from loopwarden import Verdict  # Warn | Skip | Stop",
        "What a decision hook may return (or None: carry on); build one with `warn`, `skip`, "
        "`stop` or a plugin's `self.warn` / `self.skip` / `self.stop`.",
    ),
}

_HEADER = re.compile(r"^\s*(?:self\.)?(\w+)\s*(?::[^=]+)?(?:=.*)?$")


def first_paragraph(obj: Any) -> str:
    """The first paragraph of ``obj``'s own docstring, on one line ('' when it has none)."""
    doc = obj.__doc__ if isinstance(obj, property) else inspect.getdoc(obj)
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())


def comments(cls: type | Callable[..., Any]) -> dict[str, str]:
    """``#:`` comments in the source of ``cls`` (or of a function), by the attribute
    (``name: T`` or ``self.name =``) on the line after them."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        m = _HEADER.match(line)
        if pending and m:
            found.setdefault(m.group(1), " ".join(pending))
        pending = []
    return found


def _annotation(ann: Any) -> str:
    if isinstance(ann, str):
        return ann
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "")


def _value(value: Any) -> str:
    """A default as the source spells it (a function by its name, not its address)."""
    if inspect.isfunction(value) or isinstance(value, type):
        return value.__name__
    return repr(value)


def signature(fn: Callable[..., Any], name: str | None = None) -> str:
    """``name(params) -> ret`` with annotations as written in the source."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return f"{name or fn.__name__}(...)"
    parts: list[str] = []
    kinds = [p.kind for p in sig.parameters.values()]
    for i, p in enumerate(sig.parameters.values()):
        if (
            p.kind is p.KEYWORD_ONLY
            and (i == 0 or kinds[i - 1] is p.POSITIONAL_OR_KEYWORD)
            and inspect.Parameter.VAR_POSITIONAL not in kinds
        ):
            parts.append("*")
        star = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        text = star + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {_value(p.default)}"
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(kinds) or kinds[i + 1] is not p.kind):
            parts.append("/")
    ret = ""
    if sig.return_annotation is not sig.empty:
        ret = f" -> {_annotation(sig.return_annotation)}"
    return f"{name or fn.__name__}({', '.join(parts)}){ret}"


@dataclasses.dataclass(frozen=True)
class Member:
    """One documented attribute, property or method of a class."""

    name: str
    kind: str  # "field", "attribute", "property", "method"
    type: str
    default: str
    doc: str


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return ""


def members(cls: type) -> list[Member]:
    """A class's public fields (dataclass fields, or ``self.x`` set in ``__init__`` with a
    ``#:`` comment), properties and methods, in source order."""
    notes = comments(cls)
    out: list[Member] = []
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if not f.name.startswith("_"):
                out.append(
                    Member(f.name, "field", _annotation(f.type), _default(f), notes.get(f.name, ""))
                )
    elif hasattr(cls, "model_fields"):  # a pydantic model
        for fname, info in cls.model_fields.items():
            out.append(
                Member(
                    fname,
                    "field",
                    _annotation(info.annotation),
                    "",
                    info.description or notes.get(fname, ""),
                )
            )
    else:
        init = cls.__dict__.get("__init__")
        if init is not None and inspect.isfunction(init):
            attrs = comments(init)
            source = inspect.getsource(init)
            names = re.findall(r"^\s{8}self\.([a-z]\w*)\b", source, re.M)
            # the type as annotated where the attribute is set: ``self.x: T = ...``
            types = dict(re.findall(r"^\s{8}self\.([a-z]\w*)\s*:\s*([^=\n]+?)\s*=", source, re.M))
            out += [
                Member(n, "attribute", types.get(n, ""), "", attrs.get(n, ""))
                for n in dict.fromkeys(names)
            ]
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            ann = inspect.signature(value.fget).return_annotation if value.fget else ""
            out.append(Member(name, "property", _annotation(ann), "", first_paragraph(value)))
        elif inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod)):
            fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
            out.append(Member(name, "method", signature(fn), "", first_paragraph(fn)))
        elif name in notes and not dataclasses.is_dataclass(cls):
            out.append(Member(name, "class attribute", "", _value(value), notes[name]))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _render_class(cls: type, heading: str) -> list[str]:
    from loopwarden.docs import rst_to_markdown

    out = [heading, ""]
    protocol = getattr(cls, "_is_protocol", False)  # its __init__ is typing's, not a signature
    if "__init__" in vars(cls) and not dataclasses.is_dataclass(cls) and not protocol:
        init = signature(vars(cls)["__init__"], "__init__")
        # a stub, valid Python as in a .pyi file (the docs' tests compile every block)
        out += ["```python", f"class {cls.__name__}:", f"    def {init}: ...", "```", ""]
    out += [rst_to_markdown(inspect.getdoc(cls) or ""), ""]
    rows = members(cls)
    data = [m for m in rows if m.kind in ("field", "attribute", "class attribute")]
    if data:
        out += ["| attribute | type | default | description |", "| --- | --- | --- | --- |"]
        for m in data:
            default = f"`{_cell(m.default)}`" if m.default else ""
            out.append(
                f"| `{m.name}` | {_cell(m.type)} | {default} | {_cell(rst_to_markdown(m.doc))} |"
            )
        out.append("")
    props = [m for m in rows if m.kind == "property"]
    if props:
        out += ["**Properties**", ""]
        out += [f"- `{m.name}` ({_cell(m.type)}) -- {rst_to_markdown(m.doc)}" for m in props]
        out.append("")
    methods = [m for m in rows if m.kind == "method"]
    if methods:
        out += ["**Methods**", ""]
        out += [f"- `{m.type}` -- {rst_to_markdown(m.doc)}" for m in methods]
        out.append("")
    return out


def _render_function(fn: Callable[..., Any], heading: str, name: str) -> list[str]:
    from loopwarden.docs import rst_to_markdown

    doc = inspect.getdoc(fn) or ""
    stub = f"def {signature(fn, name)}: ..."  # valid Python, as in a .pyi file
    return [heading, "", "```python", stub, "```", "", rst_to_markdown(doc), ""]


def render_api() -> str:
    """docs/api.md, generated."""
    import importlib

    from loopwarden.docs import GENERATED, rst_to_markdown

    out = [
        "# API reference",
        "",
        GENERATED.format(source="the code (loopwarden/_docs_api.py lists what)"),
        "",
        "The objects hooks receive and plugin authors use, with every field, property and "
        "method; see [hooks.md](hooks.md) for the hooks themselves and "
        "[plugin-guide.md](plugin-guide.md) for a walk-through.",
        "",
    ]
    for title, module_name, names in SECTIONS:
        module = importlib.import_module(module_name)
        out += [f"## {title}", "", f"From `{module_name}`.", ""]
        if module_name in ("loopwarden.verdicts", "loopwarden.notes", "loopwarden.testing"):
            out += [rst_to_markdown(inspect.getdoc(module) or ""), ""]
        for name in names:
            obj = getattr(module, name)
            if name in NOTES:
                stub, text = NOTES[name]
                out += [f"### {name}", "", "```python", stub, "```", "", text, ""]
            elif isinstance(obj, type):
                out += _render_class(obj, f"### {name}")
            else:
                fn = getattr(obj, "__wrapped__", obj)
                out += _render_function(fn, f"### {name}", name)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"
