"""Executors. ``xla_cpu`` runs artifacts on XLA's CPU client (everywhere without Trainium)."""
