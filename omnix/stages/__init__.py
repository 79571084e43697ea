"""omnix.stages"""
