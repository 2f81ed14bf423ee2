"""``python -m pybubble``: the command line (:mod:`pybubble.cli`)."""

from .cli import main

raise SystemExit(main())
