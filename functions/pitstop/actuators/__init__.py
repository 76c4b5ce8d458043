"""Adapters to the systems Pitstop acts on: one class per external system."""
