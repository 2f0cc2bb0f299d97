"""The command line, its views and reports."""

import time

# when the command began, before its imports: --time-limit bounds the whole command
STARTED = time.perf_counter()
