"""The delay relay (``tandem.bench.delay_relay``) run as a script inside the drafter's network namespace:

    python netns_relay.py --listen 198.18.0.1 --port-file F --to 198.18.0.1:PORT --delay-file D

The delay (milliseconds, a number in the file D) is re-read every 50 ms. It runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tandem.bench.delay_relay import main  # noqa: E402

if __name__ == "__main__":
    main()
