"""omnix.bench"""
