"""A small asyncio HTTP server that starts runs and streams their events as server-sent events (README "asyncio").

Standard library only (``asyncio.start_server``), one event loop, no thread per client: a stream is an
``async for`` over a :class:`~threadloom.actors.subscription.Subscription`, woken by the store's watcher.

Routes:

* ``POST /threads/<thread_id>/runs`` with a JSON body ``{"graph": "<graph_id>", "input": ..., "tenant": ...}``
  starts a run (``await runtime.astart``; with ``"resume": true``, ``aresume``) and streams that run's events
  until its end event (``threadloom.run_completed``, ``run_suspended`` or ``run_failed``), then closes the
  stream. Errors before the stream: 400 (bad input), 403 (another tenant's thread),
  404 (unknown graph or route), 409 (the thread is busy, or its state does not allow the run).
* ``GET /threads/<thread_id>/events`` streams the thread's events from ``Last-Event-ID`` (or ``?after=N``;
  default 0) until the client goes away; ``?until_run=<run_id>`` ends it after that run's end event. A thread
  that does not exist yet answers 200 and an open stream that stays empty until its first event, so a client may
  subscribe before it starts the run (no event is missed); a deleted thread ends the stream with an error message.

Each event is one SSE message: ``id`` is the event's ``seq`` (a client reconnects with ``Last-Event-ID`` and misses
nothing), ``event`` its type, ``data`` the JSON of ``{"seq", "run_id", "type", "payload"}``.

Run it (``[STORE_URL [PORT]]``; defaults ``sqlite:///threadloom.db`` in the working directory and port 8080, port 0:
any free one). It prints one line, ``listening on http://127.0.0.1:PORT (store URL)``, and serves until Ctrl-C or
SIGTERM (exit status 0). A bad argument, a bad store URL included, is one line on stderr and exit status 2; a store
that cannot be opened or a port that cannot be listened on, one line and exit status 1::

    python -m threadloom.examples.sse_server sqlite:///demo.db 8080
    curl -N -X POST localhost:8080/threads/t1/runs -d '{"graph": "echo", "input": {"text": "hello"}}'
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from threadloom.actors.graph import Graph, Step
from threadloom.actors.runtime import GraphRuntime
from threadloom.domain.errors import (
    InvalidRunState,
    TenantMismatch,
    ThreadBusy,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.values import EventRecord
from threadloom.persistence.base import Checkpointer

MAX_BODY = 1024 * 1024
"""The longest request body the server reads (bytes)."""
MAX_HEAD = 64 * 1024
"""The longest request line and headers the server reads (bytes); a longer head is answered 431."""
HEAD_TIMEOUT_S = 30.0
"""How long, in seconds, a client may take to send its request (head and body) before it is answered 408."""
MAX_DIGITS = 19
"""The most digits a number in a request (``Content-Length``, ``Last-Event-ID``, ``after``) may have."""

_REASONS = {
    200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 408: "Request Timeout", 409: "Conflict",
    413: "Too Large", 431: "Request Header Fields Too Large",
}  # fmt: skip


class DuplicateKey(ValueError):
    """A JSON object of a request body names ``key`` twice (``json.loads`` would keep the last value silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    made: dict[str, Any] = {}
    for key, value in pairs:
        if key in made:
            raise DuplicateKey(key)
        made[key] = value
    return made


class HttpError(Exception):
    """An error answered before the stream starts."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def sse_message(event: EventRecord) -> bytes:
    """One server-sent event for ``event``."""
    data = json.dumps({"seq": event.seq, "run_id": event.run_id, "type": event.type, "payload": event.payload})
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


class SseServer:
    """Serves ``graphs`` (by ``graph_id``) on ``runtime`` over HTTP/1.1; one connection is one request.

    Args:
        runtime: the runtime that runs the graphs (the caller owns and closes it).
        graphs: the graphs a request may name.
    """

    def __init__(self, runtime: GraphRuntime, graphs: Mapping[str, Graph]) -> None:
        self.runtime = runtime
        self.graphs = dict(graphs)
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        """The port the server listens on (after :meth:`start`)."""
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> SseServer:
        """Starts listening (port 0: any free port)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)
        return self

    async def close(self) -> None:
        """Stops listening and ends every open stream."""
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            try:
                method, target, headers, body = await asyncio.wait_for(_read_request(reader), HEAD_TIMEOUT_S)
            except asyncio.LimitOverrunError:
                raise HttpError(431, f"the request head is over {MAX_HEAD} bytes") from None
            except TimeoutError:
                raise HttpError(408, f"the request did not arrive within {HEAD_TIMEOUT_S} s") from None
            await self._route(method, target, headers, body, writer, reader)
        except HttpError as error:
            await _answer(writer, error.status, {"error": str(error)})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # the server closes
        finally:
            self._clients.discard(task)
            writer.close()

    async def _route(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
    ) -> None:
        url = urlsplit(target)
        parts = url.path.strip("/").split("/")
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        if len(parts) == 3 and parts[0] == "threads" and parts[2] == "runs" and method == "POST":
            await self._run(parts[1], body, writer, reader)
        elif len(parts) == 3 and parts[0] == "threads" and parts[2] == "events" and method == "GET":
            after = _number(headers.get("last-event-id") or query.get("after") or "0")
            if after is None or after >= 2**63:
                raise HttpError(400, "Last-Event-ID and after must be event numbers")
            await self._events(parts[1], after, query.get("until_run"), query.get("tenant"), writer, reader)
        else:
            raise HttpError(404, f"no route {method} {url.path}")

    async def _run(
        self, thread_id: str, body: bytes, writer: asyncio.StreamWriter, reader: asyncio.StreamReader
    ) -> None:
        try:
            request = json.loads(body or b"{}", object_pairs_hook=_unique_keys)
        except DuplicateKey as error:
            raise HttpError(400, f"the body names the key {error.key!r} twice in one object") from None
        except ValueError:
            raise HttpError(400, "the body is not JSON") from None
        if not isinstance(request, dict):
            raise HttpError(400, "the body must be a JSON object")
        name = request.get("graph", "")
        if not isinstance(name, str):
            raise HttpError(400, "graph must be a string, a graph_id")
        graph = self.graphs.get(name)
        if graph is None:
            raise HttpError(404, f"no graph {request.get('graph')!r}")
        tenant = request.get("tenant")
        runtime = self.runtime
        try:
            start = runtime.aresume if request.get("resume") is True else runtime.astart
            handle = await start(thread_id, graph, request.get("input"), tenant)
        except ValidationError as error:
            raise HttpError(400, str(error)) from None
        except TenantMismatch as error:
            raise HttpError(403, str(error)) from None
        except (ThreadBusy, InvalidRunState) as error:
            raise HttpError(409, str(error)) from None
        subscription = runtime.subscribe(thread_id, tenant_id=tenant, until_run_end=handle.run_id)
        outcome = asyncio.ensure_future(_outcome(handle))
        # A run that is cancelled or loses its claim writes no end event: end the stream with its handle.

        def ended(done: asyncio.Future[str | None]) -> None:
            if not done.cancelled() and done.result() is not None:
                subscription.cancel()

        outcome.add_done_callback(ended)
        try:
            await _stream(writer, reader, subscription, run_id=handle.run_id)
            if outcome.done() and outcome.result() is not None:
                writer.write(f"event: error\ndata: {json.dumps({'error': outcome.result()})}\n\n".encode())
                await writer.drain()
        finally:
            outcome.cancel()  # stops awaiting the handle only: the run goes on

    async def _events(
        self,
        thread_id: str,
        after: int,
        until_run: str | None,
        tenant: str | None,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
    ) -> None:
        try:
            subscription = self.runtime.subscribe(thread_id, after, tenant_id=tenant, until_run_end=until_run)
        except ValidationError as error:
            raise HttpError(400, str(error)) from None
        except TenantMismatch as error:
            raise HttpError(403, str(error)) from None
        await _stream(writer, reader, subscription)


