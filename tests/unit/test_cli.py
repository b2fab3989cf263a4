"""The ``langchain-starcoder`` command, run in-process (``cli.main``) and as a subprocess."""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.fim import ContextFile

REPO = Path(__file__).resolve().parents[2]
PROMPT = "def count_items(items):\n    "


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command in-process; return (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def stats(err: str) -> dict[str, int]:
    """The token counts of the statistics line on stderr."""
    m = re.search(r"\[(\w+)\] prompt: (\d+) tokens(?:, (\d+) cached)?.*generation: (\d+) tokens", err)
    assert m, err
    return {
        "finish": m.group(1),
        "prompt": int(m.group(2)),
        "cached": int(m.group(3) or 0),
        "completion": int(m.group(4)),
    }


def hidden_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# --- generate ----------------------------------------------------------------------------------------


def test_generate_prints_exactly_the_completion(capsys, tiny_path, tiny_engine):
    expected = tiny_engine.generate(PROMPT, max_tokens=12)
    code, out, err = run(capsys, "generate", "--model", tiny_path, "--prompt", PROMPT, "--max-tokens", 12)
    assert code == 0
    assert out == expected.text  # stdout holds the text and nothing else
    counts = stats(err)
    assert counts["prompt"] == tiny_engine.count_tokens(PROMPT)
    assert counts["completion"] == expected.completion_tokens == 12
    assert counts["finish"] == "length"
    assert re.search(r"prompt: .* [\d.]+ tokens/s \| generation: .* [\d.]+ tokens/s", err)


def test_generate_streams_chunk_by_chunk(capsys, tiny_path, tiny_engine, monkeypatch):
    writes: list[str] = []
    monkeypatch.setattr(cli.output, "_out", writes.append)
    code = cli.main(["generate", "--model", str(tiny_path), "--prompt", PROMPT, "--max-tokens", "10"])
    assert code == 0
    chunks = [c.text for c in tiny_engine.stream(PROMPT, max_tokens=10) if c.text]
    assert len(writes) > 1  # written as the tokens arrive, not once at the end
    assert writes == chunks


def test_generate_honours_stop_with_escapes(capsys, tiny_path, tiny_engine):
    prompt = "class Stack:\n"
    chunks = [c.text for c in tiny_engine.stream(prompt, max_tokens=40)]
    # A stop string that starts with a newline, at a token boundary of the unconstrained output.
    k = next(i for i, text in enumerate(chunks) if i > 0 and text.startswith("\n") and chunks[i + 1])
    stop = chunks[k] + chunks[k + 1][:3]
    full = "".join(chunks)
    assert full.index(stop) == len("".join(chunks[:k]))
    code, out, err = run(
        capsys,
        "generate",
        "--model",
        tiny_path,
        "--prompt",
        prompt,
        "--max-tokens",
        40,
        "--stop",
        stop.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t"),
    )
    assert code == 0
    assert out == full[: full.index(stop)]
    assert stats(err)["finish"] == "stop"


def test_generate_reads_prompt_from_file_and_stdin(capsys, tiny_path, tiny_engine, tmp_path, monkeypatch):
    expected = tiny_engine.generate(PROMPT, max_tokens=6).text
    prompt_file = tmp_path / "prompt.py"
    prompt_file.write_text(PROMPT, encoding="utf-8")
    assert (
        run(capsys, "generate", "--model", tiny_path, "--file", prompt_file, "--max-tokens", 6)[1] == expected
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert run(capsys, "generate", "--model", tiny_path, "--file", "-", "--max-tokens", 6)[1] == expected


def test_generate_sampling_options_reach_the_engine(capsys, tiny_path, tiny_engine):
    settings = {"temperature": 1.5, "top_k": 50, "seed": 7, "max_tokens": 16}
    expected = tiny_engine.generate(PROMPT, **settings).text
    assert expected != tiny_engine.generate(PROMPT, max_tokens=16).text  # sampling changes the text
    code, out, _ = run(
        capsys,
        "generate",
        "--model",
        tiny_path,
        "--prompt",
        PROMPT,
        "--max-tokens",
        16,
        "--temperature",
        1.5,
        "--top-k",
        50,
        "--seed",
        7,
    )
    assert (code, out) == (0, expected)


# --- errors --------------------------------------------------------------------------------------------


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_missing_model_folder_is_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "generate", "--model", tmp_path / "nowhere", "--prompt", "x")
    assert code == 1 and out == ""
    assert "nowhere" in one_line(err)


def test_verbose_shows_the_traceback(capsys, tmp_path):
    code, _, err = run(capsys, "--verbose", "generate", "--model", tmp_path / "nowhere", "--prompt", "x")
    assert code == 1
    assert "Traceback" in err and "ModelNotFoundError" in err
    code, _, err = run(capsys, "info", "--model", tmp_path / "nowhere", "-v")  # after the command too
    assert code == 1 and "Traceback" in err


def test_hub_model_offline_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    code, _, err = run(capsys, "info", "--model", "mlx-community/starcoder2-3b-4bit")
    assert code == 1
    assert "cache" in one_line(err)


def test_argparse_errors_are_one_line(capsys, tiny_path):
    code, out, err = run(capsys, "generate", "--model", tiny_path)  # neither --prompt nor --file
    assert code == 2 and out == ""
    assert "--prompt" in one_line(err)
    code, _, err = run(capsys, "quantize", tiny_path, "x", "--bits", "3")
    assert code == 2 and "invalid choice" in one_line(err)
    code, _, err = run(capsys, "no-such-command")
    assert code == 2 and "no-such-command" in one_line(err)


def test_bad_generation_setting_fails_before_loading(capsys, tiny_path):
    code, _, err = run(capsys, "generate", "--model", tiny_path, "--prompt", "x", "--temperature", "-1")
    assert code == 1
    assert "temperature" in one_line(err)  # and no "Loaded ..." line: nothing was loaded


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--llama-slots", 2], "--llama-slots need --backend llama.cpp"),
        (
            ["--llama-threads", 2, "--inexact-past-window"],
            "--llama-threads, --inexact-past-window need --backend llama.cpp",
        ),
        (["--backend", "llama.cpp", "--quantize", 4], "--quantize need --backend mlx"),
        (
            ["--backend", "llama.cpp", "--kv-bits", 8, "--dtype", "float16"],
            "--dtype, --kv-bits need --backend mlx",
        ),
        (["--base-url", "http://127.0.0.1:9", "--quantize", 4], "--quantize apply to a model loaded here"),
        (
            ["--base-url", "http://127.0.0.1:9", "--backend", "llama.cpp"],
            "--backend apply to a model loaded here",
        ),
        (
            ["--base-url", "http://127.0.0.1:9", "--llama-threads", 2],
            "--llama-threads apply to a model loaded here",
        ),
    ],
)
def test_a_load_flag_of_another_backend_fails_before_loading(capsys, tiny_path, flags, message):
    """The flags become typed load options; a flag the backend does not take names the one that does."""
    code, _, err = run(capsys, "generate", "--model", tiny_path, *flags, "--prompt", "x")
    assert code == 1
    assert message in one_line(err) and "Loaded" not in err


