"""The command line, its views and reports."""

import time

# when the command began, before its imports: --time-limit bounds the whole command
STARTED = time.perf_counter()


class Interruption:
    """Whether this process has printed its one `interrupted:` line (a command's own
    Ctrl-C handling does; the console script prints one for a Ctrl-C that came before
    or after a command's handling, which typer would end in a silent exit 130)."""

    reported = False
