"""Contract suites: written once per interface, run by every backend's test module."""
