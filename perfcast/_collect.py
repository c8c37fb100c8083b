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
@click.option(
    "--sample",
    type=click.FloatRange(min=0.0, max=1.0, min_open=True),
    default=None,
    help="Record requests only in random windows covering this share of the time (e.g. 0.01 in production; "
    "outside the windows the app runs at nearly its plain cost). Default 1: every request.",
)
@click.option(
    "--sample-window",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Length of a sampling window, seconds (default 0.5).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def collect(
    output: str,
    max_queue: int | None,
    resource_names: str | None,
    service_name: str | None,
    sample: float | None,
    sample_window: float | None,
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
        sample=sample,
        sample_window_s=sample_window,
    )
    try:
        code = run(command, env)
    except CollectorError as exc:
        raise click.ClickException(str(exc)) from None
    raise SystemExit(code)
