"""What llama.cpp's ``--cache-reuse`` does to greedy answers: the typing replay's requests, in order, against
llama-server with and without it.

``python -m benchmarks.typing_reuse --typing-repo DIR [--workdir DIR] [--tiny]``

``--cache-reuse N`` lets llama-server take KV chunks of at least N tokens that moved in the prompt (a
keystroke before them) and shift them to their new place instead of computing them again. The shifted KV
was computed after the old text, not the new, so it is not what the model computes for the prompt: this
counts how often that changes the greedy answer, and by how much the first token's log-probability
moves, on the same requests an editor sends (:func:`.typing_prefill.requests_of`: the request at the
cursor, each newline's warm-up, a request 250 ms into each pause), sent one after another to each server
(one slot, ``cache_prompt``, PSM as llama.vim uses it), on the replay's checkpoint as ``f32`` GGUF. Our
server reuses the KV only up to the first token that differs (exact): it answers as llama-server without
``--cache-reuse``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from .harness import TYPING, Checkpoints
from .typing_prefill import requests_of
from .typing_replay import FULL, SEED, f32_gguf, llama_vim_server
from .typing_sessions import sessions_from_git


def answers(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each request's greedy answer: its text, its first token's log-probability, the tokens prefilled."""
    import httpx

    out = []
    with httpx.Client(timeout=600) as client:
        for body in bodies:
            sent = {k: v for k, v in body.items() if k not in ("first", "warm_up")}
            # Greedy: llama.vim's samplers (top_k, top_p, infill) have no temperature step, so llama-server
            # samples with them at any temperature; the temperature step alone at 0 takes the argmax.
            greedy = {"samplers": ["temperature"], "temperature": 0.0, "seed": 0}
            reply = client.post(
                f"{url}/infill", json={**sent, **greedy, "stream": False, "n_probs": 1}
            ).json()
            probs = reply.get("completion_probabilities") or [{}]
            first = probs[0]
            logprob = first.get("logprob", math.log(first["prob"]) if first.get("prob") else None)
            out.append(
                {
                    "content": reply.get("content", ""),
                    "logprob": logprob,
                    "prefilled": (reply.get("timings") or {}).get("prompt_n"),
                    "steady": not (body.get("warm_up") or body.get("first")),
                }
            )
    return out


def compare(exact: list[dict[str, Any]], reused: list[dict[str, Any]]) -> dict[str, Any]:
    """How the answers with ``--cache-reuse`` differ from the exact ones (warm-ups and first ones apart)."""
    pairs = [(a, b) for a, b in zip(exact, reused, strict=True) if a["steady"]]
    moved = [
        abs(a["logprob"] - b["logprob"])
        for a, b in pairs
        if a["logprob"] is not None and b["logprob"] is not None
    ]
    return {
        "requests": len(pairs),
        "same_answer": sum(a["content"] == b["content"] for a, b in pairs),
        "first_logprob_moved_max": max(moved, default=float("nan")),
        "first_logprob_moved_p50": statistics.median(moved) if moved else float("nan"),
        "prefilled_p50_exact": statistics.median(a["prefilled"] for a, _ in pairs),
        "prefilled_p50_reuse": statistics.median(b["prefilled"] for _, b in pairs),
        "prefilled_total_exact": sum(a["prefilled"] for a, _ in pairs),
        "prefilled_total_reuse": sum(b["prefilled"] for _, b in pairs),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.typing_reuse", description=__doc__)
    parser.add_argument("--typing-repo", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/langchain-starcoder-bench")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument(
        "--tiny", action="store_true", help="the tiny checkpoint: the harness checked in seconds"
    )
    args = parser.parse_args(argv)
    gguf = f32_gguf(Checkpoints(args.workdir, tiny=args.tiny).get(TYPING))
    sessions = sessions_from_git(
        args.typing_repo,
        args.sessions,
        SEED,
        min_chars=0 if args.tiny else 80,
        ring=FULL.ring_chunks,
        chunk_lines=FULL.chunk_lines,
    )
    bodies = [body for i, s in enumerate(sessions) for body in requests_of(s, i, FULL, warm_up=True)]
    results = {}
    # "again": a second exact server, the control (a difference between the exact two is noise, not reuse)
    for name, cache_reuse in (("exact", None), ("again", None), ("reuse", 256)):
        server = llama_vim_server(gguf, cache_reuse)  # llama.vim's settings, as in the replay
        server.start()
        try:
            results[name] = answers(server.url, bodies)
        finally:
            server.stop()
    figures = compare(results["exact"], results["reuse"])
    control = compare(results["exact"], results["again"])
    figures |= {
        "control_same_answer": control["same_answer"],
        "control_first_logprob_moved_max": control["first_logprob_moved_max"],
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