def _number(text: str) -> int | None:
    """``text`` as a non-negative integer of ASCII digits (at most :data:`MAX_DIGITS`), else None."""
    if not text or len(text) > MAX_DIGITS or not text.isascii() or not text.isdigit():
        return None
    return int(text)


async def _outcome(handle: Any) -> str | None:
    """None when the run ended with an end event (well, or ``RunFailed``), else the error's text."""
    try:
        await handle
    except ThreadloomError as error:
        from threadloom.domain.errors import RunFailed

        return None if isinstance(error, RunFailed) else f"{type(error).__name__}: {error}"
    return None


async def _stream(
    writer: asyncio.StreamWriter, reader: asyncio.StreamReader, subscription: Any, *, run_id: str | None = None
) -> None:
    """Writes the stream's head, then each event of ``subscription`` (of ``run_id`` only, when given).

    A client that closes its side ends the stream at once, even while no event comes (the subscription is
    cancelled: nothing is left waiting for a client that went away)."""
    gone = asyncio.ensure_future(_client_gone(reader))
    gone.add_done_callback(lambda _done: subscription.cancel())
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n"
    )
    try:
        await writer.drain()
        async for event in subscription:
            if run_id is None or event.run_id == run_id:
                writer.write(sse_message(event))
                await writer.drain()
    except ThreadloomError as error:  # the thread was deleted, the store closed...: say so, end the stream
        writer.write(f"event: error\ndata: {json.dumps({'error': str(error)})}\n\n".encode())
        await writer.drain()
    finally:
        gone.cancel()
        subscription.cancel()


