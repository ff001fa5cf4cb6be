"""`upscale demo`: the main job end to end on embedded defaults (what `make demo` runs)."""

from api.cli.app import app  # noqa: F401
