"""omnix.pipelines"""
