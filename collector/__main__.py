"""``python -m collector [-o spans.jsonl] -- python app.py ARGS``: the same as ``perfcast collect``."""

import sys

from collector._launcher import main

sys.exit(main())
