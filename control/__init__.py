"""The control layer: what the two faces (the REST API and the `upscale` CLI, api/) and the background loops share.
Sweep submission, extension and ownership; analyses, decisions and fits; refit schedules and their loop; suggested
extensions; the sweep loop; the prediction ledger (hooked into the orchestrator, never imported by it); the tables
they own and the request and result models they take and return. No FastAPI, typer or HTTP status codes here."""
