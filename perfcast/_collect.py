"""``perfcast collect``: run an asyncio program with causal tracing and write its spans."""

from __future__ import annotations

import click

from collector import CollectorError
from collector._launcher import child_environment, run


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option(
    "-o",
    "--output",
    default="spans.jsonl",
    show_default=True,
    help="OTLP JSON-lines file to write; spans are appended when it exists, as the OpenTelemetry Collector's file exporter does.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(min=1),
    default=None,
    help="Export queue capacity, in spans.",
)
@click.option(
    "--resource-names", default=None, help="name=url,... names for I/O resources."
)
@click.option("--service-name", default=None, help="service.name of the spans.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def collect(
    output: str,
    max_queue: int | None,
    resource_names: str | None,
    service_name: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (after --) with causal tracing installed; exit with its exit code.

    Example: perfcast collect -o spans.jsonl -- python -m examples.forum
    """
    env = child_environment(
        output,
        max_queue=max_queue,
        resource_names=resource_names,
        service_name=service_name,
    )
    try:
        code = run(command, env)
    except CollectorError as exc:
        raise click.ClickException(str(exc)) from None
    raise SystemExit(code)
