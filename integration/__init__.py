"""Tests and tools that run real processes: Spark restarts, kills, moto servers, a browser."""
