"""The sweep language: spec models, validation, the planner that compiles a grid into segments, costs.

Pure: no I/O beyond reading a spec file, no Ray, no torch.
"""
