"""``python -m pybubble.testing.mllm``: the test trainer's command (:func:`~pybubble.testing.mllm.launch.main`)."""

import sys

from .launch import main

if __name__ == "__main__":
    sys.exit(main())
