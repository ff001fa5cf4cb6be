-- Runs once, on an empty data volume: MLflow gets its own database next to upscale's state store (both owned by
-- POSTGRES_USER), so their migration tables never meet.
CREATE DATABASE mlflow;
