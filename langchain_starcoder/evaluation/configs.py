"""Evaluation configurations by name: the FIM order (``psm`` or ``spm``), then ``+repo`` for repository
context (``+repo=N``: within N tokens) and ``+noend`` for the middle-end rule off: ``spm+repo+noend``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import InvalidParameterError
from ..fim.request import FIM_MODES

#: The repository context's token budget when ``+repo`` names none.
DEFAULT_REPO_TOKENS = 1024


@dataclass(frozen=True)
class Config:
    """How each hole is asked for: the prompt's order, its repository context, where decoding ends."""

    name: str
    mode: str
    """``psm`` or ``spm``."""
    repo_tokens: int | None = None
    """The repository context's budget in tokens; None: no repository context."""
    end: str = "auto"
    """``auto`` (the middle-end rule) or ``none`` (``+noend``)."""


def parse_config(name: str) -> Config:
    """The configuration ``name`` stands for; InvalidParameterError says what is wrong with a bad one."""
    if not isinstance(name, str):
        msg = f"A configuration is a name such as 'psm+repo', not {name!r}."
        raise InvalidParameterError(msg)
    mode, *options = name.strip().split("+")
    if mode not in FIM_MODES:
        msg = f"Configuration {name!r} must start with its FIM order, 'psm' or 'spm' (as 'psm+repo')."
        raise InvalidParameterError(msg)
    repo_tokens: int | None = None
    end = "auto"
    seen = set()
    for option in options:
        key, _, value = option.partition("=")
        if key in seen or key not in ("repo", "noend") or (value and key != "repo"):
            msg = (
                f"Configuration {name!r}: {option!r} is not an option (once each: '+repo', '+repo=TOKENS' "
                "for repository context within TOKENS, '+noend' for the middle-end rule off)."
            )
            raise InvalidParameterError(msg)
        seen.add(key)
        if key == "noend":
            end = "none"
        elif not value:
            repo_tokens = DEFAULT_REPO_TOKENS
        elif value.isdigit() and int(value) > 0:
            repo_tokens = int(value)
        else:
            msg = f"Configuration {name!r}: the repository budget must be a positive integer, not {value!r}."
            raise InvalidParameterError(msg)
    return Config(name.strip(), mode, repo_tokens, end)


def parse_configs(names: str | Iterable[str]) -> list[Config]:
    """Configurations from a comma-separated string or a list of names, each once."""
    items = [n for n in names.split(",")] if isinstance(names, str) else list(names)
    configs = [parse_config(n) for n in items]
    if not configs:
        msg = "Give at least one configuration (such as 'psm,spm,psm+repo')."
        raise InvalidParameterError(msg)
    seen: set[str] = set()
    for config in configs:
        if config.name in seen:
            msg = f"Configuration {config.name!r} is given twice."
            raise InvalidParameterError(msg)
        seen.add(config.name)
    return configs
