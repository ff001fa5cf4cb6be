"""Deployment: manifests, PostgreSQL, an MLflow tracking server and a multi-node Ray cluster."""
