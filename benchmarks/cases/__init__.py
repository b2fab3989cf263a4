"""The benchmarks, one function each in a module per area; each returns a :class:`Section`."""

from __future__ import annotations

from collections.abc import Callable

from .. import disk_cache, jupyter, llama_cpp_managed, speculative, structured, typing_replay, vllm_server
from ..common import Context, prefill_rate
from ..evaluation import bench_evaluation
from ..harness import Section
from .blas import bench_blas
from .engine import batch_variants, bench_batch, bench_cache, bench_dtype, bench_overhead
from .memory import bench_longctx, bench_memory
from .reference import bench_baselines, bench_fullmodel
from .serving import bench_gguf, bench_remote, bench_server


def bench_repo(ctx: Context) -> Section:
    """Repository context (issue 21): recall, build and lookup times; benchmarks/repo_context.py."""
    from .. import repo_context

    return repo_context.section(repo_context.run(ctx.checkpoints.workdir, ctx.tokenizer, ctx.log))


def bench_ends(ctx: Context) -> Section:
    """Where a middle ends (issue 31): exact and premature ends on real code; benchmarks/ends.py."""
    from .. import ends

    return ends.section(ends.run(ctx.log, workdir=ctx.checkpoints.workdir))


#: Every benchmark, in report order; the default run takes all but the optional ones.
BENCHMARKS: dict[str, Callable[[Context], Section]] = {
    "overhead": bench_overhead,
    "dtype": bench_dtype,
    "cache": bench_cache,
    "blas": bench_blas,
    "batch": bench_batch,
    "memory": bench_memory,
    "longctx": bench_longctx,
    "baselines": bench_baselines,
    "fullmodel": bench_fullmodel,
    "gguf": bench_gguf,
    "server": bench_server,
    "remote": bench_remote,
    "repo": bench_repo,
    "disk_cache": disk_cache.bench_disk_cache,
    "llamacpp": llama_cpp_managed.bench_llama_cpp_managed,
    "vllm": vllm_server.bench_vllm,
    "speculative": speculative.bench_speculative,
    "jupyter": jupyter.bench_jupyter,
    "typing": typing_replay.bench_typing,
    "ends": bench_ends,
    "structured": structured.bench_structured,
    "evaluation": bench_evaluation,
}
#: Left out of the default run: ``--baselines`` adds the baselines, ``--only fullmodel`` or ``--only remote``
#: runs the others (``remote`` starts a llama-server, ``jupyter`` a jupyter lab and a browser; ``ends`` is
#: model-free, on real repositories' code; ``structured`` trains a 49,152-token tokenizer once).
OPTIONAL = (
    "baselines",
    "fullmodel",
    "remote",
    "repo",
    "disk_cache",
    "llamacpp",
    "vllm",
    "jupyter",
    "typing",
    "ends",
    "structured",
    "evaluation",
)

__all__ = ["BENCHMARKS", "OPTIONAL", "Context", "batch_variants", "prefill_rate"]
