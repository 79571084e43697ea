"""omnix.engines"""
