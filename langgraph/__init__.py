"""``threadloom.langgraph``: a fenced LangGraph checkpoint saver over any threadloom store (README "LangGraph").

Needs the ``langgraph`` extra (from a clone: ``pip install -e '.[langgraph]'``); the rest of threadloom never imports
LangGraph.
"""

if __name__ == "langgraph":  # pragma: no cover - a wrong sys.path, not a code path
    raise ImportError(
        "threadloom's langgraph subpackage was imported as the top-level 'langgraph' package: the threadloom "
        "source directory is on sys.path (run from another directory)"
    )

from threadloom.langgraph.saver import ThreadloomSaver

__all__ = ["ThreadloomSaver"]
