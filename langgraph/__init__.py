"""``threadloom.langgraph``: a fenced LangGraph checkpoint saver over any threadloom store (README "LangGraph").

Needs the ``langgraph`` extra (``pip install 'threadloom[langgraph]'``; from a clone: ``pip install -e
'.[langgraph]'``): without LangGraph, importing this package raises ``ModuleNotFoundError`` naming that command. The
rest of threadloom never imports LangGraph.
"""

if __name__ == "langgraph":  # pragma: no cover - a wrong sys.path, not a code path
    raise ImportError(
        "threadloom's langgraph subpackage was imported as the top-level 'langgraph' package: the threadloom "
        "source directory is on sys.path (run from another directory)"
    )

try:
    from threadloom.langgraph._readable import decode_stored
    from threadloom.langgraph.saver import ThreadloomSaver, strict_serde
except ModuleNotFoundError as error:
    if (error.name or "").partition(".")[0] not in ("langgraph", "langchain_core"):
        raise
    raise ModuleNotFoundError(
        f"threadloom.langgraph needs LangGraph, which is not installed (no module {error.name!r}): install the "
        "langgraph extra, pip install 'threadloom[langgraph]' (from a clone: pip install -e '.[langgraph]')",
        name=error.name,
    ) from error

__all__ = ["ThreadloomSaver", "decode_stored", "strict_serde"]
