"""Tokens each keystroke's request prefills, counted without a model: the typing replay's requests in order.

``python -m benchmarks.typing_prefill --typing-repo DIR [--tokenizer tokenizer.json]``

The replay's timings (:mod:`.typing_replay`) move with the machine's load, and a request cancelled before
it answers reports no counts. This counts instead, for the same sessions and the same requests (the one at
the cursor when the file opens, the warm-up at each newline, the request 250 ms into each pause), the
prompt the server builds (``ServerState.editor_request``: its FIM layout and, with the stable prefix, the
lines a slid window dropped put back) and how many of its tokens differ from the previous prompt's (a
cache of one slot, as the managed llama.cpp's, every request prefilled to its end). Steady typing: every
request but the one at the cursor, warm-ups apart. No timing: it is the same on any machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from langchain_starcoder.editor.supersede import Document
from langchain_starcoder.engine import fim_prompts
from langchain_starcoder.server.parsing import infill_request
from langchain_starcoder.server.state import ServerState

from .typing_replay import FULL, OPEN, SEED
from .typing_sessions import EditorSettings, Session, keystrokes, llama_vim_body, sessions_from_git

#: StarCoder2-3b's context window, which the replay's checkpoint keeps.
CONTEXT = 4096


class _Tokenizing:
    """What ``editor_request`` asks of an engine (the FIM prompt), over a tokenizer alone."""

    def __init__(self, tokenizer: Any, context_window: int = CONTEXT):
        self.tokenizer = tokenizer
        self.context_window = context_window

    def fim_prompt(self, request: Any, max_tokens: int) -> Any:
        return fim_prompts.fim_prompt(self.tokenizer, self.context_window, request, max_tokens)


def requests_of(session: Session, index: int, settings: EditorSettings, warm_up: bool) -> list[dict]:
    """The bodies the replay's editor sends in ``session``, in order (``first`` and ``warm_up`` marked)."""
    asks, keys = keystrokes(session.typed, SEED + index, start=OPEN)
    moments = [(p.at, "ask", p.typed) for p in asks] + [(k.at, "key", k.typed) for k in keys]
    bodies = [{**llama_vim_body(session, 0, settings), "first": True}]
    for _, kind, typed in sorted(moments, key=lambda m: (m[0], m[1])):
        if kind == "ask":
            bodies.append(llama_vim_body(session, typed, settings))
        elif warm_up and typed and session.typed[:typed].rstrip(" \t").endswith("\n"):
            bodies.append({**llama_vim_body(session, typed, settings, warm_up=True), "warm_up": True})
    return bodies


def prefills(
    tokenizer: Any, sessions: list[Session], settings: EditorSettings, mode: str, stable: bool, warm_up: bool
) -> dict[str, Any]:
    """Per request of steady typing: the tokens differing from the previous prompt, and the prompt's size."""
    engine = _Tokenizing(tokenizer)
    steady, warm, sizes = [], [], []
    for index, session in enumerate(sessions):
        state = ServerState(lambda: None, None, False, None, 0, 1, fim_mode=mode, stable_prefix=stable)
        document, last = Document("editor", None, 0), []
        for body in requests_of(session, index, settings, warm_up):
            max_tokens = 1 if body.get("warm_up") else settings.n_predict
            request, _, prompt = state.editor_request(engine, infill_request(body), max_tokens, document)
            ids = (prompt or engine.fim_prompt(request, max_tokens)).token_ids
            common = next((i for i, (a, b) in enumerate(zip(ids, last, strict=False)) if a != b), None)
            # At least one token: the engine runs the prompt's last token again for its logits.
            new = max(1, len(ids) - (min(len(ids), len(last)) if common is None else common))
            last = ids
            if body.get("warm_up"):
                warm.append(new)
            elif not body.get("first"):
                steady.append(new)
                sizes.append(len(ids))
    q = statistics.quantiles(steady, n=20, method="inclusive")
    return {
        "requests": len(steady),
        "prefilled_p50": statistics.median(steady),
        "prefilled_p95": q[18],
        "prefilled_mean": statistics.fmean(steady),
        "warm_ups": len(warm),
        "warm_up_mean": statistics.fmean(warm) if warm else 0.0,
        "prompt_p50": statistics.median(sizes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.typing_prefill", description=__doc__)
    parser.add_argument("--typing-repo", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True, help="StarCoder2's tokenizer.json")
    parser.add_argument("--sessions", type=int, default=3)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    sessions = sessions_from_git(
        args.typing_repo,
        args.sessions,
        SEED,
        min_chars=80,
        ring=FULL.ring_chunks,
        chunk_lines=FULL.chunk_lines,
    )
    configs = [("today's server (PSM, no warm-up)", "psm", False, False)] + [
        (
            f"ours, {mode.upper()}{'' if stable else ', window as sent'}{'' if warm else ', no warm-up'}",
            mode,
            stable,
            warm,
        )
        for warm in (True, False)
        for mode in ("psm", "spm")
        for stable in (True, False)
    ]
    for name, mode, stable, warm_up in configs:
        print(json.dumps({"config": name, **prefills(tokenizer, sessions, FULL, mode, stable, warm_up)}))


if __name__ == "__main__":
    main()
