"""Where a middle ends (issue 31): exact and premature ends on real repositories, against today's ends,
Tabby's indentation scope and Continue's bracket matching, and the cost of a call.

    python -m benchmarks --only ends      # the section, in the benchmark report
    python -m benchmarks.ends             # the same figures, printed (``--json`` for all of them)

The measure is defined in ``benchmarks/ends_measure.py``, the baselines in ``benchmarks/ends_baselines.py``,
the decode time the ends save (on the speculative benchmark's copier) in ``benchmarks/ends_decode.py``.
Sources: installed packages (Python from this interpreter's site-packages, JavaScript from the npm that
ships with Node.js, Java from the JDK's ``src.zip``) and git mirrors of public repositories, looked up as
``OWNER+NAME/repo`` or ``OWNER+NAME`` under the folders of ``LANGCHAIN_STARCODER_ENDS_MIRRORS``
(``os.pathsep``-separated; default ``/work/.mirror``); make one with ``git clone --mirror
https://github.com/OWNER/NAME DIR/OWNER+NAME``. A source that is not found is reported as skipped.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ends_decode
from .ends_baselines import BASELINES
from .ends_measure import Hole, make_holes, verdict
from .harness import DEFAULT_WORKDIR, Row, Section

TITLE = "Where a middle ends"
ITEM = 21  # the row number in the report (18 and 20 are taken by the Jupyter and typing rows)
SEED = 0
PER_KIND = 400
TIMING_HOLES = 300


@dataclass(frozen=True)
class Source:
    """A repository's source files: an installed package, a folder, or a git mirror."""

    name: str
    language: str
    kind: str  # "package", "npm", "git" or "jdk"
    where: str  # a package name, a folder under npm's root, "owner/name", or a folder of the JDK's src.zip
    under: str = ""  # only files below this folder
    exts: tuple[str, ...] = (".py",)


SOURCES = [
    Source("rich", "python", "package", "rich"),
    Source("requests", "python", "package", "requests"),
    Source("urllib3", "python", "package", "urllib3"),
    Source("jinja2", "python", "package", "jinja2"),
    Source("npm", "javascript", "npm", ".", "lib", (".js",)),
    Source("undici", "javascript", "npm", "node_modules/undici", "lib", (".js",)),
    Source("node-gyp", "javascript", "npm", "node_modules/node-gyp", "lib", (".js",)),
    Source("got", "typescript", "git", "sindresorhus/got", "source", (".ts",)),
    Source("cobra", "go", "git", "spf13/cobra", "", (".go",)),
    Source("gin", "go", "git", "gin-gonic/gin", "", (".go",)),
    Source("fzf", "go", "git", "junegunn/fzf", "src", (".go",)),
    Source("ripgrep", "rust", "git", "BurntSushi/ripgrep", "crates", (".rs",)),
    Source("java.util", "java", "jdk", "java.base/java/util/", "", (".java",)),
]
#: The repositories whose misses were read while the rules were written (the others were only measured).
TUNED_ON = ("rich", "undici", "ripgrep")


def load(source: Source) -> tuple[list[tuple[str, str]], str] | str:
    """The files (path, text) of a source and its version, or why it is not here."""
    if source.kind == "package":
        spec = importlib.util.find_spec(source.where)
        if spec is None or not spec.submodule_search_locations:
            return f"package {source.where} is not installed"
        root = Path(next(iter(spec.submodule_search_locations)))
        version = f"{source.name} {importlib.metadata.version(source.where)} (installed)"
        return _folder(root, source.exts), version
    if source.kind == "npm":
        npm = shutil.which("npm")
        if npm is None:
            return "npm (Node.js) is not installed"
        root = Path(os.path.realpath(npm)).parent.parent / source.where
        package = root / "package.json"
        if not package.is_file():
            return f"{root} not found"
        meta = json.loads(package.read_text())
        version = f"{meta['name']} {meta['version']} (shipped with npm)"
        return _folder(root / source.under, source.exts, prefix=source.under), version
    if source.kind == "jdk":
        return _jdk_files(source.where, source.exts)
    git_dir = _mirror(source.where)
    if git_dir is None:
        return f"no mirror of {source.where} (see the module's docs)"
    commit = _git(git_dir, "rev-parse", "HEAD")
    return _git_files(git_dir, source.under, source.exts), f"{source.where}@{commit[:12]}"


