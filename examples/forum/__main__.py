"""``python -m examples.forum [--port 0] [--redis URL] [--postgres URL] ...``: run the forum app.

Prints ``listening on http://HOST:PORT`` once it serves; SIGINT or SIGTERM stop it cleanly.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from examples.forum._serve import serve_until_signalled
from examples.forum.app import build_app
from examples.forum.config import parse_config


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the arguments and serve until signalled."""
    config = parse_config(argv)
    try:
        asyncio.run(serve_until_signalled(build_app(config), config.host, config.port, config.reuse_port))
    except OSError as exc:  # a busy port, an unreachable database: one line, not a traceback
        sys.exit(f"forum: {exc}")


if __name__ == "__main__":
    main()
