"""omnix.orchestrator"""
