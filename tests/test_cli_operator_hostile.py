"""Operator commands against hostile targets and options: ``stats --runtime`` pointed at what is not a metrics
endpoint (a web page, a URL that does not parse, a server that drips its answer), ``serve`` with an empty
``--metrics-host`` (which would listen on every interface)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from threadloom.cli.main import cli
from threadloom.domain.errors import ValidationError

pytestmark = pytest.mark.usefixtures("restore_cli_logging")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/drip":
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.end_headers()
            for _ in range(100):  # a byte every 0.1 s: each read is quick, the whole answer never ends
                try:
                    self.wfile.write(b"#")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)
            return
        body = b"" if self.path == "/empty.html" else b"<!doctype html><title>hello</title>"
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _stats(tmp_path: Path, target: str):
    return CliRunner().invoke(cli, ["--store", f"sqlite:///{tmp_path / 'never.db'}", "stats", "--runtime", target])


@pytest.mark.parametrize("path", ["/empty.html", "/page.html"])
def test_stats_runtime_refuses_a_web_page_even_one_that_parses_as_no_metrics(tmp_path, web, path):
    result = _stats(tmp_path, f"http://127.0.0.1:{web}{path}")
    assert result.exit_code == 1, result.output
    assert "did not answer with Prometheus metrics" in result.output
    assert "text/html" in result.output


@pytest.mark.parametrize("target", ["http://[::1", "http://[::1]:x/metrics", "[::1:80"])
def test_stats_runtime_refuses_a_url_that_does_not_parse_as_a_usage_error(tmp_path, target):
    result = _stats(tmp_path, target)
    assert result.exit_code == 2, result.output
    assert "--runtime must be HOST:PORT" in result.output
    assert "unexpected" not in result.output
    assert not list(tmp_path.iterdir())


def test_stats_runtime_gives_up_on_an_answer_that_never_ends(tmp_path, web, monkeypatch):
    import threadloom.cli.runtime_stats as runtime_stats

    monkeypatch.setattr(runtime_stats, "READ_TIMEOUT_S", 0.5)
    result = _stats(tmp_path, f"http://127.0.0.1:{web}/drip")
    assert result.exit_code == 1, result.output
    assert "did not finish answering within 0.5 s" in result.output


def test_serve_refuses_an_empty_metrics_host_which_would_listen_everywhere(tmp_path, monkeypatch):
    from threadloom import SqliteCheckpointer

    SqliteCheckpointer.open(str(tmp_path / "s.db")).close()
    (tmp_path / "onegraph.py").write_text(
        "from threadloom import Graph, Step\n"
        "graph = Graph('g', {'n': lambda state, ctx: Step.end(state)}, entry='n')\n"
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli,
        ["--store", f"sqlite:///{tmp_path / 's.db'}", "serve", "--graph", "onegraph:graph", "--metrics-port", "0",
         "--metrics-host", ""],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "metrics_host" in result.output or "host" in result.output


@pytest.mark.parametrize(
    ("host", "says"),
    [("no such host!", "is not a host name or IPv4 address this machine can resolve"),
     ("192.0.2.1", "is not an address of this machine"), ("", "must name an address"),
     ("224.0.0.1", "is a multicast address"), ("255.255.255.255", "is the broadcast address")],
)  # fmt: skip
def test_serve_refuses_a_bad_metrics_host_naming_the_option_before_the_store_is_opened(tmp_path, monkeypatch, host, says):
    """Found by an operator: ``--metrics-host 'no such host!'`` said the metrics port was not available and to
    choose another --metrics-port, after the worker had created its store."""
    (tmp_path / "onegraph.py").write_text(
        "from threadloom import Graph, Step\n"
        "graph = Graph('g', {'n': lambda state, ctx: Step.end(state)}, entry='n')\n"
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli,
        ["--store", f"sqlite:///{tmp_path / 'new.db'}", "serve", "--graph", "onegraph:graph", "--metrics-port", "0",
         "--metrics-host", host],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"--metrics-host {host!r}" in lines[0] and says in lines[0], result.output
    assert "choose another --metrics-port" not in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "new.db").exists()  # refused before the store was created


def test_serve_refuses_a_metrics_host_without_a_metrics_port(tmp_path, monkeypatch):
    """Found by hostile testing: ``--metrics-host 8.8.8.8`` alone was ignored without a word."""
    (tmp_path / "onegraph.py").write_text(
        "from threadloom import Graph, Step\n"
        "graph = Graph('g', {'n': lambda state, ctx: Step.end(state)}, entry='n')\n"
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli, ["--store", f"sqlite:///{tmp_path / 'new.db'}", "serve", "--graph", "onegraph:graph", "--metrics-host",
              "0.0.0.0"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--metrics-host needs --metrics-port" in result.output
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize("host", ["", " ", 7, None])
def test_a_meter_refuses_to_serve_on_an_unnamed_host(host):
    prometheus_client = pytest.importorskip("prometheus_client")
    from threadloom.persistence.metrics.prometheus import PrometheusMeter

    meter = PrometheusMeter(prometheus_client.CollectorRegistry())
    with pytest.raises(ValidationError) as caught:
        meter.serve(0, host=host)
    assert caught.value.field == "host"
