"""omnix.models"""
