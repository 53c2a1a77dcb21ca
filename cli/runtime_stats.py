"""``threadloom stats --runtime URL``: read a running worker's Prometheus metrics port and print its metrics.

A worker serves its metrics with ``threadloom serve --metrics-port N`` (or ``demo-worker --metrics-port``, or a
host's own ``PrometheusMeter.serve``). This reads the text exposition once, over HTTP, and prints every
``threadloom_*`` sample: counters (their ``_total``), gauges, and each histogram's ``_count`` and ``_sum``
(buckets and ``_created`` timestamps are left out, and so are counter and histogram samples that are still 0;
gauges are printed whatever their value). Nothing is written anywhere; the store is not opened.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from rich.text import Text

from threadloom.cli.output import CliError, cell, new_table, printable

READ_TIMEOUT_S = 5.0
"""How long, in seconds, reading the metrics port may take, the whole answer, before the command gives up."""
CONTENT_TYPES = ("text/plain", "application/openmetrics-text")
"""The content types of a metrics answer; an answer of another declared type (a web page) is refused."""
MAX_BYTES = 16 * 1024 * 1024
"""The largest exposition read (bytes); a longer answer is refused."""
PREFIX = "threadloom_"
"""Only the samples whose names start with this are printed."""


def metrics_url(target: str) -> str:
    """The URL to read for ``target``: ``HOST:PORT``, ``http://HOST:PORT`` (path ``/metrics`` added) or a whole
    ``http(s)://`` URL with its path.

    Raises:
        CliError: (exit 2) not a host and port, or not an http(s) URL.
    """
    text = target.strip()
    if "://" not in text:
        text = f"http://{text}"
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:  # an unclosed '[', a port that is not a number
        parts, port = urllib.parse.urlsplit(""), None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise CliError(
            f"--runtime must be HOST:PORT or an http URL of a metrics port, got {printable(target)!r}", 2,
            kind="ValidationError",
        )  # fmt: skip
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def read_samples(url: str) -> list[dict[str, Any]]:
    """The ``threadloom_*`` samples exposed at ``url``, sorted by name then labels; counter and histogram
    samples that are 0 are left out.

    Returns:
        ``[{"name", "kind", "labels", "value"}]``: ``kind`` is the family's type (``counter``, ``gauge``,
        ``histogram``); ``value`` a float (``+Inf``/``NaN`` written as strings).

    Raises:
        CliError: (exit 1) the port cannot be read, or does not answer with the Prometheus text format.
    """
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        needs = "stats --runtime needs the metrics extra (pip install 'threadloom[metrics]')"
        raise CliError(f"{needs}: {error}") from None
    deadline = time.monotonic() + READ_TIMEOUT_S
    chunks: list[bytes] = []
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as answer:  # noqa: S310 - http(s) only, checked
            kind = answer.headers.get_content_type() if answer.headers.get("content-type") else "text/plain"
            if kind not in CONTENT_TYPES:
                raise CliError(f"{url} did not answer with Prometheus metrics: its content type is {printable(kind)}")
            while size <= MAX_BYTES:  # a server that drips its answer is stopped by the deadline, not each read's
                chunk = answer.read1(64 * 1024)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise CliError(f"the metrics at {url} did not finish answering within {READ_TIMEOUT_S} s")
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise CliError(f"cannot read the metrics at {url}: {printable(str(reason))}") from None
    body = b"".join(chunks)
    if len(body) > MAX_BYTES:
        raise CliError(f"the metrics at {url} are longer than {MAX_BYTES} bytes; nothing printed")
    try:
        families = list(text_string_to_metric_families(body.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as error:
        raise CliError(f"{url} did not answer with Prometheus metrics: {printable(str(error))}") from None
    rows: list[dict[str, Any]] = []
    for family in families:
        if not family.name.startswith(PREFIX):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            if family.type != "gauge" and sample.value == 0:
                continue
            rows.append(
                {"name": sample.name, "kind": family.type, "labels": dict(sample.labels), "value": sample.value}
            )
    rows.sort(key=lambda row: (row["name"], sorted(row["labels"].items())))
    return rows


def _number(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def print_runtime_stats(state: Any, target: str) -> None:
    """Reads ``target``'s metrics and prints them (a table, or JSON with ``--json``)."""
    url = metrics_url(target)
    rows = read_samples(url)
    if state.json_output:
        state.emit(
            {
                "runtime": url,
                "metrics": [
                    {**row, "value": row["value"] if math.isfinite(row["value"]) else str(row["value"])}
                    for row in rows
                ],
            }
        )
        return
    table = new_table(f"metrics of {url}", "metric", "labels", "value")
    for row in rows:
        labels = " ".join(f"{key}={value}" for key, value in sorted(row["labels"].items()))
        table.add_row(cell(row["name"]), cell(labels), cell(_number(row["value"])))
    state.out.print(table)
    if not rows:
        state.out.print(Text(f"no {PREFIX}* metrics at {url}", style="dim"))


__all__ = ["metrics_url", "print_runtime_stats", "read_samples"]
