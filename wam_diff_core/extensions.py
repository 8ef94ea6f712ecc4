"""The extension registry: what optional packages add to the core, asked for by name.

The core works on its own with the attention backends it defines ("sdpa", "flex"), the model's own text
layers and the eager decoders. Anything else plugs in here, by kind:
- an attention backend: name -> `install(model)` (routes the model's text attention through it) and
  `missing()` (what this machine lacks for it: a list of short phrases, empty when it can run);
- text layers: kind ("fast", "compiled") -> `build(model)`, a layer stack with
  `forward(tokens, rope, cache, spec)` (see `ModelRunner.forward_tokens`);
- a decoder: name ("static", the capture-ready block decoder) -> a function with the signature of
  `decoding.block_diffusion.generate`.

Plugins are functions `plugin(registry)` that call the `add_*` methods. Installed packages declare them
in the entry-point group `wam_diff_core.extensions`; those are loaded once, on the first request the
built-in pieces cannot answer. `register(plugin)` adds one directly (tests, notebooks); a piece added
that way is kept when the entry points load later. The core never imports a plugin package itself, so
imports point one way: plugins import the core, not the reverse.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable, Optional

from .errors import WamDiffError

ENTRY_POINT_GROUP = "wam_diff_core.extensions"
KINDS = ("attention backend", "text layers", "decoder")
INSTALL_HINT = (f"extensions register through the entry-point group '{ENTRY_POINT_GROUP}'; "
                "the ones this repository ships are registered by installing it (pip install -e .)")


class MissingExtension(WamDiffError, ValueError):
    """A name asked of the registry that no built-in piece and no installed extension provides."""


@dataclass(frozen=True)
class AttentionBackend:
    install: Callable[[Any], None]
    missing: Callable[[], list[str]]


def _nothing_missing() -> list[str]:
    return []


class Registry:
    """Named pieces per kind (`KINDS`). With `discover`, the entry points of `ENTRY_POINT_GROUP` are
    loaded on the first lookup (once)."""

    def __init__(self, discover: bool = True):
        self._pieces: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
        self._discovered = not discover
        self._discovering = False

    def _add(self, kind: str, name: str, piece: Any) -> None:
        if self._discovering and name in self._pieces[kind]:
            return  # a piece registered directly wins over an entry point's
        self._pieces[kind][name] = piece

    def add_attention_backend(self, name: str, install: Callable[[Any], None],
                              missing: Optional[Callable[[], list[str]]] = None) -> None:
        self._add("attention backend", name, AttentionBackend(install, missing or _nothing_missing))

    def add_text_layers(self, kind: str, build: Callable[[Any], Any]) -> None:
        self._add("text layers", kind, build)

    def add_decoder(self, name: str, generate: Callable[..., Any]) -> None:
        self._add("decoder", name, generate)

    def discover(self) -> None:
        """Load every plugin of the entry-point group (once; later calls do nothing)."""
        if self._discovered:
            return
        self._discovered, self._discovering = True, True
        try:
            for point in entry_points(group=ENTRY_POINT_GROUP):
                try:
                    plugin = point.load()
                except Exception as exc:
                    raise MissingExtension(f"extension {point.name!r} ({point.value}) failed to load: "
                                           f"{type(exc).__name__}: {exc}") from exc
                plugin(self)
        finally:
            self._discovering = False

    def names(self, kind: str) -> tuple[str, ...]:
        self.discover()
        return tuple(sorted(self._pieces[kind]))

    def get(self, kind: str, name: str) -> Any:
        """The piece registered as `name`, or MissingExtension naming what was asked and what to install."""
        if name not in self._pieces[kind]:
            self.discover()
        if name not in self._pieces[kind]:
            known = ", ".join(repr(n) for n in self.names(kind)) or "none"
            raise MissingExtension(f"{kind} {name!r} is not available (registered by extensions: {known}); "
                                   f"{INSTALL_HINT}")
        return self._pieces[kind][name]


REGISTRY = Registry()


def register(plugin: Callable[[Registry], None]) -> None:
    """Add a plugin's pieces to the registry without an entry point."""
    plugin(REGISTRY)


def attention_backend(name: str) -> AttentionBackend:
    return REGISTRY.get("attention backend", name)


def text_layers(kind: str) -> Callable[[Any], Any]:
    return REGISTRY.get("text layers", kind)


def decoder(name: str) -> Callable[..., Any]:
    return REGISTRY.get("decoder", name)


__all__ = ["ENTRY_POINT_GROUP", "AttentionBackend", "MissingExtension", "Registry", "REGISTRY", "register",
           "attention_backend", "text_layers", "decoder"]
