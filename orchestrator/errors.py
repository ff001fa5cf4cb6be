"""The exception a user of the orchestrator can cause (unknown sweep, a sweep that cannot finish, a bad request).

Its message says what to fix in one line; the CLI registers it as a user error and the API maps it to a 4xx.
"""


class OrchestratorError(ValueError):
    """A request the orchestrator cannot honour as given; the message names the sweep or segment at fault."""
