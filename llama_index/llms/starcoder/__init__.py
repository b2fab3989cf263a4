"""StarCoder2 on MLX as a LlamaIndex LLM, where LlamaIndex's integrations live.

``pip install -e ".[llama-index]"`` (in a checkout), then
``from llama_index.llms.starcoder import StarCoder``.
The class is :class:`langchain_starcoder.llama_index.StarCoder`: one engine registry for every surface.
"""

from langchain_starcoder.llama_index import StarCoder

__all__ = ["StarCoder"]
