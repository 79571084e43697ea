"""omnix.transport"""
