"""``serve --adapter NAME=DIR`` (issue 41): several adapters on one base, each picked per request by OpenAI's
``model`` field or llama.cpp's ``lora`` field, answering as an engine loaded with that adapter alone; the
adapters share the base's weight arrays (``StarCoderEngine.with_adapter``), never its prompt caches; bad
selections are clear 400/404 answers and the server goes on; the command line checks before serving."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.errors import CheckpointError, InvalidParameterError, ModelNotFoundError
from langchain_starcoder.fim.request import FIMRequest
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.adapters import build_adapter
from langchain_starcoder.testing.servers import ServerThread, free_port, wait_healthy

PROMPT = "def parse(line):\n    fields = line.split(',')\n"
PREFIX, SUFFIX = "def mean(values):\n    ", "\n    return total / len(values)\n"
GREEDY = {"max_tokens": 12, "temperature": 0.0}


@pytest.fixture(scope="module")
def adapters(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two adapters of the tiny checkpoint, strong enough that each changes the greedy text."""
    root = tmp_path_factory.mktemp("served-adapters")
    return {
        "mine": build_adapter(tiny_path, root / "mine", seed=1, strength=0.5),
        "theirs": build_adapter(tiny_path, root / "theirs", method="dora", seed=2, strength=0.5),
    }


@pytest.fixture(scope="module")
def alone(tiny_path: Path, adapters: dict[str, Path]) -> Iterator[dict[str, StarCoderEngine]]:
    """The base ("tiny") and an engine loaded with each adapter alone: what each selection must answer."""
    engines = {"tiny": StarCoderEngine.load(tiny_path)}
    engines |= {name: StarCoderEngine.load(tiny_path, adapter_path=path) for name, path in adapters.items()}
    yield engines
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="module")
def served(tiny_path: Path, adapters: dict[str, Path]) -> Iterator[str]:
    """A server of the base with both adapters (lora ids: mine 0, theirs 1)."""
    base = StarCoderEngine.load(tiny_path)
    running = ServerThread(create_app(base, model_name="tiny", adapters=adapters))
    yield running.url
    running.stop()
    base.close()


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, timeout=120)


def ok(url: str, body: dict) -> dict:
    reply = post(url, body)
    assert reply.status_code == 200, reply.text
    return reply.json()


# --- StarCoderEngine.with_adapter --------------------------------------------------------------------


@pytest.mark.parametrize("quantize", [None, 8])
def test_with_adapter_shares_the_base_weights(
    tiny_path: Path, adapters: dict[str, Path], quantize: int | None
) -> None:
    """The adapter's engine holds the base's very weight arrays (quantized ones too), costs about its own
    tensors in MLX's memory, answers as the adapter loaded alone, and closing either leaves the other."""
    base = StarCoderEngine.load(tiny_path, quantize=quantize)
    weights = tree_flatten(base.backend.model.parameters())
    before = mx.get_active_memory()
    adapted = base.with_adapter(adapters["mine"])
    grown = mx.get_active_memory() - before
    held = {id(a) for _, a in tree_flatten(adapted.backend.model.parameters())}
    assert all(id(a) in held for _, a in weights)
    assert grown < sum(a.nbytes for _, a in weights) / 4  # the adapter's tensors, not a second base
    alone = StarCoderEngine.load(tiny_path, quantize=quantize, adapter_path=adapters["mine"])
    try:
        text = adapted.generate(PROMPT, **GREEDY).text
        assert text == alone.generate(PROMPT, **GREEDY).text != base.generate(PROMPT, **GREEDY).text
        assert adapted.adapter.path == adapters["mine"].absolute() and base.adapter is None
        base.close()  # the base's engine closed: the adapter's runs on (the arrays live on)
        assert adapted.generate(PROMPT, **GREEDY).text == text
    finally:
        for engine in (adapted, alone, base):
            engine.close()


