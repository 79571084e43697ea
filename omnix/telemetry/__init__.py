"""omnix.telemetry"""
