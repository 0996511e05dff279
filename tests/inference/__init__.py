"""Tests of roll.inference (generation engines)."""