def test_with_adapter_keeps_its_own_prompt_cache_files(
    tiny_path: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """Engines of one base over one cache folder: an adapter's engine (with_adapter) writes files under its
    adapter's partition, which the base never reads, and which the same adapter loaded alone in a later
    engine does (the same weights digest, settings and adapter: one key)."""
    prompt = "# kept on disk\n" + PROMPT * 12
    base = StarCoderEngine.load(tiny_path, prompt_cache_dir=tmp_path)
    shared = base.with_adapter(adapters["mine"])
    try:
        texts = {"tiny": base.generate(prompt, **GREEDY), "mine": shared.generate(prompt, **GREEDY)}
        assert texts["mine"].cached_tokens == 0 and texts["tiny"].text != texts["mine"].text
    finally:
        shared.close()  # (its queued write lands first)
        base.close()
    for name, adapter in (("mine", adapters["mine"]), ("tiny", None), ("theirs", adapters["theirs"])):
        later = StarCoderEngine.load(tiny_path, adapter_path=adapter, prompt_cache_dir=tmp_path)
        try:
            again = later.generate(prompt, **GREEDY)
        finally:
            later.close()
        if name == "theirs":
            assert again.cached_tokens == 0  # no other adapter's file is read
        else:
            assert again.text == texts[name].text and again.cached_tokens > 32, name  # its own file


def test_with_adapter_refuses_what_cannot_share(
    tiny_path: Path, small_path: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """An engine that runs an adapter already, a missing folder, an adapter of another base: clear errors
    before any weight is touched, and the base goes on answering."""
    base = StarCoderEngine.load(tiny_path)
    with_one = StarCoderEngine.load(tiny_path, adapter_path=adapters["mine"])
    other = build_adapter(small_path, tmp_path / "small-adapter")
    try:
        expected = base.generate(PROMPT, **GREEDY).text
        with pytest.raises(InvalidParameterError, match=r"runs the adapter .* already"):
            with_one.with_adapter(adapters["theirs"])
        with pytest.raises(ModelNotFoundError, match="does not exist"):
            base.with_adapter(tmp_path / "nowhere")
        with pytest.raises(CheckpointError, match=r"was trained on .*hidden size 256.*hidden size 64"):
            base.with_adapter(other)
        assert base.generate(PROMPT, **GREEDY).text == expected
    finally:
        base.close()
        with_one.close()


# --- picking a model per request ---------------------------------------------------------------------


def test_the_model_field_picks_the_base_or_an_adapter(served: str, alone: dict[str, StarCoderEngine]) -> None:
    """/v1/completions (plain and with a suffix) answers as the engine of the model named, and says which."""
    texts = {}
    for name, engine in alone.items():
        body = {"model": name, "prompt": PROMPT, **GREEDY}
        answer = ok(f"{served}/v1/completions", body)
        assert answer["model"] == name
        texts[name] = answer["choices"][0]["text"]
        assert texts[name] == engine.generate(PROMPT, **GREEDY).text
        hole = ok(f"{served}/v1/completions", {"model": name, "prompt": PREFIX, "suffix": SUFFIX, **GREEDY})
        assert hole["choices"][0]["text"] == engine.infill(FIMRequest(PREFIX, SUFFIX), **GREEDY).text
    assert len(set(texts.values())) == 3  # each model answers its own
    no_model = ok(f"{served}/v1/completions", {"prompt": PROMPT, **GREEDY})  # no model: the base
    assert no_model["choices"][0]["text"] == texts["tiny"]


def test_requests_to_several_models_at_once_each_answer_as_alone(
    served: str, alone: dict[str, StarCoderEngine]
) -> None:
    """Each model runs on its own worker over the same arrays: requests to all three at once (two each)
    answer each as its model alone."""
    prompts = [PROMPT, "import os\n\ndef walk(root):\n"]
    asks = [(name, prompt) for name in alone for prompt in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        answers = list(
            pool.map(
                lambda a: ok(f"{served}/v1/completions", {"model": a[0], "prompt": a[1], **GREEDY}), asks
            )
        )
    for (name, prompt), answer in zip(asks, answers, strict=True):
        assert answer["choices"][0]["text"] == alone[name].generate(prompt, **GREEDY).text, name


def test_chat_picks_an_adapter_by_model(chat_path: Path, tmp_path: Path) -> None:
    """/v1/chat/completions with ``model`` set to an adapter answers as a server of the engine loaded with
    that adapter alone (and says which model answered)."""
    folder = build_adapter(chat_path, tmp_path / "chat-lora", seed=3, strength=0.5)
    base = StarCoderEngine.load(chat_path)
    alone = StarCoderEngine.load(chat_path, adapter_path=folder)
    servers = [ServerThread(create_app(base, model_name="chat", adapters={"mine": folder}))]
    servers.append(ServerThread(create_app(alone, model_name="chat")))
    ask = {"messages": [{"role": "user", "content": "Write a sorting function."}], **GREEDY}
    try:
        mine = ok(f"{servers[0].url}/v1/chat/completions", {"model": "mine", **ask})
        plain = ok(f"{servers[0].url}/v1/chat/completions", {"model": "chat", **ask})
        reference = ok(f"{servers[1].url}/v1/chat/completions", ask)
        assert mine["model"] == "mine" and plain["model"] == "chat"
        text = mine["choices"][0]["message"]["content"]
        assert (
            text == reference["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"]
        )
    finally:
        for running in servers:
            running.stop()
        base.close()
        alone.close()


def test_a_remote_engine_refuses_with_adapter(
    served: str, tiny_path: Path, adapters: dict[str, Path]
) -> None:
    """An engine of a server's model cannot add an adapter here (the server applies its own): the error says
    how (vLLM's --lora-modules, connect's adapter=), and the engine goes on answering."""
    remote = StarCoderEngine.connect(served, model="tiny", tokenizer=tiny_path, timeout=60)
    try:
        with pytest.raises(
            InvalidParameterError, match=r"--lora-modules NAME=DIR, then connect\(\.\.\., adapter=NAME\)"
        ):
            remote.with_adapter(adapters["mine"])
        assert remote.generate(PROMPT, **GREEDY).text
    finally:
        remote.close()


def test_the_lora_field_picks_the_base_or_an_adapter(served: str, alone: dict[str, StarCoderEngine]) -> None:
    """/completion and /infill with llama.cpp's lora field (ids in the order given) answer as that
    adapter's engine; scale 0 (or no field) is the base."""
    picks = {
        "mine": [{"id": 0, "scale": 1.0}],
        "theirs": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1}],
        "tiny": [{"id": 0, "scale": 0}],
    }
    for name, lora in picks.items():
        engine = alone[name]
        answer = ok(
            f"{served}/completion", {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "lora": lora}
        )
        assert answer["content"] == engine.generate(PROMPT, **GREEDY).text
        body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "lora": lora}
        infilled = ok(f"{served}/infill", body)
        assert infilled["content"] == engine.infill(FIMRequest(PREFIX, SUFFIX), **GREEDY).text
    plain = ok(f"{served}/completion", {"prompt": PROMPT, "n_predict": 12, "temperature": 0})
    assert plain["content"] == alone["tiny"].generate(PROMPT, **GREEDY).text