def test_a_bad_load_option_fails_before_loading(capsys, tiny_path):
    code, _, err = run(
        capsys,
        "generate",
        "--model",
        tiny_path,
        "--llama-slots",
        0,
        "--backend",
        "llama.cpp",
        "--prompt",
        "x",
    )
    assert code == 1
    assert "slots must be a whole number >= 1" in one_line(err)


def test_help_exits_zero(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("generate", "infill", "quantize", "build-test-model", "info", "bench"):
        assert command in out


def test_each_command_is_named_and_described_by_the_function_that_runs_it(capsys):
    """click's rule: ``_cmd_export_adapter`` runs ``export-adapter``, whose one-line help is its
    docstring's first line and whose description is the rest, shown as written (95% stays 95%)."""
    (commands,) = (a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in commands._choices_actions}
    assert set(summaries) - set(commands.choices) == set()
    for name, parser in commands.choices.items():
        if name == "bench":  # parsed by hand: its options are the benchmarks'
            continue
        handler = parser.get_default("func")
        assert handler.__name__ == "_cmd_" + name.replace("-", "_")
        first, _, rest = handler.__doc__.partition("\n")
        assert summaries[name] == first
        assert " ".join(parser.description.split()) == " ".join(rest.split()) != ""
    code, out, _ = run(capsys, "eval", "--help")
    assert code == 0 and "bootstrap 95% interval" in " ".join(out.split())
    assert cli.FILL_MARKER in commands.choices["infill"].description


# --- infill --------------------------------------------------------------------------------------------

SOURCE = 'def area(radius):\n    """Area of a circle."""\n    return <FILL>\n\n\nprint(area(2.0))\n'
HELPER = "import math\n\nPI = math.pi\n\n\ndef square(x):\n    return x * x\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    Path("geometry.py").write_text(SOURCE, encoding="utf-8")
    Path("helpers.py").write_text(HELPER, encoding="utf-8")
    return tmp_path


def test_infill_prints_only_the_middle(capsys, tiny_path, tiny_engine, project):
    prefix, suffix = SOURCE.split("<FILL>")
    expected = tiny_engine.infill(prefix, suffix, max_tokens=10)
    code, out, err = run(capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--max-tokens", 10)
    assert code == 0
    assert out == expected.text
    assert stats(err)["prompt"] == expected.prompt_tokens
    assert Path("geometry.py").read_text(encoding="utf-8") == SOURCE  # untouched without --write


def test_infill_with_repository_context(capsys, tiny_path, tiny_engine, project):
    prefix, suffix = SOURCE.split("<FILL>")
    expected = tiny_engine.infill(
        prefix,
        suffix,
        context_files=[ContextFile("helpers.py", HELPER)],
        repo_name="me/geometry",
        file_path="geometry.py",
        max_tokens=10,
    )
    plain = tiny_engine.infill(prefix, suffix, max_tokens=10)
    assert expected.prompt_tokens > plain.prompt_tokens
    code, out, err = run(
        capsys,
        "infill",
        "--model",
        tiny_path,
        "--file",
        "geometry.py",
        "--context",
        "helpers.py",
        "--repo-name",
        "me/geometry",
        "--max-tokens",
        10,
    )
    assert code == 0
    assert out == expected.text
    assert stats(err)["prompt"] == expected.prompt_tokens


def test_infill_prefix_and_suffix_options(capsys, tiny_path, tiny_engine):
    expected = tiny_engine.infill("def f(x):\n    return ", "\n\nprint(f(1))\n", max_tokens=8)
    code, out, _ = run(
        capsys,
        "infill",
        "--model",
        tiny_path,
        "--prefix",
        r"def f(x):\n    return ",
        "--suffix",
        r"\n\nprint(f(1))\n",
        "--max-tokens",
        8,
    )
    assert (code, out) == (0, expected.text)


def test_infill_end_option(capsys, tiny_path, tiny_engine):
    """--end none decodes past where the middle ends; the default stops there (a hole whose greedy
    middle goes on past its end on the tiny checkpoint, as tests/unit/test_engine_ends.py finds)."""
    prefix, suffix = "def walk(items):\n    result = 0\n    ", "\n    return result\n"
    ended = tiny_engine.infill(prefix, suffix, max_tokens=64)
    free = tiny_engine.infill(prefix, suffix, max_tokens=64, end="none")
    assert ended.middle_end == "syntax" and len(ended.text) < len(free.text)
    for option, want in (("auto", ended.text), ("none", free.text)):
        code, out, _ = run(
            capsys,
            "infill",
            "--model",
            tiny_path,
            "--prefix",
            prefix.replace("\n", r"\n"),
            "--suffix",
            suffix.replace("\n", r"\n"),
            "--max-tokens",
            64,
            "--end",
            option,
        )
        assert (code, out) == (0, want)


def test_infill_write_fills_the_file_and_keeps_a_backup(capsys, tiny_path, tiny_engine, project):
    prefix, suffix = SOURCE.split("<FILL>")
    middle = tiny_engine.infill(prefix, suffix, max_tokens=10).text
    code, out, err = run(
        capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--write", "--max-tokens", 10
    )
    assert code == 0 and out == ""
    assert Path("geometry.py").read_text(encoding="utf-8") == prefix + middle + suffix
    assert Path("geometry.py.bak").read_text(encoding="utf-8") == SOURCE
    assert "geometry.py.bak" in err
    assert hidden_entries(project) == []  # no temporary file left behind


def test_infill_write_goes_through_a_symlink(capsys, tiny_path, tiny_engine, project):
    prefix, suffix = SOURCE.split("<FILL>")
    middle = tiny_engine.infill(prefix, suffix, max_tokens=10).text
    real = project / "src" / "geometry.py"
    real.parent.mkdir()
    Path("geometry.py").rename(real)
    Path("geometry.py").symlink_to(Path("src") / "geometry.py")
    code, out, err = run(
        capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--write", "--max-tokens", 10
    )
    assert code == 0 and out == ""
    assert Path("geometry.py").is_symlink()  # still the link, and the file it points to is filled
    assert real.read_text(encoding="utf-8") == prefix + middle + suffix
    assert (real.parent / "geometry.py.bak").read_text(encoding="utf-8") == SOURCE
    assert str(real.parent / "geometry.py.bak") in err
    assert hidden_entries(project) == [] and hidden_entries(real.parent) == []


def read_only(path: Path) -> None:
    path.chmod(path.stat().st_mode & ~0o222)


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("file", "geometry.py is read-only"),
        ("folder", "Cannot write in the folder"),
        ("backup file", "geometry.py.bak exists and cannot be replaced"),
        ("backup folder", "geometry.py.bak exists and cannot be replaced"),
    ],
)
def test_infill_write_refuses_what_it_cannot_write_before_generating(
    capsys, tiny_path, project, what, message
):
    """Checked before the model is loaded. By permission bits, not only os.access: root may write
    anything, and these tests run as root and as other users alike."""
    backup = Path("geometry.py.bak")
    if what == "backup folder":
        backup.mkdir()
    elif what == "backup file":
        backup.write_text("an older backup")
    target = {"file": Path("geometry.py"), "folder": project, "backup file": backup}.get(what)
    if target is not None:
        read_only(target)
    try:
        code, out, err = run(capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--write")
    finally:
        project.chmod(0o755)
    assert code == 1 and out == ""
    assert message in one_line(err)  # and no "Loaded ..." or statistics line: nothing was generated
    assert Path("geometry.py").read_text(encoding="utf-8") == SOURCE
    if what == "backup folder":
        assert backup.is_dir() and not any(backup.iterdir())
    elif what == "backup file":
        assert backup.read_text() == "an older backup"
    else:
        assert not backup.exists()
    assert hidden_entries(project) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [("def f():\n    pass\n", "no <FILL> marker"), ("<FILL>\nx = 1\n<FILL>\n", "2 <FILL> markers")],
)
def test_infill_marker_missing_or_repeated(capsys, tiny_path, project, text, message):
    Path("bad.py").write_text(text, encoding="utf-8")
    code, out, err = run(capsys, "infill", "--model", tiny_path, "--file", "bad.py", "--write")
    assert code == 1 and out == ""
    assert message in one_line(err)
    assert Path("bad.py").read_text(encoding="utf-8") == text
    assert not Path("bad.py.bak").exists()