async def _client_gone(reader: asyncio.StreamReader) -> None:
    """Returns once the client closed its side of the connection (it sends nothing more on a stream)."""
    try:
        while await reader.read(4096):
            pass
    except ConnectionError:
        pass


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError:
        raise HttpError(400, "bad request line") from None
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    text = headers.get("content-length", "0")
    if len(text) > MAX_DIGITS and text.isascii() and text.isdigit():
        raise HttpError(413, f"the body is over {MAX_BODY} bytes")
    length = _number(text)
    if length is None:
        raise HttpError(400, "bad content-length")
    if length > MAX_BODY:
        raise HttpError(413, f"the body is over {MAX_BODY} bytes")
    body = await reader.readexactly(length) if length else b""
    return method, target, headers, body


async def _answer(writer: asyncio.StreamWriter, status: int, document: Any) -> None:
    body = json.dumps(document).encode()
    writer.write(
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body
    )
    try:
        await writer.drain()
    except ConnectionError:
        pass


async def _echo(state: Any, ctx: Any) -> Step:
    """The demo graph's node: streams the input's words back, one event each."""
    for word in str(state.get("text", "")).split():
        await asyncio.sleep(0.05)  # an LLM client's await, say
        ctx.emit("token", {"text": word})
    return Step.end(state)


ECHO = Graph("echo", {"echo": _echo}, entry="echo")
"""A demo graph: one async node that emits each word of ``input["text"]`` as a ``token`` event."""


DEFAULT_URL = "sqlite:///threadloom.db"
"""The store the program serves when run without arguments (a file in the working directory)."""
DEFAULT_PORT = 8080
"""The port the program listens on when none is given."""
USAGE = "usage: python -m threadloom.examples.sse_server [STORE_URL [PORT]]"


async def main(url: str, port: int, store: Checkpointer | None = None) -> None:  # pragma: no cover - the demo
    """Serves the echo graph over the store at ``url`` (or ``store``, already open) on ``port`` until SIGINT or
    SIGTERM, then closes the server, the runtime (its runs stop at their next step and release their claims) and
    the store.

    Raises:
        ValidationError: ``url`` is bad; nothing was opened.
        ProcessingError: the store cannot be opened.
        OSError: the port cannot be listened on (in use, not allowed).
    """
    import contextlib
    import signal

    from threadloom.persistence.opening import open_store
    from threadloom.persistence.urls import redact_url

    if store is None:
        store = open_store(url)
    try:
        runtime = GraphRuntime(store)
        server: SseServer | None = None
        try:
            server = await SseServer(runtime, {ECHO.graph_id: ECHO}).start(port=port)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):  # a loop without signal handlers: Ctrl-C interrupts
                    loop.add_signal_handler(sig, stop.set)
            print(f"listening on http://127.0.0.1:{server.port} (store {redact_url(url)})", flush=True)
            await stop.wait()
        finally:
            if server is not None:
                await server.close()
            runtime.close()
    finally:
        store.close()


def run(argv: list[str]) -> int:  # pragma: no cover - the command-line demo
    """The program: ``[STORE_URL [PORT]]`` (defaults :data:`DEFAULT_URL`, :data:`DEFAULT_PORT`; port 0: any free
    one). Returns the exit status: 0 once stopped by SIGINT or SIGTERM, 2 for a bad argument (a bad store URL
    included), 1 when the store cannot be opened or the port cannot be listened on; an error is one line on
    stderr."""
    from threadloom.persistence.opening import open_store
    from threadloom.persistence.urls import url_secrets

    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) > 2:
        print(f"sse_server: error: at most two arguments, got {len(argv)} ({USAGE})", file=sys.stderr)
        return 2
    url = argv[0] if argv else DEFAULT_URL
    port = _number(argv[1]) if len(argv) > 1 else DEFAULT_PORT
    if port is None or port > 65535:
        print(f"sse_server: error: PORT must be a number from 0 to 65535, got {argv[1]!r} ({USAGE})", file=sys.stderr)
        return 2

    def fail(message: str, status: int) -> int:
        for secret in url_secrets(url):
            message = message.replace(secret, "***")
        print(f"sse_server: error: {message}", file=sys.stderr)
        return status

    try:
        store = open_store(url)
    except ValidationError as error:
        return fail(f"bad store URL: {error}", 2)
    except ThreadloomError as error:
        return fail(f"cannot open the store: {error}", 1)
    except KeyboardInterrupt:
        return 130
    try:
        asyncio.run(main(url, port, store))
    except OSError as error:
        return fail(f"cannot listen on port {port}: {error.strerror or error}", 1)
    except KeyboardInterrupt:  # Ctrl-C before the server listened: nothing served yet
        return 130
    return 0


def quiet_logs() -> None:
    """Routes structlog's lines (threadloom's, every run logs some) to stderr, warnings and up: the library never
    configures logging, and unconfigured structlog prints every level to stdout (README "Configuration")."""
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


if __name__ == "__main__":  # pragma: no cover
    quiet_logs()
    sys.exit(run(sys.argv[1:]))
