"""Tools the agent calls: a sandboxed Python interpreter and passage search."""

from copes_lib.tools import isolation
from copes_lib.tools.sandbox import CodeSandboxConfig, PythonSandbox, SandboxResult, python_error
from copes_lib.tools.search import BM25Retriever, Passage, Retriever, format_passages

__all__ = ["isolation", "PythonSandbox", "CodeSandboxConfig", "SandboxResult", "python_error",
           "Passage", "Retriever", "BM25Retriever", "format_passages"]
