"""The field closes the loop: reports on what deployed policies saw and did (field logs, runtimes.telemetry)."""
