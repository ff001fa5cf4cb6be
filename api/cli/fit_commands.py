"""`upscale laws|fit|compare|dstar|decide|optimal`: the fitting library from the command line."""

from api.cli.app import app  # noqa: F401
