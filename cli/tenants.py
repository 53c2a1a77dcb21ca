"""``threadloom tenants``: the registry's tenants and how many root threads each holds.

It reads only (no claim, nothing written), through ``Checkpointer.tenants``: one index-backed page per call.
:func:`other_tenants` is what ``threads`` without ``--tenant`` says about the threads it does not list.
"""

from __future__ import annotations

import shlex
from typing import Any

import attrs
import click
from rich.text import Text

from threadloom.cli.output import cell, new_table, state_of
from threadloom.domain.values import TenantCount, TenantPage
from threadloom.persistence.base import Checkpointer

NO_TENANT = "(no tenant)"
"""How the tables name the threads that have no tenant (``--json`` writes ``null``)."""

OTHER_TENANT_PAGES = 10
"""``threads`` without ``--tenant`` counts the other tenants' threads in at most this many pages of 1000 tenants."""


def tenant_json(row: TenantCount) -> dict[str, Any]:
    """``{"tenant_id": str | None, "threads": int}``."""
    return {"tenant_id": row.tenant_id, "threads": row.threads}


@attrs.frozen(kw_only=True)
class OtherTenants:
    """What the threads of the tenants other than the tenant-less come to.

    Attributes:
        tenants: how many tenants hold root threads.
        threads: how many root threads they hold together.
        complete: False when there were more tenants than :data:`OTHER_TENANT_PAGES` pages: the counts are
            then a lower bound.
    """

    tenants: int
    threads: int
    complete: bool

    def to_json(self) -> dict[str, Any]:
        """``{"tenants", "threads", "complete", "hint"}``."""
        return {"tenants": self.tenants, "threads": self.threads, "complete": self.complete, "hint": self.hint}

    @property
    def hint(self) -> str:
        """One line for a person: how many, and how to list them."""
        more = "" if self.complete else "at least "
        return (
            f"{more}{self.threads} more root thread(s) belong to {more}{self.tenants} tenant(s): "
            "list them with --tenant T, or list the tenants with 'threadloom tenants'"
        )


def other_tenants(store: Checkpointer) -> OtherTenants:
    """Counts the root threads that have a tenant, over at most :data:`OTHER_TENANT_PAGES` pages of tenants."""
    tenants = threads = 0
    after: str | None = None
    for _ in range(OTHER_TENANT_PAGES):
        page = store.tenants(limit=TenantPage.MAX_LIMIT, after=after)
        for row in page.items:
            if row.tenant_id is not None:
                tenants += 1
                threads += row.threads
        after = page.next
        if after is None:
            return OtherTenants(tenants=tenants, threads=threads, complete=True)
    return OtherTenants(tenants=tenants, threads=threads, complete=False)


@click.command()
@click.option(
    "--limit",
    type=click.IntRange(1, TenantPage.MAX_LIMIT),
    default=100,
    show_default=True,
    help="Tenants per page.",
)
@click.option("--after", default=None, metavar="TENANT", help="List the tenants after this one (a page's cursor).")
@click.pass_context
def tenants(ctx: click.Context, limit: int, after: str | None) -> None:
    """List the tenants with how many root threads each holds.

    Root threads are those 'threads --tenant T' lists (children are not counted), of every status. Tenants
    come in id order, and the threads with no tenant last, as '(no tenant)'. When more follow, the --after of
    the next page is printed.
    """
    state = state_of(ctx)
    store = state.store(read_only=True)
    page = store.tenants(limit=limit, after=after)
    if state.json_output:
        state.emit({"tenants": [tenant_json(row) for row in page.items], "next": page.next})
        return
    table = new_table("tenants (root threads)", "tenant", "root threads")
    for row in page.items:
        name = cell(row.tenant_id) if row.tenant_id is not None else cell(NO_TENANT, "dim")
        table.add_row(name, cell(str(row.threads)))
    state.out.print(table)
    total = sum(row.threads for row in page.items)
    line = f"{len(page.items)} tenant(s), {total} root thread(s)"
    if page.next is not None:
        line += f" — more follow: --after {shlex.quote(page.next)}"
    state.out.print(Text(line, style="dim"))
    if page.items:
        state.out.print(Text("List a tenant's threads with: threadloom threads --tenant T", style="dim"))


__all__ = ["NO_TENANT", "OTHER_TENANT_PAGES", "OtherTenants", "other_tenants", "tenant_json", "tenants"]