def test_models_and_lora_adapters_list_what_is_served(served: str, adapters: dict[str, Path]) -> None:
    """/v1/models: the base, then each adapter with its folder as root and the base as parent (vLLM's
    shape); /lora-adapters: llama-server's id, path and scale."""
    cards = httpx.get(f"{served}/v1/models").json()["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [("tiny", None), ("mine", "tiny"), ("theirs", "tiny")]
    assert [c["root"] for c in cards[1:]] == [str(adapters["mine"]), str(adapters["theirs"])]
    assert all(c["object"] == "model" and c["max_model_len"] == 2048 for c in cards)
    listed = httpx.get(f"{served}/lora-adapters").json()
    assert listed == [
        {"id": 0, "path": str(adapters["mine"]), "scale": 0.0},
        {"id": 1, "path": str(adapters["theirs"]), "scale": 0.0},
    ]


@pytest.mark.parametrize(
    ("path", "pick", "status", "says"),
    [
        (
            "/v1/completions",
            {"model": "yours"},
            404,
            "The model `yours` does not exist here; this server has `tiny`, `mine`, `theirs`",
        ),
        ("/v1/completions", {"lora": [{"id": 0, "scale": 1}]}, 400, "picks an adapter by model"),
        ("/completion", {"lora": [{"id": 0, "scale": 0.5}]}, 400, "a scale other than 1"),
        (
            "/infill",
            {"lora": [{"id": 0, "scale": 1}, {"id": 1, "scale": 1}]},
            400,
            "several adapters at once",
        ),
        (
            "/completion",
            {"lora": [{"id": 2, "scale": 1}]},
            400,
            "invalid adapter id 2: the adapters here have ids 0 to 1",
        ),
        ("/infill", {"lora": {"id": 0}}, 400, "lora must be a list"),
        ("/completion", {"lora": [{"id": "mine", "scale": 1}]}, 400, "lora must be a list"),
    ],
)
def test_a_bad_selection_is_refused_and_the_server_goes_on(
    served: str, alone: dict[str, StarCoderEngine], path: str, pick: dict, status: int, says: str
) -> None:
    body = {"prompt": PROMPT, "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4, "max_tokens": 4}
    reply = post(f"{served}{path}", body | pick)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert says in error["message"] and error["param"] in ("model", "lora")
    if status == 404:
        assert (error["type"], error["code"]) == ("invalid_request_error", "model_not_found")
    answer = ok(f"{served}/v1/completions", {"model": "mine", "prompt": PROMPT, **GREEDY})
    assert answer["choices"][0]["text"] == alone["mine"].generate(PROMPT, **GREEDY).text


def test_the_prompt_cache_never_serves_one_models_kv_to_another(served: str) -> None:
    """The same prompt to the base and to each adapter: different answers, and a cache hit only on a
    model's own second request (each adapter's engine keeps its own caches, under its own partition)."""
    prompt = "# a module no request before sent\n" + PROMPT * 6  # (no prefix shared with the others)
    picks = {"tiny": [], "mine": [{"id": 0, "scale": 1}], "theirs": [{"id": 1, "scale": 1}]}

    def ask(lora: list) -> dict:
        body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "lora": lora}
        return ok(f"{served}/completion", body)

    first = {name: ask(lora) for name, lora in picks.items()}
    assert [a["tokens_cached"] for a in first.values()] == [0, 0, 0]
    assert len({a["content"] for a in first.values()}) == 3
    for name, lora in picks.items():
        again = ask(lora)
        assert again["content"] == first[name]["content"] and again["tokens_cached"] > 0


@pytest.fixture
def typing_server(tiny_path: Path, adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """A server that batches (a 300 ms window) whose base holds its first generation's first token until
    ``release`` is set (so a later request finds it running): (its url, started, release)."""
    base = StarCoderEngine.load(tiny_path)
    started, release, submit = threading.Event(), threading.Event(), base.backend.submit

    def held(generations: list) -> object:
        if not started.is_set():
            sink = generations[0].sink
            token = sink.token

            def first(token_id: int) -> bool:
                started.set()
                release.wait(60)
                sink.token = token
                return token(token_id)

            sink.token = first
        return submit(generations)

    monkeypatch.setattr(base.backend, "submit", held)
    running = ServerThread(create_app(base, model_name="tiny", adapters=adapters, batch_window_ms=300))
    yield running.url, started, release
    release.set()
    running.stop()
    base.close()


def test_a_request_to_one_model_never_supersedes_or_joins_another_models(
    typing_server: tuple, alone: dict[str, StarCoderEngine]
) -> None:
    """The same document asked of the base and of an adapter at once: neither cancels the other (each model
    has its own documents); two requests of one batch window run each on its own model (a batch is one
    model's)."""
    url, started, release = typing_server
    hole = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "file_path": "a.py", "n_predict": 12}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        older = pool.submit(ok, f"{url}/infill", hole)
        assert started.wait(60)
        newer = ok(f"{url}/infill", hole | {"lora": [{"id": 0, "scale": 1}]})
        release.set()
        expected = {
            name: alone[name].infill(FIMRequest(PREFIX, SUFFIX, file_path="a.py"), **GREEDY) for name in alone
        }
        assert newer["content"] == expected["mine"].text
        assert older.result()["stop_type"] != "cancelled"
        assert older.result()["content"] == expected["tiny"].text
        asked = {
            name: pool.submit(ok, f"{url}/v1/completions", {"model": name, "prompt": PROMPT, **GREEDY})
            for name in ("tiny", "mine")
        }
        for name, answer in asked.items():
            assert answer.result()["choices"][0]["text"] == alone[name].generate(PROMPT, **GREEDY).text


def test_llama_cpp_serves_named_adapters_each_in_a_server_of_its_own(
    clean_path: Path, adapters: dict[str, Path], gguf_cache: Path
) -> None:
    """On the managed llama.cpp backend, with_adapter is a llama-server of its own over the same base GGUF
    with --lora: it answers as the engine loaded with that adapter; the server picks it by model and lora."""
    settings = {"threads": 1, "slots": 1, "server_args": ("-fa", "off", "-ctk", "f32", "-ctv", "f32")}
    base = StarCoderEngine.load(clean_path, backend="llama.cpp", llama_cpp=settings)
    alone = StarCoderEngine.load(
        clean_path, backend="llama.cpp", llama_cpp=settings, adapter_path=adapters["mine"]
    )
    running = None
    try:
        adapted = base.with_adapter(adapters["mine"])
        expected = alone.generate(PROMPT, **GREEDY).text
        assert adapted.generate(PROMPT, **GREEDY).text == expected != base.generate(PROMPT, **GREEDY).text
        assert adapted.backend.server.gguf == base.backend.server.gguf  # the one base file, not a copy
        adapted.close()
        running = ServerThread(create_app(base, model_name="tiny", adapters={"mine": adapters["mine"]}))
        by_model = ok(f"{running.url}/v1/completions", {"model": "mine", "prompt": PROMPT, **GREEDY})
        by_lora = ok(
            f"{running.url}/completion", {"prompt": PROMPT, "n_predict": 12, "lora": [{"id": 0, "scale": 1}]}
        )
        assert by_model["choices"][0]["text"] == by_lora["content"] == expected
        with pytest.raises(InvalidParameterError, match=r"--fused"):
            base.with_adapter(adapters["theirs"])  # (llama.cpp runs LoRA only: merge a DoRA adapter)
    finally:
        if running is not None:
            running.stop()
        base.close()
        alone.close()


# --- the command line --------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str]:
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_serve_takes_named_adapters_and_serves_them(
    tiny_path: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """``serve --adapter mine=DIR --adapter theirs=DIR``: a real serve process lists and runs both."""
    port = free_port()
    named = [f"--adapter={name}={path}" for name, path in adapters.items()]
    command = [sys.executable, "-m", "langchain_starcoder", "serve", "--model", str(tiny_path), *named]
    log = (tmp_path / "serve.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        assert [c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]][1:] == ["mine", "theirs"]
        for name in ("mine", "theirs"):
            assert ok(f"{url}/v1/completions", {"model": name, "prompt": PROMPT, **GREEDY})["model"] == name
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert "served as model 'theirs'" in (tmp_path / "serve.log").read_text()


def test_serve_refuses_bad_adapters_before_serving(
    capsys: pytest.CaptureFixture[str],
    tiny_path: Path,
    small_path: Path,
    adapters: dict[str, Path],
    tmp_path: Path,
) -> None:
    """A name given twice, a bare DIR among named ones, a missing folder, an adapter of another base:
    one line each, and the command stops before it serves (nothing loads, no port is taken)."""
    other = build_adapter(small_path, tmp_path / "small-adapter")
    mine, theirs = adapters["mine"], adapters["theirs"]
    cases = [
        ([f"a={mine}", f"a={theirs}"], "--adapter names 'a' twice"),
        ([str(mine), f"b={theirs}"], "has no name: one adapter alone may be given as DIR"),
        ([f"a={tmp_path / 'nowhere'}"], "does not exist"),
        ([f"a={mine}", f"small={other}"], "was trained on"),
    ]
    for values, says in cases:
        flags = [f"--adapter={value}" for value in values]
        code, err = run(capsys, "serve", "--model", tiny_path, "--port", 0, *flags)
        assert code != 0 and says in err and "Serving" not in err, err
    code, err = run(capsys, "serve", "--model", tiny_path, "--backend", "llama.cpp", f"--adapter=d={theirs}")
    assert code != 0 and "is dora, which llama.cpp cannot run" in err and "Serving" not in err, err


def test_serve_checks_an_adapter_against_a_hub_models_cached_config(
    capsys: pytest.CaptureFixture[str],
    small_path: Path,
    adapters: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hub id whose config.json is in the local hub cache is checked before serving too (nothing is
    downloaded): the tiny checkpoint's adapter on a model of the small preset's shape is refused."""
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--someone--small" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_bytes((small_path / "config.json").read_bytes())
    (tmp_path / "hub" / "models--someone--small" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--small" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code, err = run(
        capsys, "serve", "--model", "someone/small", "--port", 0, f"--adapter=a={adapters['mine']}"
    )
    assert code != 0 and "was trained on" in err and "someone/small is starcoder2, hidden size 256" in err, (
        err
    )
