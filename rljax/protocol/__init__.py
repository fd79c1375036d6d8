"""Align, then accelerate: the sweep driver, its statistics (numpy only), the report and
its plots."""
