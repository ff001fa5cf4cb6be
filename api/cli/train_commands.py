"""`upscale train-segment`: one training segment alone, without orchestrator or Ray."""

from api.cli.app import app  # noqa: F401
