"""`upscale plan`: compile a sweep spec into its segment DAG and print tokens, FLOPs and the saving."""

from api.cli.app import app  # noqa: F401