def _folder(root: Path, exts: tuple[str, ...], prefix: str = "") -> list[tuple[str, str]]:
    files = []
    for path in sorted(root.rglob("*")):
        if path.suffix in exts and path.is_file():
            rel = (Path(prefix) / path.relative_to(root)).as_posix()
            files.append((rel, path.read_text(encoding="utf-8", errors="replace")))
    return files


def _jdk_files(package: str, exts: tuple[str, ...]) -> tuple[list[tuple[str, str]], str] | str:
    """One package's sources (its own files, not its subpackages) from the newest JDK's ``lib/src.zip``."""
    jdks = []
    for release in Path("/usr/lib/jvm").glob("*/release"):
        version = re.search(r'^JAVA_VERSION="([^"]+)"', release.read_text(), re.M)
        src = release.parent / "lib" / "src.zip"
        if version and src.is_file():
            jdks.append((tuple(int(x) for x in re.findall(r"\d+", version.group(1))), version.group(1), src))
    if not jdks:
        return "no JDK with lib/src.zip under /usr/lib/jvm"
    _, version, src = max(jdks)
    with zipfile.ZipFile(src) as archive:
        names = [
            n
            for n in archive.namelist()
            if n.startswith(package) and "/" not in n[len(package) :] and n.endswith(exts)
        ]
        files = [(n, archive.read(n).decode("utf-8", "replace")) for n in sorted(names)]
    return files, f"OpenJDK {version} {package.rstrip('/')} (the JDK's src.zip)"


def _mirror(repo: str) -> Path | None:
    roots = os.environ.get("LANGCHAIN_STARCODER_ENDS_MIRRORS", "/work/.mirror").split(os.pathsep)
    owner_name = repo.replace("/", "+")
    for root in filter(None, roots):
        for candidate in (Path(root) / owner_name / "repo", Path(root) / owner_name):
            if (candidate / "HEAD").is_file():
                return candidate
    return None


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _git_files(git_dir: Path, under: str, exts: tuple[str, ...]) -> list[tuple[str, str]]:
    listed = _git(git_dir, "ls-tree", "-r", "--name-only", "HEAD", *([under] if under else []))
    names = [n for n in listed.split("\n") if n.endswith(exts)]
    wanted = "".join(f"HEAD:{n}\n" for n in names).encode()
    command = ["git", "--git-dir", str(git_dir), "cat-file", "--batch"]
    batch = subprocess.run(command, capture_output=True, input=wanted, check=True).stdout
    files, at = [], 0
    for name in names:
        header_end = batch.index(b"\n", at)
        size = int(batch[at:header_end].split()[2])
        files.append((name, batch[header_end + 1 : header_end + 1 + size].decode("utf-8", "replace")))
        at = header_end + 1 + size + 1
    return files


# --- scoring ---------------------------------------------------------------------------------------


def _ours(hole: Hole, text: str, language: str) -> int | None:
    from langchain_starcoder.ends import middle_end

    return middle_end(hole.prefix, hole.suffix, text, file_path=hole.path)


def _baseline(method: Callable[[str, str, str, str], int]) -> Callable[[Hole, str, str], int]:
    return lambda hole, text, language: method(hole.prefix, hole.suffix, text, language)


def score(holes: list[Hole], language: str) -> dict[str, Any]:
    """Exact and premature shares per method, over every (hole, overrun), by hole kind and overall."""
    methods: dict[str, Callable[[Hole, str, str], int | None]] = {"ours": _ours}
    methods.update({name: _baseline(method) for name, method in BASELINES.items()})
    counts: dict[str, dict[str, dict[str, int]]] = {}
    failures: list[dict[str, Any]] = []
    for hole in holes:
        for overrun_name, overrun in hole.overruns.items():
            text = hole.middle + overrun
            for name, method in methods.items():
                kept = method(hole, text, language)
                result = verdict(kept, hole.middle)
                for key in (hole.kind, f"{hole.kind}/{overrun_name}", "all"):
                    bucket = counts.setdefault(name, {}).setdefault(key, {"exact": 0, "premature": 0, "n": 0})
                    bucket["n"] += 1
                    bucket[result] = bucket.get(result, 0) + 1
                if name == "ours" and result != "exact" and len(failures) < 40:
                    failures.append(
                        {
                            "path": hole.path,
                            "kind": hole.kind,
                            "overrun": overrun_name,
                            "result": result,
                            "kept": kept,
                            "middle": len(hole.middle),
                        }
                    )
    shares = {
        name: {
            key: {"exact": c["exact"] / c["n"], "premature": c["premature"] / c["n"], "n": c["n"]}
            for key, c in by_key.items()
        }
        for name, by_key in counts.items()
    }
    return {"shares": shares, "failures": failures}


