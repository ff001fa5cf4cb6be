"""The control plane: FastAPI app, auth, refit scheduler, and the `upscale` CLI."""
