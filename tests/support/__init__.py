"""Helpers for tests that run against real parts: /dev/kmsg, systemd-journald, journal files."""
