"""Dense -> MoE construction methods, one module each, one registry."""
