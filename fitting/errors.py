"""The one exception a user of `fitting/` can cause (bad table, unknown law, a fit that does not converge).

Its message says what to fix in one line; the CLI registers it as a user error and prints it without a traceback.
"""


class FitError(ValueError):
    """A fitting request that cannot be honoured as given; the message names the law, column or rows at fault."""
