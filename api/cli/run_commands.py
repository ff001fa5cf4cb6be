"""`upscale run|observations`: run a sweep to completion in-process on embedded Ray; export its observations."""

from api.cli.app import app  # noqa: F401
