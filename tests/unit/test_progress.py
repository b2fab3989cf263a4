"""Long work shows its progress on the command line and in Jupyter, and nothing in library calls unless
asked (issue 29, item 16): a conversion to GGUF, the weights build-test-model writes, a long prefill."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder._progress import progress_shown, show_progress
from langchain_starcoder.gguf_format import convert_to_gguf
from langchain_starcoder.testing import build_starcoder2

#: A prompt of about 60 tokens: more than one prefill step of PREFILL_STEP.
PROMPT = "def fibonacci(n):\n    " + "a, b = b, a + b  # the next one\n    " * 6
PREFILL_STEP = 8


def bar_totals(err: str, description: str) -> list[str]:
    """The total of each tqdm bar named ``description`` that started on stderr (``Prefill:   0%| | 0/57``;
    a bar redrawn as it advances counts once)."""
    return re.findall(rf"{re.escape(description)}: +0%\|[^|]*\| *0[\d.]*\w*/([\d.]+\w*)", err)


@pytest.fixture
def engine(tiny_path: Path):
    """The tiny model prefilled PREFILL_STEP tokens a step, without a prompt cache (each prompt prefills)."""
    engine = StarCoderEngine.load(tiny_path, prefill_step_size=PREFILL_STEP, max_prompt_caches=0)
    yield engine
    engine.close()


def test_show_progress_is_off_by_default_and_scoped_by_a_with_block() -> None:
    assert progress_shown() is False  # a test run is a library call outside Jupyter
    with show_progress():
        assert progress_shown() is True
        with show_progress(False):
            assert progress_shown() is False
        assert progress_shown() is True
    assert progress_shown() is False


def test_library_calls_print_no_progress(engine: StarCoderEngine, tmp_path: Path, capsys) -> None:
    build_starcoder2(tmp_path / "built")
    convert_to_gguf(tmp_path / "built", tmp_path / "built.gguf")
    engine.generate(PROMPT, max_tokens=2)
    engine.generate(PROMPT, max_tokens=2, prompt_lookup_num_tokens=4)  # the speculative path's prefill
    out, err = capsys.readouterr()
    assert (out, err) == ("", "")


def test_a_prefill_of_more_than_one_step_shows_a_bar_when_asked(engine: StarCoderEngine, capsys) -> None:
    with show_progress():
        plain = engine.generate(PROMPT, max_tokens=3)
        assert plain.prompt_tokens > 2 * PREFILL_STEP
        # Every prompt token but the last, which goes in with the first decode step (none cached).
        assert bar_totals(capsys.readouterr().err, "Prefill") == [str(plain.prompt_tokens - 1)]
        speculative = engine.generate(PROMPT, max_tokens=3, prompt_lookup_num_tokens=4)
        assert bar_totals(capsys.readouterr().err, "Prefill") == [str(plain.prompt_tokens - 1)]
        engine.generate("def f():", max_tokens=3)  # one step: nothing to follow
        assert "Prefill" not in capsys.readouterr().err
    assert plain.text == speculative.text  # the bar changes nothing about the answer
    engine.generate(PROMPT, max_tokens=3)  # after the block: silent again
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("lookup", [0, 4], ids=["plain", "speculative"])
def test_the_prefill_bar_counts_every_step_and_closes_before_the_first_token(
    engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch, lookup: int
) -> None:
    """Updated once a prefill step (no per-token work), and gone when the text starts."""
    import langchain_starcoder.backends.mlx as mlx_backend
    from langchain_starcoder import _progress as progress

    bars: list[list[int | str]] = []
    real_bar = progress.prefill_bar

    def recording_bar(tokens: int, step: int):
        bar = real_bar(tokens, step)
        if bar is not None:
            events: list[int | str] = []
            bars.append(events)
            update, close = bar.update, bar.close
            bar.update = lambda n=1: (events.append(n), update(n))[-1]
            bar.close = lambda: (events.append("closed"), close())[-1]
        return bar

    monkeypatch.setattr(progress, "prefill_bar", recording_bar)  # the speculative path's
    monkeypatch.setattr(mlx_backend, "prefill_bar", recording_bar)  # the plain path's
    with show_progress():
        stream = engine.stream(PROMPT, max_tokens=4, prompt_lookup_num_tokens=lookup)
        next(stream)  # the first chunk of text: the prefill is over
        (events,) = bars
        assert "closed" in events  # closed before the first token streamed
        steps = [n for n in events if n not in (0, "closed")]
        chunks = list(stream)
    prompt_tokens = chunks[-1].prompt_tokens
    assert sum(steps) == prompt_tokens - 1  # the last prompt token goes in with the first decode step
    assert len(steps) == -(-(prompt_tokens - 1) // PREFILL_STEP)  # one update a step
    assert len(bars) == 1 and [n for n in bars[0] if n not in (0, "closed")] == steps  # none while decoding


def test_build_test_model_shows_the_weights_written(tmp_path: Path, capsys) -> None:
    assert cli.main(["build-test-model", str(tmp_path / "tiny"), "--preset", "tiny"]) == 0
    err = capsys.readouterr().err
    assert "Writing random weights: 100%" in err
    assert bar_totals(err, "Writing random weights")  # a bar with its total in bytes
    assert progress_shown() is False  # the command's setting ends with it


def test_convert_to_gguf_shows_the_tensors_written(tiny_path: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "tiny.gguf"
    assert cli.main(["convert", str(tiny_path), str(out), "--outtype", "f16"]) == 0
    err = capsys.readouterr().err
    assert f"Converting {tiny_path.name} to GGUF: 100%" in err
    assert out.is_file()


def test_convert_to_q4_0_shows_the_quantizing_too(tiny_path: Path, tmp_path: Path, capsys) -> None:
    """Q4_0 is an F16 file quantized by llama-quantize: its tensors are counted from its own output."""
    out = tmp_path / "tiny-q4_0.gguf"
    assert cli.main(["convert", str(tiny_path), str(out), "--outtype", "q4_0"]) == 0
    err = capsys.readouterr().err
    assert f"Converting {tiny_path.name} to GGUF: 100%" in err
    # 2 layers of 6 linears and 2 norms (weights and biases), the final norm's 2, the embedding and the head
    tensors = 2 * (6 * 2 + 2 * 2) + 2 + 2
    assert bar_totals(err, f"Quantizing {tiny_path.name} to Q4_0") == [str(tensors)]
    assert f"Quantizing {tiny_path.name} to Q4_0: 100%" in err


def test_a_failing_llama_quantize_still_says_why(capsys) -> None:
    from langchain_starcoder.gguf_format.write import _run_quantize

    script = "import sys; print('[   1/   3] token_embd.weight'); sys.exit('out of memory')"
    with show_progress():
        returncode, output = _run_quantize([sys.executable, "-c", script], "Quantizing x to Q4_0")
    assert returncode == 1 and "out of memory" in output  # stderr kept with stdout, for the error
    err = capsys.readouterr().err
    assert set(bar_totals(err, "Quantizing x to Q4_0")) == {"3"} and "100%" not in err  # not shown as done


def test_generate_shows_a_prefill_of_more_than_one_step(small_path: Path, capsys) -> None:
    """The small preset prefills about 950 tokens a step on the CPU (the tiny one 2,048: all its context)."""
    engine = StarCoderEngine.load(small_path)
    step = engine.backend._prefill_chunk
    long_prompt = PROMPT * (step // engine.count_tokens(PROMPT) + 2)
    assert step < engine.count_tokens(long_prompt) < engine.context_window - 8
    engine.close()
    argv = ["generate", "--model", str(small_path), "--max-tokens", "2", "--prompt"]
    assert cli.main([*argv, PROMPT]) == 0
    assert "Prefill" not in capsys.readouterr().err
    assert cli.main([*argv, long_prompt]) == 0
    assert len(bar_totals(capsys.readouterr().err, "Prefill")) == 1


def test_a_jupyter_kernel_shows_progress_as_a_widget(tmp_path: Path) -> None:
    """In a notebook progress is on by default, drawn as an ipywidgets bar (no 'IProgress not found')."""
    import nbformat
    from nbclient import NotebookClient

    code = (
        "from langchain_starcoder._progress import progress_bar, progress_shown\n"
        "print('shown:', progress_shown())\n"
        "with progress_bar(3, 'Converting x to GGUF', 'B') as bar:\n"
        "    bar.update(3)\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    resources = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources).execute()
    outputs = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "shown: True" in text
    assert "IProgress" not in text and "ipywidgets" not in text
    widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widgets) == 1  # tqdm's notebook bar, not text


def test_a_plain_python_process_shows_none(tmp_path: Path) -> None:
    import subprocess

    code = "from langchain_starcoder._progress import progress_shown; print(progress_shown())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
