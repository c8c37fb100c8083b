"""The ``perfcast`` command: a thin click group over the library functions.

Each subcommand lives in its own module under ``perfcast/`` and is imported only when it runs, so that
``perfcast collect`` starts fast and does not load numpy, scipy or matplotlib into the user's app.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click

# subcommand -> (module, attribute, one-line help shown by `perfcast --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "collect": ("perfcast._collect", "collect", "Run an asyncio program with causal tracing; write spans."),
    "graph": ("perfcast._graph", "graph", "Build causal graphs (one per request kind and shape) from spans."),
    "whatif": ("perfcast._whatif", "whatif", "Predict latency distributions under what-if scenarios."),
    "profile": ("perfcast._profile", "profile", "Measure latency profiles of Redis / PostgreSQL / HTTP calls."),
    "plan": ("perfcast._profile", "plan", "Optimal profiling: how many measurements of each API call."),
    "compare": ("perfcast._whatif", "compare", "CDF deviation between predicted and measured samples."),
    "e2e": ("perfcast._whatif", "e2e", "End-to-end latency: cloud side + network + browser (HAR)."),
    "loadtest": ("perfcast._loadtest", "loadtest", "Closed-loop load test at several concurrency levels."),
    "mva": ("perfcast._mva", "mva", "Capacity planning with exact multi-server MVA and MVASD."),
    "agent": ("perfcast._replay", "agent", "Run the monitoring (and replay) agent on this host."),
    "demo": ("perfcast._demo", "demo", "Run the whole story on the bundled example app."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _, _) in COMMANDS.items() if importlib.util.find_spec(module)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        try:
            command = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            return None
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        # perfcast's own errors are the user's input problems: one line, no traceback (unless --debug).
        from analyzer.errors import AnalyzerError

        try:
            return super().invoke(ctx)
        except AnalyzerError as exc:
            if "--debug" in sys.argv[1:2] or (ctx.obj or {}).get("debug"):
                raise
            click.echo(f"{type(exc).__name__}: {exc}", err=True)
            ctx.exit(1)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="perfcast")
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """perfcast: what-if latency prediction and capacity planning for asyncio web services."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


if __name__ == "__main__":  # pragma: no cover
    main()
