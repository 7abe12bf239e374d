"""Restore and revert: plan, prepare, record the safety checkpoint, apply, and recover after a crash."""
