"""`upscale model init|upcycle`: dense checkpoints and every upcycling method from the command line."""

from api.cli.app import app  # noqa: F401
