"""The LangChain surfaces import and work without LlamaIndex installed (it is the ``llama-index`` extra);
the LlamaIndex ones say how to install it, and are importable where LlamaIndex's integrations live."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from langchain_starcoder.errors import LLAMA_INDEX_MISSING

# A child in which no llama_index module can be imported, as in an environment without the extra.
BLOCK_LLAMA_INDEX = """
import sys
class _NoLlamaIndex:
    def find_spec(self, name, path=None, target=None):
        if name == "llama_index" or name.startswith("llama_index."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoLlamaIndex())
"""


def run_without_llama_index(code: str) -> subprocess.CompletedProcess[str]:
    script = BLOCK_LLAMA_INDEX + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_the_langchain_surfaces_work_without_llama_index(tiny_path: Path, chat_path: Path) -> None:
    done = run_without_llama_index(
        f"""
        from langchain_core.messages import HumanMessage
        from langchain_starcoder import (
            ChatStarCoder, FIMPromptTemplate, RepoIndex, RepoRetriever, StarCoderEngine, StarCoderLLM,
            StarCoderPromptTemplate,
        )
        llm = StarCoderLLM(model={str(tiny_path)!r}, max_tokens=4)
        chain = StarCoderPromptTemplate.from_template("def {{name}}(") | llm
        print("text:", repr(chain.invoke({{"name": "f"}})))
        print("stream:", len(list(llm.stream("x = "))))
        fim = FIMPromptTemplate() | llm
        print("fim:", repr(fim.invoke({{"prefix": "def f(", "suffix": "):\\n"}})))
        chat = ChatStarCoder(model={str(chat_path)!r}, max_tokens=4)
        print("chat:", repr(chat.invoke([HumanMessage("hi")]).content))
        retriever = RepoRetriever(index=RepoIndex({str(Path(__file__).parent)!r}), k=1)
        print("docs:", len(retriever.invoke("def test_")))
        assert not [m for m in sys.modules if m.startswith("llama_index")]
        print("clean")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "clean" in done.stdout and "docs: 1" in done.stdout


def test_the_llama_index_surfaces_say_what_to_install() -> None:
    for module in ("langchain_starcoder.llama_index", "langchain_starcoder.retrievers.llama_index"):
        done = run_without_llama_index(f"import {module}")
        assert done.returncode != 0
        assert LLAMA_INDEX_MISSING in done.stderr, done.stderr
    done = run_without_llama_index("from langchain_starcoder import RepoNodeRetriever")
    assert LLAMA_INDEX_MISSING in done.stderr, done.stderr


def test_llama_index_imports_them_as_its_own_integrations() -> None:
    import langchain_starcoder
    from langchain_starcoder.llama_index import StarCoder as Ours
    from llama_index.llms.starcoder import StarCoder
    from llama_index.retrievers.starcoder import RepoNodeRetriever

    assert StarCoder is Ours
    assert RepoNodeRetriever is langchain_starcoder.RepoNodeRetriever