def test_infill_argument_conflicts(capsys, tiny_path, project):
    code, _, err = run(capsys, "infill", "--model", tiny_path, "--prefix", "x", "--write")
    assert code == 1 and "--write" in one_line(err)
    code, _, err = run(capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--prefix", "x")
    assert code == 1 and "not both" in one_line(err)
    code, _, err = run(capsys, "infill", "--model", tiny_path)
    assert code == 1 and "--file" in one_line(err)
    code, _, err = run(capsys, "infill", "--model", tiny_path, "--file", "missing.py")
    assert code == 1 and "missing.py" in one_line(err)


def test_infill_custom_marker(capsys, tiny_path, tiny_engine, project):
    Path("m.py").write_text("x = [1, 2, ???]\n", encoding="utf-8")
    expected = tiny_engine.infill("x = [1, 2, ", "]\n", max_tokens=5).text
    code, out, _ = run(
        capsys, "infill", "--model", tiny_path, "--file", "m.py", "--marker", "???", "--max-tokens", 5
    )
    assert (code, out) == (0, expected)


# --- speculative decoding and the speed line --------------------------------------------------------------

EDIT = "for i in range(10):\n    print(i)\n" * 3  # text that repeats: prompt lookup drafts from it
LONG = "".join(f"def handler_{i}(request):\n    return respond(request, code={i * 7})\n" for i in range(36))


def drafts(err: str) -> tuple[int, int]:
    """(accepted, drafted) of the statistics line; (0, 0) when it names no drafts."""
    m = re.search(r"(\d+) of (\d+) drafted tokens accepted", err)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def option_help(command: str, flag: str) -> str | None:
    parser = cli.build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next((a.help for a in commands.choices[command]._actions if flag in a.option_strings), None)


def test_generate_and_infill_take_the_prompt_lookup_option_of_serve(capsys, tiny_path, tiny_engine):
    """One option block gives --prompt-lookup to generate, infill and serve. Drafts are verified, so the
    text is the same; the speed line says how many drafted tokens were accepted."""
    assert option_help("generate", "--prompt-lookup") == option_help("infill", "--prompt-lookup")
    assert option_help("serve", "--prompt-lookup") == option_help("generate", "--prompt-lookup") is not None
    plain = tiny_engine.generate(EDIT, max_tokens=40, prompt_lookup_num_tokens=0)
    argv = ["generate", "--model", tiny_path, "--prompt", EDIT, "--max-tokens", 40]
    code, out, err = run(capsys, *argv, "--prompt-lookup", 8)
    assert (code, out) == (0, plain.text)
    accepted, drafted = drafts(err)
    assert 0 < accepted <= drafted
    code, out, err = run(capsys, *argv, "--prompt-lookup", 0)
    assert (code, out, drafts(err)) == (0, plain.text, (0, 0))
    middle = tiny_engine.infill(EDIT, "", max_tokens=40, prompt_lookup_num_tokens=0)
    argv = ["infill", "--model", tiny_path, "--prefix", EDIT, "--max-tokens", 40, "--prompt-lookup", 8]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (0, middle.text) and drafts(err)[1] > 0


def test_a_bad_prompt_lookup_fails_before_loading(capsys, tiny_path):
    code, _, err = run(capsys, "generate", "--model", tiny_path, "--prompt", "x", "--prompt-lookup", -1)
    assert code == 1
    assert "prompt_lookup_num_tokens" in one_line(err)  # and no "Loaded ..." line


def test_the_speed_line_of_a_cache_hit_says_what_was_prefilled(capsys, tiny_path, tmp_path):
    """A prompt the cache served is not a slow prompt: the line gives the prefill's tokens and time, not
    a rate of those few tokens ("778 tokens, 777 cached, 1.2 tokens/s")."""
    from langchain_starcoder.types import CompletionChunk

    hit = CompletionChunk(
        "",
        [],
        finish_reason="stop",
        prompt_tokens=778,
        cached_tokens=777,
        completion_tokens=4,
        prompt_seconds=0.8,
        generation_seconds=0.5,
    )
    assert "prompt: 778 tokens, 777 cached; prefill 1 token in 0.80 s | generation" in cli._stats(hit)
    argv = ["generate", "--model", tiny_path, "--prompt-cache-dir", tmp_path, "--max-tokens", 3]
    assert run(capsys, *argv, "--prompt", LONG)[0] == 0
    code, _, err = run(capsys, *argv, "--prompt", LONG)  # a new engine: the cache comes from the folder
    m = re.search(r"prompt: (\d+) tokens, (\d+) cached; prefill (\d+) tokens? in [\d.]+ s \| generation", err)
    assert code == 0 and m, err
    prompt, cached, prefilled = map(int, m.groups())
    assert cached > 0 and prefilled == prompt - cached > 0


# --- bench -----------------------------------------------------------------------------------------------


def test_bench_without_torch_skips_the_speculative_section_with_a_note(tmp_path):
    """Its checkpoint is trained with torch (the test extra): without it, one line in the table, no
    traceback. torch is made unimportable in every process of the run (a sitecustomize)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\n\nsys.modules['torch'] = None  # no torch\n")
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    argv = ["bench", "--preset", "tiny", "--only", "speculative", "--workdir", tmp_path / "w"]
    result = subprocess.run(
        [sys.executable, "-m", "langchain_starcoder", *map(str, argv), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    (row,) = [line for line in result.stdout.splitlines() if "Speculative decoding" in line]
    assert "skipped: torch missing" in row


def test_bench_without_the_benchmarks_package_says_how_to_run_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a checkout
    # As in an installed wheel: no checkout on the path either (an editable install puts one there).
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "benchmarks").is_dir()])
    code, _, err = run(capsys, "bench", "--help")
    assert code == 1
    assert "checkout" in one_line(err)


def test_bench_passes_its_arguments_to_the_benchmarks(capfd, monkeypatch):
    monkeypatch.chdir(REPO)
    code = cli.main(["bench", "--help"])  # a child process writes straight to the file descriptors
    out, _ = capfd.readouterr()
    assert code == 0
    assert "usage: langchain-starcoder bench" in out and "--quick" in out  # named as it was typed
    assert "python -m benchmarks" not in out
    code = cli.main(["--verbose", "bench", "--no-such-option", "value"])
    _, err = capfd.readouterr()
    assert code == 2  # the benchmarks' own parser saw the options untouched
    assert "--no-such-option" in err


def test_bench_runs_the_benchmarks_in_a_child_process():
    """The package never imports the checkout's benchmarks/ (it used to, through sys.path)."""
    code = (
        "import sys\n"
        "from langchain_starcoder.cli import main\n"
        "code = main(['bench', '--help'])\n"
        "sys.stdout.flush()\n"
        "print('RESULT', code, 'benchmarks' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert "usage: langchain-starcoder bench" in result.stdout, result.stderr
    assert result.stdout.splitlines()[-1] == "RESULT 0 False"


# --- as a program ----------------------------------------------------------------------------------------


def program(*argv: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "langchain_starcoder", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=300,
    )


def test_generate_quantizing_on_load_keeps_stdout_for_the_text(capsys, tiny_path):
    engine = StarCoderEngine.load(tiny_path, quantize=8)
    expected = engine.generate(PROMPT, max_tokens=6).text
    engine.close()
    capsys.readouterr()
    code, out, err = run(
        capsys, "generate", "--model", tiny_path, "--quantize", 8, "--prompt", PROMPT, "--max-tokens", 6
    )
    assert code == 0
    assert out == expected  # mlx-lm's "[INFO] Quantized model ..." went to stderr
    assert "Quantized model" in err


def test_python_m_generate_stdout_is_just_the_text(tiny_path, tiny_engine):
    expected = tiny_engine.generate(PROMPT, max_tokens=8).text
    result = program("generate", "--model", tiny_path, "--prompt", PROMPT, "--max-tokens", 8)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    assert "tokens/s" in result.stderr


def generate_on(stdout: int | None, stderr: int | None, tiny_path: Path) -> subprocess.Popen[str]:
    argv = ["generate", "--model", tiny_path, "--prompt", "def f(x):", "--max-tokens", 8]
    return subprocess.Popen(
        [sys.executable, "-m", "langchain_starcoder", *map(str, argv)],
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def read_terminal(fd: int) -> str:
    """What a pseudo-terminal showed until its last writer closed it."""
    shown = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every writer is gone
            break
        if not chunk:
            break
        shown += chunk
    return shown.decode()


def test_the_speeds_start_their_own_line_wherever_they_meet_the_code(tiny_path, tiny_engine):
    """The code rarely ends in a newline (8 tokens here); the stats line must not be glued to it where one
    reader sees both streams: a terminal, one pipe for both (2>&1, an IDE console), or `| tee`."""
    import pty

    text = tiny_engine.generate("def f(x):", max_tokens=8).text
    assert not text.endswith("\n")
    merged = generate_on(subprocess.PIPE, subprocess.STDOUT, tiny_path)
    out, _ = merged.communicate(timeout=300)
    assert merged.returncode == 0 and f"{text}\n[length] prompt:" in out

    main, worker = pty.openpty()
    both = generate_on(worker, worker, tiny_path)
    os.close(worker)
    shown = read_terminal(main)
    assert both.wait(timeout=300) == 0 and f"{text}\r\n[length] prompt:" in shown.replace("\r\r", "\r")
    os.close(main)

    main, worker = pty.openpty()  # | tee: stdout a pipe, stderr the terminal
    teed = generate_on(subprocess.PIPE, worker, tiny_path)
    os.close(worker)
    assert teed.stdout is not None
    piped = teed.stdout.read()
    shown = read_terminal(main)
    assert teed.wait(timeout=300) == 0 and piped == text  # stdout is still exactly the code
    assert "\r\n\r\n[length] prompt:" in shown
    os.close(main)


def test_console_script_exits_non_zero_with_one_line(tmp_path):
    script = shutil.which("langchain-starcoder", path=str(Path(sys.executable).parent))
    assert script, "pip install -e . should have installed the langchain-starcoder script"
    result = subprocess.run(
        [script, "info", "--model", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert one_line(result.stderr).startswith("langchain-starcoder: error:")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), {"supersede": True, "stable_prefix": True, "fim_mode": "psm"}),
        (
            ("--no-supersede", "--no-stable-prefix", "--fim-mode", "spm"),
            {"supersede": False, "stable_prefix": False, "fim_mode": "spm"},
        ),
    ],
)
def test_serve_hands_its_typing_options_to_the_app(capsys, monkeypatch, tiny_path, flags, expected):
    from langchain_starcoder import server

    seen: dict[str, object] = {}

    def create_app(load: object, **options: object) -> object:
        seen.update(options)
        raise KeyboardInterrupt  # stop before serving

    monkeypatch.setattr(server, "create_app", create_app)
    code, _, err = run(capsys, "serve", "--model", tiny_path, "--port", 0, *flags)
    assert code != 0 and "interrupted" in err
    assert {name: seen[name] for name in expected} == expected
