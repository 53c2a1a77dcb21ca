"""Runnable examples that are also tested: ``sse_server`` (README "asyncio")."""