def timing(files: list[tuple[str, str]], language: str) -> dict[str, Any]:
    """The cost of the rules on the largest file (with 50 holes or more): building a
    :class:`MiddleEnd` for a hole, and each ``feed`` as an engine makes it, at every newline of a middle
    and its overruns (and once at the end); wall-clock time, and the process's CPU time (what a busy
    machine's other jobs do not inflate)."""
    from langchain_starcoder.ends import MiddleEnd

    holes: list[Hole] = []
    by_size = sorted(files, key=lambda f: -f[1].count("\n"))
    for path, text in by_size:  # the largest file with code in functions
        holes = make_holes([(path, text)], language, seed=SEED, per_kind=TIMING_HOLES // 2)
        if len(holes) >= 50:
            break
    build, calls, whole, build_cpu, calls_cpu = [], [], [], [], []
    clock, cpu = time.perf_counter, time.process_time
    for hole in holes:
        for overrun in hole.overruns.values():
            full = hole.middle + overrun
            t0, c0 = clock(), cpu()
            ends = MiddleEnd(hole.prefix, hole.suffix, file_path=path)
            build.append(clock() - t0)
            build_cpu.append(cpu() - c0)
            at = full.find("\n")
            while True:
                cut = len(full) if at < 0 else at + 1
                t, c = clock(), cpu()
                kept = ends.feed(full[:cut])
                calls.append(clock() - t)
                calls_cpu.append(cpu() - c)
                if kept is not None or at < 0:
                    break
                at = full.find("\n", cut)
            whole.append(clock() - t0)

    def ms(samples: list[float], percent: int) -> float:
        if len(samples) < 2:
            return 1000 * samples[0]
        return 1000 * statistics.quantiles(samples, n=100)[percent - 1]

    return {
        "file": path,
        "lines": text.count("\n") + 1,
        "holes": len(holes),
        "calls": len(calls),
        "feed_p50_ms": ms(calls, 50),
        "feed_p95_ms": ms(calls, 95),
        "build_p50_ms": ms(build, 50),
        "build_p95_ms": ms(build, 95),
        "middle_end_p95_ms": ms(whole, 95),
        "feed_p95_cpu_ms": ms(calls_cpu, 95),
        "build_p95_cpu_ms": ms(build_cpu, 95),
    }


def run(
    log: Callable[[str], None] = print, sources: list[Source] | None = None, workdir: Path | None = None
) -> dict[str, Any]:
    """Every source's shares and timing; with ``workdir`` (where the copier is kept) also the decode time
    the ends save (``benchmarks/ends_decode.py``), on a sample of each language's holes."""
    repos, skipped = [], []
    sample: dict[str, list[Hole]] = {}
    for source in sources or SOURCES:
        loaded = load(source)
        if isinstance(loaded, str):
            skipped.append({"repo": source.name, "why": loaded})
            log(f"  {source.name}: skipped ({loaded})")
            continue
        files, version = loaded
        t0 = time.perf_counter()
        holes = make_holes(files, source.language, seed=SEED, per_kind=PER_KIND)
        found = score(holes, source.language)
        blocks = sum(h.kind == "block" for h in holes)
        repos.append(
            {
                "repo": source.name,
                "version": version,
                "language": source.language,
                "files": len(files),
                "block_holes": blocks,
                "line_holes": len(holes) - blocks,
                "timing": timing(files, source.language),
                "seconds": time.perf_counter() - t0,
                **found,
            }
        )
        ours = found["shares"]["ours"]["all"]
        log(f"  {version}: {len(holes)} holes, exact {ours['exact']:.4f}, premature {ours['premature']:.4f}")
        for kind in ("block", "line"):
            picked = [h for h in holes if h.kind == kind][: ends_decode.DECODE_HOLES]
            sample.setdefault(_family(source.language), []).extend(picked)
    found_all = {"repos": repos, "skipped": skipped, "tuned_on": TUNED_ON, "seed": SEED, "per_kind": PER_KIND}
    if workdir is not None and sample:
        found_all["decode"] = ends_decode.measure(sample, workdir, log)
    return found_all


# --- report ----------------------------------------------------------------------------------------


def by_language(found: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Exact and premature shares per language and method: the mean over every (hole, overrun)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for repo in found["repos"]:
        family = _family(repo["language"])
        for method, shares in repo["shares"].items():
            total = out.setdefault(family, {}).setdefault(method, {"exact": 0.0, "premature": 0.0, "n": 0})
            n = shares["all"]["n"]
            total["exact"] += shares["all"]["exact"] * n
            total["premature"] += shares["all"]["premature"] * n
            total["n"] += n
    for methods in out.values():
        for total in methods.values():
            total["exact"] /= total["n"]
            total["premature"] /= total["n"]
    return out


def _family(language: str) -> str:
    """Languages are reported as the issue's goal names them: TypeScript with JavaScript."""
    return "javascript" if language == "typescript" else language


def section(found: dict[str, Any]) -> Section:
    s = Section("ends", ITEM, TITLE)
    for language, methods in by_language(found).items():
        ours, n = methods["ours"], int(methods["ours"]["n"])
        repos = [r["repo"] for r in found["repos"] if _family(r["language"]) == language]
        shape = f"{language}: {', '.join(repos)}; {n} (hole, overrun) pairs"
        best = max(BASELINES, key=lambda name: methods[name]["exact"])
        exact, kept_whole = [ours["exact"]], [1 - ours["premature"]]
        row = "middle_end"
        s.rows += [
            Row(
                ITEM,
                TITLE,
                f"exact share, {language}",
                row,
                f"best baseline ({best})",
                exact,
                [methods[best]["exact"]],
                "",
                shape,
            ),
            Row(
                ITEM,
                TITLE,
                f"exact share, {language}",
                row,
                "the 0.98 target",
                exact,
                [0.98],
                "",
                shape,
                (">=", 1.0),
            ),
            Row(
                ITEM,
                TITLE,
                f"share not premature, {language}",
                row,
                "premature <= 0.2%",
                kept_whole,
                [0.998],
                "",
                shape,
                (">=", 1.0),
            ),
        ]
    if found["repos"]:
        worst = max((r["timing"] for r in found["repos"]), key=lambda t: t["feed_p95_ms"])
        where = f"{worst['file']} ({worst['lines']} lines), a call per newline"
        s.rows.append(
            Row(
                ITEM,
                TITLE,
                "p95 of a feed call",
                "MiddleEnd.feed",
                "the 1 ms target",
                [worst["feed_p95_ms"]],
                [1.0],
                "ms",
                where,
                ("<=", 1.0),
            )
        )
    for repo in found["repos"]:
        shares, t = repo["shares"], repo["timing"]
        s.notes.append(
            f"{repo['version']}: {repo['block_holes']} block + {repo['line_holes']} line holes; exact "
            + ", ".join(f"{m} {shares[m]['all']['exact']:.3f}" for m in shares)
            + f"; premature {shares['ours']['all']['premature']:.4f}; feed p95 {t['feed_p95_ms']:.3f} ms, "
            f"build p95 {t['build_p95_ms']:.2f} ms on {t['file']} ({t['lines']} lines)"
        )
    if "decode" in found:
        _decode_rows(s, found["decode"])
    tuned = ", ".join(found["tuned_on"])
    s.notes.append(
        f"Rules written while reading the misses of {tuned}; the other repositories were only measured. "
        f"Holes: {found['per_kind']} of each kind per repository, drawn with seed {found['seed']}."
    )
    for skip in found["skipped"]:
        s.notes.append(f"{skip['repo']}: skipped ({skip['why']})")
    s.data = found
    return s


def _decode_rows(s: Section, decode: dict[str, Any]) -> None:
    """The decode time per completion with the end and without it: overrun tokens x measured ms/token."""
    ms = decode["ms_per_token"]
    for language, d in decode["languages"].items():
        shape = (
            f"{language}: {d['pairs']} (hole, overrun) pairs, tokens of the copier's tokenizer x "
            f"{decode['ms']:.2f} ms/token measured on {decode['checkpoint']}"
        )
        s.rows.append(
            Row(
                ITEM,
                TITLE,
                f"decode ms per completion, {language}",
                "end='auto' (to the end)",
                "end='none' (middle + overrun)",
                [d["tokens_auto"] * m for m in ms],
                [d["tokens_none"] * m for m in ms],
                "ms",
                shape,
            )
        )
        s.notes.append(
            f"Decode time saved, {language}: {d['tokens_saved']:.1f} of {d['tokens_none']:.1f} tokens per "
            f"completion not decoded (the overrun is {d['overrun_tokens']:.1f}; the gate decodes the line "
            f"past the end that decides it) x {decode['ms']:.2f} ms/token = {d['ms_saved']:.0f} ms, "
            f"{100 * d['share_saved']:.0f}% of the completion's decode time (overrun tokens x measured "
            f"ms/token, not tokens a model wrote)."
        )
    s.notes.append(
        f"ms/token: median of {[round(m, 3) for m in ms]}, greedy infills ({decode['tokens']} tokens) with "
        f"end='none' and no speculation on {decode['checkpoint']}, a hole of {decode['timed_on']}; "
        f"{decode['per_kind']} holes of each kind per repository."
    )


def decode_table(decode: dict[str, Any]) -> str:
    """Per language: the tokens and decode time per completion with end='auto' and end='none'."""
    lines = [
        "| Language | pairs | tokens, end='none' (middle + overrun) | overrun tokens | decoded, end='auto' "
        "| not decoded | ms saved | share of decode time |",
        "|" + "---|" * 8,
    ]
    for language, d in decode["languages"].items():
        lines.append(
            f"| {language} | {d['pairs']} | {d['tokens_none']:.1f} | {d['overrun_tokens']:.1f} | "
            f"{d['tokens_auto']:.1f} | {d['tokens_saved']:.1f} | {d['ms_saved']:.0f} ms | "
            f"{100 * d['share_saved']:.0f}% |"
        )
    return "\n".join(lines)


def table(found: dict[str, Any]) -> str:
    """The per-repository table of RESULTS.md."""
    head = (
        "| Repository | language | holes (block + line) | exact: middle_end | premature | today's ends "
        "| Tabby indentation | Continue brackets | exact, block / line | feed p50 / p95 | build p95 (file) |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in found["repos"]:
        sh, t = r["shares"], r["timing"]
        lines.append(
            f"| {r['version']} | {r['language']} | {r['block_holes']} + {r['line_holes']} | "
            f"{sh['ours']['all']['exact']:.4f} | {100 * sh['ours']['all']['premature']:.2f}% | "
            f"{sh['today']['all']['exact']:.3f} | {sh['tabby']['all']['exact']:.3f} | "
            f"{sh['continue']['all']['exact']:.3f} | {sh['ours']['block']['exact']:.4f} / "
            f"{sh['ours']['line']['exact']:.4f} | {t['feed_p50_ms']:.3f} / {t['feed_p95_ms']:.3f} ms | "
            f"{t['build_p95_ms']:.2f} ms ({t['file']}, {t['lines']} lines) |"
        )
    for language, methods in by_language(found).items():
        ours = methods["ours"]
        lines.append(
            f"| **{language}, all** | | {int(ours['n'])} pairs | **{ours['exact']:.4f}** | "
            f"**{100 * ours['premature']:.2f}%** | "
            + " | ".join(f"{methods[name]['exact']:.3f}" for name in BASELINES)
            + " | | | |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ends", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated repositories: " + ", ".join(s.name for s in SOURCES))
    parser.add_argument("--json", action="store_true", help="print every figure as JSON")
    parser.add_argument("--workdir", type=Path, help="where the copier is kept (default: the benchmarks')")
    parser.add_argument("--no-decode", action="store_true", help="leave out the decode time saved")
    args = parser.parse_args(argv)
    sources = [s for s in SOURCES if not args.only or s.name in args.only.split(",")]
    workdir = None if args.no_decode else args.workdir or DEFAULT_WORKDIR
    found = run(lambda msg: print(msg, file=sys.stderr), sources, workdir)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print(table(found) + ("\n\n" + decode_table(found["decode"]) if "decode" in found else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
