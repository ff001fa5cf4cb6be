"""State store, scheduler loop on Ray, retries, resume, cancellation, checkpoint bookkeeping, MLflow run tree."""
