"""Backends: one protocol (base.Backend), registered by the `inferplug.backends` entry points."""
