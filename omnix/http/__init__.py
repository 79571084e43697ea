"""omnix.http"""
