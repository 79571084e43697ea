"""omnix.replay"""
