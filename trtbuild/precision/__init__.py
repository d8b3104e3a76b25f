"""Precision: rules and patterns, assignment, cast insertion."""
