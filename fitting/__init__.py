"""Scaling laws as data, the Huber/BFGS fitter, comparison, bootstrap, D*, compute-optimal allocation, plots.

Pure numerics on tables: pandas in, dataclasses/JSON out. Imports nothing else of ours.
"""
