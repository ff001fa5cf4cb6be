"""Where upscale keeps its state: one pydantic-settings object, read once from the environment (docs/architecture.md,
"State and storage").

Every path defaults under `UPSCALE_HOME` (default `./.upscale`), so deleting that folder starts over; that includes
MLflow's artifacts (`<home>/mlartifacts`) unless a tracking server keeps them. The API and
the CLI share this object; tests build their own `Settings(home=tmp_path)` instead of touching the environment.
Limits on what one API request may ask for (`max_segments`, `max_body_bytes`), per-token quotas (`max_sweeps_in_flight`,
`max_fits_per_minute`, `max_analyses_per_minute`), the connections a server holds (`connection_limit`,
`header_timeout_s`, `body_timeout_s`, `keep_alive_s`, `backlog`: api/connections.py), the threads heavy requests run
on (`heavy_workers`, `heavy_queue`, `heavy_wait_s`: api/heavy.py), the answers GET /sweeps/{id} keeps built
(`detail_cache_bytes`) and the folders a submitted spec may read data from
(`data_roots`) live here too, so every server sharing a store can be configured alike.
The checkpoint root may be an fsspec URI (`s3://bucket/upscale`); one whose protocol cannot be opened here (unknown,
or its package, e.g. s3fs, not installed) is refused when the settings are read.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from upscale import storage
from upscale.home import DEFAULT_HOME


class Settings(BaseSettings):
    """Database, checkpoint store, MLflow tracking and Ray address; unset paths derive from `home`."""

    model_config = SettingsConfigDict(env_prefix="UPSCALE_", frozen=True, extra="ignore", populate_by_name=True)

    home: Path = Field(DEFAULT_HOME, description="UPSCALE_HOME: root of generated state.")
    db_url: str = Field("", description="UPSCALE_DB_URL: the state store; default sqlite:///<home>/upscale.db.")
    checkpoint_dir: str = Field("", description="UPSCALE_CHECKPOINT_DIR: checkpoint root, a path (a shared filesystem "
                                                "on a cluster) or an fsspec URI such as s3://bucket/upscale; default "
                                                "<home>/checkpoints.")
    mlflow_tracking_uri: str = Field("", validation_alias="MLFLOW_TRACKING_URI",
                                     description="MLflow tracking URI; default sqlite:///<home>/mlflow.db.")
    mlflow_artifact_root: str = Field("", description="UPSCALE_MLFLOW_ARTIFACT_ROOT: where a new MLflow experiment "
                                                      "keeps its runs' artifacts; default <home>/mlartifacts, or, "
                                                      "for an http(s) tracking server, the server's own.")
    ray_address: str | None = Field(None, validation_alias="RAY_ADDRESS",
                                    description="An existing Ray cluster; unset = embedded local Ray.")
    analysis_policy: Literal["on_new_observations", "off"] = Field(
        "on_new_observations", description="UPSCALE_ANALYSIS_POLICY: when `upscale serve`/`upscale scheduler` run "
        "the analysis by themselves: on_new_observations (a sweep settles with observations its latest analysis "
        "did not have) or off (only POST /sweeps/{id}/analysis, `upscale analyze` and refits run it).")

    max_segments: int = Field(20000, ge=1, description="UPSCALE_MAX_SEGMENTS: the most segments a sweep submitted "
                              "over the API, or planned by `upscale plan`, may plan; a larger grid is refused (422, or "
                              "one error line) before it is planned.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="UPSCALE_MAX_BODY_BYTES: the largest request body the "
                                "API reads; a larger one is refused with 413 before it is read whole.")
    connection_limit: int = Field(1024, ge=2, description="UPSCALE_CONNECTION_LIMIT: the most connections `upscale "
                                  "serve` holds open; one more is closed at once, and a request arriving while that "
                                  "many are open is answered 503 (uvicorn's limit_concurrency).")
    header_timeout_s: float = Field(10.0, gt=0, description="UPSCALE_HEADER_TIMEOUT_S: seconds a connection has to "
                                    "send a request's headers (from its opening, or its previous response) before "
                                    "it is closed: a half-sent request holds no socket for ever.")
    body_timeout_s: float = Field(30.0, gt=0, description="UPSCALE_BODY_TIMEOUT_S: seconds a request has to send its "
                                  "whole body once its headers arrived; a slower one is answered 408 and closed.")
    keep_alive_s: int = Field(5, ge=1, description="UPSCALE_KEEP_ALIVE_S: seconds an idle kept-alive connection stays "
                              "open (uvicorn's timeout_keep_alive).")
    backlog: int = Field(2048, ge=1, description="UPSCALE_BACKLOG: connections the kernel queues before `upscale "
                         "serve` accepts them (capped by the kernel's somaxconn).")
    heavy_workers: int = Field(2, ge=1, description="UPSCALE_HEAVY_WORKERS: threads computing heavy requests (fits, "
                               "refit runs, suggestions, planning a submitted sweep) at once, apart from the threads "
                               "that answer every other request.")
    heavy_queue: int = Field(8, ge=0, description="UPSCALE_HEAVY_QUEUE: heavy requests waiting for one of those "
                             "threads; one more is refused with 429 and a Retry-After.")
    heavy_wait_s: float = Field(60.0, gt=0, description="UPSCALE_HEAVY_WAIT_S: seconds a heavy request may wait for "
                                "a thread; one that waited longer is refused with 429 without being computed.")
    detail_cache_bytes: int = Field(64 << 20, ge=0, description="UPSCALE_DETAIL_CACHE_BYTES: the most bytes of "
                                    "GET /sweeps/{id} answers a server keeps built; the least recently read go "
                                    "first.")
    max_sweeps_in_flight: int = Field(100, ge=1, description="UPSCALE_MAX_SWEEPS_IN_FLIGHT: sweeps one token name "
                                      "may have pending or running; a submission past it is refused with 429.")
    max_fits_per_minute: int = Field(60, ge=1, description="UPSCALE_MAX_FITS_PER_MINUTE: POST /fits one token name "
                                     "may make in any minute, per server; 429 past it.")
    max_analyses_per_minute: int = Field(30, ge=1, description="UPSCALE_MAX_ANALYSES_PER_MINUTE: POST "
                                         "/sweeps/{id}/analysis one token name may make in any minute, per server; "
                                         "429 past it.")
    data_roots: str = Field("", description="UPSCALE_DATA_ROOTS: colon-separated folders a spec submitted over the "
                            "API may name in data.corpus (besides builtin: corpora); default <home>/data.")

    @model_validator(mode="after")
    def _defaults(self) -> Settings:
        home = self.home.absolute()
        object.__setattr__(self, "home", home)
        if not self.db_url:
            object.__setattr__(self, "db_url", f"sqlite:///{home / 'upscale.db'}")
        if not self.checkpoint_dir:
            object.__setattr__(self, "checkpoint_dir", str(home / "checkpoints"))
        try:
            storage.check(self.checkpoint_dir)  # a URI nothing here can open: say what to install or fix, now
        except ValueError as e:
            raise ValueError(f"UPSCALE_CHECKPOINT_DIR: {e}") from None
        if not self.mlflow_tracking_uri:
            object.__setattr__(self, "mlflow_tracking_uri", f"sqlite:///{home / 'mlflow.db'}")
        if not self.mlflow_artifact_root and not self.mlflow_tracking_uri.startswith(("http://", "https://")):
            object.__setattr__(self, "mlflow_artifact_root", (home / "mlartifacts").as_uri())
        if not self.data_roots:
            object.__setattr__(self, "data_roots", str(home / "data"))
        if not self.ray_address:
            object.__setattr__(self, "ray_address", None)
        return self

    @property
    def data_root_paths(self) -> tuple[Path, ...]:
        """`data_roots` as absolute paths, in the order configured."""
        return tuple(Path(p).expanduser().absolute() for p in self.data_roots.split(":") if p)

    @property
    def data_cache_dir(self) -> Path:
        """Where tokenised corpora are cached: apart from the data roots, so users' files and the cache never mix."""
        return self.home / "cache" / "data"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()
